// Small CuTe helpers shared by the sm80 forward and backward kernels: register-layout views of MMA
// accumulators, fragment type conversion, warp-quad reductions, predicated global->shared copies and a
// pipelined shared->register GEMM. Stable interface: the backward kernels include this file too.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

namespace cuteattn::sm80 {

using namespace cute;
using cute::make_tensor;  // not cuteattn::make_tensor / cuteattn::Tensor (public API names)
using cute::Tensor;

// View of an SM80 16x8 MMA accumulator layout ((2,2), MMA_M, MMA_N) as (rows, cols) =
// ((2, MMA_M), (2, MMA_N)): value bit 1 picks the row half (row g or g+8), bit 0 the column pair.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_layout_rowcol(Layout acc) {
  static_assert(decltype(rank<0>(acc))::value == 2, "expects an SM80 accumulator layout ((2,2),M,N)");
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)), make_layout(get<0, 0>(acc), get<2>(acc)));
}

// Reinterpret an accumulator layout ((2,2), MMA_M, MMA_N) of S = Q K^T as the A-operand layout
// ((2,2,2), MMA_M, MMA_N/2) of a following m16n8k16 MMA that consumes S as its A matrix (P V).
// The 8 A values of one k16 slice are the 4 values of accumulator column tile 2k then those of 2k+1,
// so no data moves; only the layout changes (the "C layout -> A layout" step of FlashAttention-2).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_layout_as_a_operand(Layout acc) {
  static_assert(decltype(rank<0>(acc))::value == 2, "expects an SM80 accumulator layout ((2,2),M,N)");
  static_assert(decltype(size<2>(acc))::value % 2 == 0, "MMA_N must be even");
  auto split = logical_divide(acc, Shape<Underscore, Underscore, _2>{});  // ((2,2), M, (2, N/2))
  return make_layout(make_layout(get<0, 0>(split), get<0, 1>(split), get<2, 0>(split)), get<1>(split),
                     get<2, 1>(split));
}

// Reinterpret the accumulator layout of S (16x8x8 tf32 atoms) as the A-operand layout of P V without moving
// data. The C fragment holds columns (2t, 2t+1) of row g (and g+8), the A fragment wants columns (t, t+4):
// instead of shuffling, the k axis of every k8 slice is permuted, logical k = t <-> key 2t and k = t+4 <->
// key 2t+1, and V is read through the same permutation (SmemLayoutVt of the fp32 traits). A value
// (row half, k half) is then C value (column parity, row half): the two value modes swap.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_layout_as_tf32_a_operand(Layout acc) {
  static_assert(decltype(rank<0>(acc))::value == 2, "expects an SM80 accumulator layout ((2,2),M,N)");
  return make_layout(make_layout(get<0, 1>(acc), get<0, 0>(acc)), get<1>(acc), get<2>(acc));
}

// fp32 -> tf32 rounding to nearest, ties away from zero (cvt.rna), as a float whose low 13 mantissa bits are 0.
CUTE_DEVICE float round_to_tf32(float x) {
  uint32_t bits;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(x));
  return __uint_as_float(bits);
}

// Rounds, in place, the fp32 shared-memory elements a thread wrote with its own cp.async copies (call after
// cp_async_wait, before the barrier that publishes them): the tf32 MMAs then read operands rounded once per
// load, not once per warp that reads them. A no-op for 16-bit tiles.
template <class TS>
CUTE_DEVICE void round_tile_to_tf32(TS&& tXsX) {
  if constexpr (std::is_same_v<typename std::remove_reference_t<TS>::value_type, float>) {
    CUTE_UNROLL
    for (int i = 0; i < size(tXsX); ++i) tXsX(i) = round_to_tf32(tXsX(i));
  }
}

// Element-wise conversion of a register fragment to another numeric type, keeping its layout. To tf32 it
// rounds with cvt.rna (the rounding the inputs get), not with CUTLASS's converter.
template <class To, class Engine, class Layout>
CUTE_DEVICE auto convert_fragment(Tensor<Engine, Layout> const& src) {
  using From = typename Engine::value_type;
  constexpr int kN = decltype(size(src))::value;
  Tensor dst = make_tensor_like<To>(src);
  if constexpr (std::is_same_v<To, cutlass::tfloat32_t>) {
    CUTE_UNROLL
    for (int i = 0; i < kN; ++i) dst(i) = cutlass::tfloat32_t::bitcast(__float_as_uint(round_to_tf32(float(src(i)))));
  } else {
    cutlass::NumericArrayConverter<To, From, kN> converter;
    *reinterpret_cast<cutlass::Array<To, kN>*>(dst.data()) =
        converter(*reinterpret_cast<cutlass::Array<From, kN> const*>(src.data()));
  }
  return dst;
}

// Reduce over the 4 threads of a quad (the threads that share an accumulator row).
template <class Op>
CUTE_DEVICE float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 2));
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return x;
}

struct MaxOp {
  CUTE_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  CUTE_DEVICE float operator()(float a, float b) const { return a + b; }
};

