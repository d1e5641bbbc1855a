// Small CuTe building blocks of the sm80 backward kernel: shared-memory-operand GEMM with ldmatrix
// double-buffering over k, predicated global -> shared tile loads, the (row, col) view of an MMA accumulator, the
// fp32 reductions into global memory, the thread-ordered layout of the dQ workspace (DqTiles), and the (optionally
// opaque) thread index addresses come from.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "core/host_device.h"
#include "core/params.h"
#include "sm80/utils_sm80.cuh"

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

// threadIdx.x, with kOpaque through an empty volatile asm: the compiler cannot see that two calls return the same
// value, so the shared and global addresses derived from it are computed where they are used instead of being
// hoisted out of the query-block loop and kept in registers across it (next to the dK/dV accumulators).
template <bool kOpaque>
__device__ __forceinline__ int thread_index() {
  int t = int(threadIdx.x);
  if constexpr (kOpaque) asm volatile("" : "+r"(t));
  return t;
}

struct NoHook {
  __device__ __forceinline__ void operator()(int) const {}
};

// acc += A * B^T with both operands in shared memory (sA: (M, K), sB: (N, K)), read through ldmatrix one k-slice
// ahead of the MMA, partitioned for thread tid (from thread_index). hook(k) runs once slice k is in registers,
// before slice k + 1 is loaded and slice k multiplied (tf32: before slice k is loaded): work placed there overlaps
// the MMAs instead of delaying the first ldmatrix.
template <class TiledMma, class TensorAcc, class TensorRA, class TensorRB, class TensorSA, class TensorSB,
          class CopyA, class CopyB, class Hook = NoHook>
__device__ __forceinline__ void gemm_ss(TiledMma& tiled_mma, TensorAcc& acc, TensorRA& tCrA, TensorRB& tCrB,
                                        TensorSA const& sA, TensorSB const& sB, CopyA const& copy_a,
                                        CopyB const& copy_b, int tid, Hook const& hook = Hook{}) {
  auto thr_copy_a = copy_a.get_thread_slice(tid);
  auto thr_copy_b = copy_b.get_thread_slice(tid);
  Tensor tCsA = thr_copy_a.partition_S(sA);       // (CPY, CPY_M, CPY_K)
  Tensor tCsB = thr_copy_b.partition_S(sB);       // (CPY, CPY_N, CPY_K)
  Tensor tCrA_view = thr_copy_a.retile_D(tCrA);   // (CPY, CPY_M, CPY_K)
  Tensor tCrB_view = thr_copy_b.retile_D(tCrB);   // (CPY, CPY_N, CPY_K)
  if constexpr (std::is_same_v<typename TensorRB::value_type, cutlass::tfloat32_t>) {
    // tf32: a k8 slice of B over the whole N extent (d at d = 256) is as many registers as a k16 slice of the
    // 16-bit kernels, and two of them next to the fp32 dK/dV accumulators spill; so B is loaded and consumed
    // one copy tile (kPer n8 MMA columns: CPY_N index n holds MMA_N kPer n ... kPer n + kPer - 1) at a time.
    constexpr int kPer = decltype(size<1>(tCrB))::value / decltype(size<1>(tCrB_view))::value;
    static_assert(kPer * decltype(size<1>(tCrB_view))::value == decltype(size<1>(tCrB))::value);
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tCrA); ++k) {
      hook(k);
      copy(copy_a, tCsA(_, _, k), tCrA_view(_, _, k));
      CUTE_UNROLL
      for (int n = 0; n < size<1>(tCrB_view); ++n) {
        copy(copy_b, tCsB(_, n, k), tCrB_view(_, n, k));
        CUTE_UNROLL
        for (int j = kPer * n; j < kPer * n + kPer; ++j) {
          CUTE_UNROLL
          for (int m = 0; m < size<1>(tCrA); ++m) cute::gemm(tiled_mma, tCrA(_, m, k), tCrB(_, j, k), acc(_, m, j));
        }
      }
    }
  } else {
    copy(copy_a, tCsA(_, _, _0{}), tCrA_view(_, _, _0{}));
    copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tCrA); ++k) {
      hook(k);
      if (k < size<2>(tCrA) - 1) {
        copy(copy_a, tCsA(_, _, k + 1), tCrA_view(_, _, k + 1));
        copy(copy_b, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
      }
      cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
    }
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

// One 4-byte global -> shared copy with cp.async (an fp32, or a pair of 16-bit elements); zero-filled (src not
// read) when !pred.
__device__ __forceinline__ void cp_async_4b(const void* src, void* dst, bool pred) {
  SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint32_t>::copy(*reinterpret_cast<const uint32_t*>(src),
                                                  *reinterpret_cast<uint32_t*>(dst), pred);
}

// dst[0] += a and dst[1] += b in global memory, fire-and-forget: one vector reduction on sm90 (dst 8-byte
// aligned), two scalar ones before. Spelled in PTX: atomicAdd on a pointer whose origin the compiler cannot see
// (the kernels hide their row pointers) becomes a generic-address ATOM with a shared-memory fallback loop.
__device__ __forceinline__ void red_add_f32x2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(dst), "f"(a) : "memory");
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(dst + 1), "f"(b) : "memory");
#endif
}

