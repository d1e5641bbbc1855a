// Small CuTe building blocks of the sm80 backward kernel: shared-memory-operand GEMM with ldmatrix
// double-buffering over k, predicated global -> shared tile loads, and the (row, col) view of an MMA accumulator.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

namespace cuteattn::detail::sm80_bwd {

using namespace cute;
using cute::make_tensor;  // not cuteattn::make_tensor and cuteattn::Tensor of the public API
using cute::Tensor;

// Views an SM80 16x8 accumulator layout ((2 cols, 2 rows), MMA_M, MMA_N) as ((2, MMA_M), (2, MMA_N)) = (row, col).
template <class Layout>
__device__ __forceinline__ auto rowcol(Layout const& acc_layout) {
  static_assert(decltype(rank<0>(acc_layout))::value == 2, "expects an SM80 16x8 accumulator");
  return make_layout(make_layout(get<0, 1>(acc_layout), get<1>(acc_layout)),
                     make_layout(get<0, 0>(acc_layout), get<2>(acc_layout)));
}

// acc += A * B^T with both operands in shared memory, read through ldmatrix one k-slice ahead of the MMA.
template <class TiledMma, class TensorAcc, class TensorRA, class TensorRB, class TensorSA, class TensorSB,
          class CopyA, class CopyB, class ThrCopyA, class ThrCopyB>
__device__ __forceinline__ void gemm_ss(TiledMma& tiled_mma, TensorAcc& acc, TensorRA& tCrA, TensorRB& tCrB,
                                        TensorSA const& tCsA, TensorSB const& tCsB, CopyA const& copy_a,
                                        CopyB const& copy_b, ThrCopyA const& thr_copy_a,
                                        ThrCopyB const& thr_copy_b) {
  Tensor tCrA_view = thr_copy_a.retile_D(tCrA);  // (CPY, CPY_M, CPY_K)
  Tensor tCrB_view = thr_copy_b.retile_D(tCrB);  // (CPY, CPY_N, CPY_K)
  copy(copy_a, tCsA(_, _, _0{}), tCrA_view(_, _, _0{}));
  copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k < size<2>(tCrA) - 1) {
      copy(copy_a, tCsA(_, _, k + 1), tCrA_view(_, _, k + 1));
      copy(copy_b, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
    }
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// Global -> shared tile load with cp.async of a kRows x kCols tile; rows >= max_row and columns >= max_col are
// zero-filled in shared memory (never read from global). max_col is a multiple of the 8-element vector.
// A tile wholly in bounds takes the unpredicated copy.
template <int kRows, int kCols, class TiledCopy, class TensorG, class TensorS, class TensorC>
__device__ __forceinline__ void copy_tile_pred(TiledCopy const& tiled_copy, TensorG const& tXgX, TensorS& tXsX,
                                               TensorC const& tXcX, int max_row, int max_col) {
  if (max_row >= kRows && max_col >= kCols) {
    copy(tiled_copy, tXgX, tXsX);
    return;
  }
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tXgX); ++m) {
    const bool row_ok = get<0>(tXcX(0, m, 0)) < max_row;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tXgX); ++k) {
      if (row_ok && get<1>(tXcX(0, m, k)) < max_col) {
        copy(tiled_copy, tXgX(_, m, k), tXsX(_, m, k));
      } else {
        clear(tXsX(_, m, k));
      }
    }
  }
}

// One fp32 global -> shared copy with cp.async; zero-filled (src not read) when !pred.
__device__ __forceinline__ void cp_async_f32(const float* src, float* dst, bool pred) {
  SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint32_t>::copy(*reinterpret_cast<const uint32_t*>(src),
                                                  *reinterpret_cast<uint32_t*>(dst), pred);
}

// Conversion of a whole register fragment (fp32 accumulators to the input dtype), two elements per instruction.
template <class To, class TensorIn>
__device__ __forceinline__ auto convert_fragment(TensorIn const& in) {
  using From = typename TensorIn::value_type;
  constexpr int kNumel = decltype(size(in))::value;
  cutlass::NumericArrayConverter<To, From, kNumel> convert;
  Tensor out = make_tensor<To>(in.layout());  // shape of `in`
  *reinterpret_cast<cutlass::Array<To, kNumel>*>(out.data()) =
      convert(*reinterpret_cast<const cutlass::Array<From, kNumel>*>(in.data()));
  return out;
}

}  // namespace cuteattn::detail::sm80_bwd