// Global -> shared copy of one tile partitioned by a tiled copy (shape (CPY, CPY_ROW, CPY_COL)).
// `identity` is the same partition of an identity tensor (global coordinates relative to the tile),
// `col_ok(k)` says whether column chunk k lies inside the real head dim. Rows at or past `max_rows`
// and columns outside the head dim are zero-filled in shared memory, so the MMAs read zeros there.
// kRowCheck = false skips the row test for tiles known to be complete.
template <bool kRowCheck, class TiledCopy, class TS, class TD, class TC, class TP>
CUTE_DEVICE void copy_tile_predicated(TiledCopy const& tiled_copy, TS const& src, TD& dst, TC const& identity,
                                      TP const& col_ok, int max_rows) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    const bool row_ok = !kRowCheck || get<0>(identity(0, m, 0)) < max_rows;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k) {
      if (row_ok && col_ok(k)) {
        cute::copy(tiled_copy, src(_, m, k), dst(_, m, k));
      } else {
        cute::clear(dst(_, m, k));
      }
    }
  }
}

// Register/shared -> global copy of a partitioned tile (shape (CPY, CPY_ROW, CPY_COL)) that writes only rows below
// `max_rows` and column chunks below `max_cols` (`identity`: the same partition of an identity tensor); the
// elements outside are left untouched.
template <class TiledCopy, class TS, class TD, class TC>
CUTE_DEVICE void copy_tile_store_predicated(TiledCopy const& tiled_copy, TS const& src, TD& dst, TC const& identity,
                                            int max_rows, int max_cols) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (get<0>(identity(0, m, 0)) < max_rows) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) {
        if (get<1>(identity(0, 0, k)) < max_cols) cute::copy(tiled_copy, src(_, m, k), dst(_, m, k));
      }
    }
  }
}

// acc += A * B with both operands read from shared memory through ldmatrix, the loads of k-slice
// i+1 issued before the MMAs of slice i. tCrA/tCrB: MMA register fragments; tCsA/tCsB: the matching
// shared-memory partitions of the ldmatrix tiled copies.
template <class TA, class TB, class TC, class TsA, class TsB, class TiledMma, class CopyA, class CopyB, class ThrCopyA,
          class ThrCopyB>
CUTE_DEVICE void gemm_ss(TC& acc, TA& tCrA, TB& tCrB, TsA const& tCsA, TsB const& tCsB, TiledMma const& tiled_mma,
                         CopyA const& copy_a, CopyB const& copy_b, ThrCopyA const& thr_copy_a,
                         ThrCopyB const& thr_copy_b) {
  Tensor tCrA_view = thr_copy_a.retile_D(tCrA);  // (CPY, CPY_M, CPY_K)
  Tensor tCrB_view = thr_copy_b.retile_D(tCrB);  // (CPY, CPY_N, CPY_K)
  cute::copy(copy_a, tCsA(_, _, _0{}), tCrA_view(_, _, _0{}));
  cute::copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int i = 0; i < size<2>(tCrA); ++i) {
    if (i + 1 < size<2>(tCrA)) {
      cute::copy(copy_a, tCsA(_, _, i + 1), tCrA_view(_, _, i + 1));
      cute::copy(copy_b, tCsB(_, _, i + 1), tCrB_view(_, _, i + 1));
    }
    cute::gemm(tiled_mma, tCrA(_, _, i), tCrB(_, _, i), acc);
  }
}

// acc += A * B with A already in registers (e.g. P) and B read from shared memory through ldmatrix.
template <class TA, class TB, class TC, class TsB, class TiledMma, class CopyB, class ThrCopyB>
CUTE_DEVICE void gemm_rs(TC& acc, TA const& tCrA, TB& tCrB, TsB const& tCsB, TiledMma const& tiled_mma,
                         CopyB const& copy_b, ThrCopyB const& thr_copy_b) {
  Tensor tCrB_view = thr_copy_b.retile_D(tCrB);  // (CPY, CPY_N, CPY_K)
  if constexpr (std::is_same_v<typename TB::value_type, cutlass::tfloat32_t>) {
    // tf32 B (V^T, one 32-bit load per element): a whole k8 slice is d / 4 registers per thread, which next to
    // the fp32 output accumulators spills from d = 192 on; so B is loaded and consumed one copy tile (two n8
    // MMA columns) at a time. CPY_N index n holds MMA_N columns 2n and 2n + 1.
    static_assert(decltype(size<1>(tCrB))::value == 2 * decltype(size<1>(tCrB_view))::value);
    CUTE_UNROLL
    for (int i = 0; i < size<2>(tCrA); ++i) {
      CUTE_UNROLL
      for (int n = 0; n < size<1>(tCrB_view); ++n) {
        cute::copy(copy_b, tCsB(_, n, i), tCrB_view(_, n, i));
        CUTE_UNROLL
        for (int j = 2 * n; j < 2 * n + 2; ++j) {
          CUTE_UNROLL
          for (int m = 0; m < size<1>(tCrA); ++m) cute::gemm(tiled_mma, tCrA(_, m, i), tCrB(_, j, i), acc(_, m, j));
        }
      }
    }
  } else {
    cute::copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
    CUTE_UNROLL
    for (int i = 0; i < size<2>(tCrA); ++i) {
      if (i + 1 < size<2>(tCrA)) cute::copy(copy_b, tCsB(_, _, i + 1), tCrB_view(_, _, i + 1));
      cute::gemm(tiled_mma, tCrA(_, _, i), tCrB(_, _, i), acc);
    }
  }
}

}  // namespace cuteattn::sm80