// dst[0..3] += (a, b, c, d) in global memory, fire-and-forget: one vector reduction on sm90 (dst 16-byte aligned),
// four scalar ones before (PTX for the reason given at red_add_f32x2).
__device__ __forceinline__ void red_add_f32x4(float* dst, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
#else
  red_add_f32x2(dst, a, b);
  red_add_f32x2(dst + 2, c, d);
#endif
}

// Floats one dQ reduction adds: a red.v4 on sm90 (16-byte aligned), a scalar red before. Device code only: the
// dQ workspace's element order (DqTiles) depends on it, so the main kernel and convert_dq_tiles_kernel, compiled
// for the same arch, agree on it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kDqRedVec = 4;
#else
constexpr int kDqRedVec = 1;
#endif

// dst[i] += frag(first + i) for i < kDqRedVec, fire-and-forget (PTX for the reason given at red_add_f32x2). The
// fragment goes by reference and index, not by element pointer: a pointer into it moves it to local memory.
template <class Fragment>
__device__ __forceinline__ void red_add_dq(float* dst, Fragment const& frag, int first) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  red_add_f32x4(dst, frag(first), frag(first + 1), frag(first + 2), frag(first + 3));
#else
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(dst), "f"(frag(first)) : "memory");
#endif
}

// The fp32 dQ workspace of the sm80 backward (one copy per split in deterministic mode), in the order the dQ
// MMA's threads own it, so that one warp's reduction covers whole 128-byte lines: one kBlockM x kHeadDim tile per
// (query block, head), tile index (block, head) row-major. The query blocks of batch entry b are numbered from
// row0 / kBlockM + b (row0: its first global row), so every sequence starts a fresh block: (total_q / kBlockM +
// batch) blocks in all. Inside a tile, column chunk c's element e of thread t's dQ fragment lies at
// c * kChunkElems + (e / kDqRedVec) * kNThreads * kDqRedVec + t * kDqRedVec + e % kDqRedVec. Rows past the
// sequence and columns past d land in tile elements that are never read.
template <class Traits>
struct DqTiles {
  static constexpr int kTileElems = Traits::kBlockM * Traits::kHeadDim;
  static constexpr int kChunkElems = kTileElems / Traits::kDqChunks;
  static constexpr int kPerThread = kChunkElems / Traits::kNThreads;  // fragment elements per chunk and thread

  // Elements of one split's workspace.
  static int64_t split_elems(const Params& p) { return (p.total_q / Traits::kBlockM + p.batch) * p.heads * kTileElems; }
  // Tile index of query block 0 of batch entry bi, head 0 (row0: the entry's first global row).
  CUTEATTN_HD static int64_t first_tile(const Params& p, int64_t bi, int64_t row0) {
    return (row0 / Traits::kBlockM + bi) * p.heads;
  }
};

// Conversion of a whole register fragment (fp32 accumulators to the MMA input type), two elements per
// instruction; to tf32 with cvt.rna, the rounding the fp32 inputs get.
template <class To, class TensorIn>
__device__ __forceinline__ auto convert_fragment(TensorIn const& in) {
  using From = typename TensorIn::value_type;
  constexpr int kNumel = decltype(size(in))::value;
  Tensor out = make_tensor<To>(in.layout());  // shape of `in`
  if constexpr (std::is_same_v<To, cutlass::tfloat32_t>) {
    CUTE_UNROLL
    for (int i = 0; i < kNumel; ++i) {
      out(i) = cutlass::tfloat32_t::bitcast(__float_as_uint(::cuteattn::sm80::round_to_tf32(float(in(i)))));
    }
  } else {
    cutlass::NumericArrayConverter<To, From, kNumel> convert;
    *reinterpret_cast<cutlass::Array<To, kNumel>*>(out.data()) =
        convert(*reinterpret_cast<const cutlass::Array<From, kNumel>*>(in.data()));
  }
  return out;
}

using ::cuteattn::sm80::round_tile_to_tf32;

}  // namespace cuteattn::detail::sm80_bwd
