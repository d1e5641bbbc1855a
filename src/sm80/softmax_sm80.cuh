// Online softmax of the sm80 forward kernel: running row max and row sum over key tiles in exp2 form,
// rescaling of the output accumulator, and the final normalisation with the natural-log LSE.
// Scores arrive as a (rows, cols) register view of the S accumulator; masked entries hold -inf.
// The per-thread partial row sums live in registers, or (kSumsInSmem, for the register-lean key loop) in
// shared memory, one column of a (rows, threads) array per thread: read and written once per key tile, they
// then hold no registers across the key loop.
#pragma once

#include <cfloat>
#include <cmath>

#include <cute/tensor.hpp>

#include "sm80/utils_sm80.cuh"

namespace cuteattn::sm80 {

using namespace cute;
using cute::make_tensor;  // not cuteattn::make_tensor / cuteattn::Tensor (public API names)
using cute::Tensor;

// Per-thread partial row sums, addressed as sums(mi, tid): registers, or a column of shared memory.
template <int kRows, int kThreads, bool kInSmem>
struct RowSums {
  float regs[kRows];
  CUTE_DEVICE explicit RowSums(float (*)[kThreads]) {}
  CUTE_DEVICE float& operator()(int mi, int) { return regs[mi]; }
};
template <int kRows, int kThreads>
struct RowSums<kRows, kThreads, true> {
  float (*smem)[kThreads];  // [row][thread]
  CUTE_DEVICE explicit RowSums(float (*sums)[kThreads]) : smem(sums) {}
  CUTE_DEVICE float& operator()(int mi, int tid) { return smem[mi][tid]; }
};

template <int kRows, int kThreads, bool kSumsInSmem>
struct OnlineSoftmax {
  // The exponent offset may lag behind the true running max by up to this much (log2 units): P values
  // then reach 2^kMaxLag (exact in fp32 and bf16 alike) and the output is only rescaled when the max
  // jumps by more, which after the first key tiles almost never happens. Offset and sum stay consistent,
  // so the result is the same softmax.
  static constexpr float kMaxLag = 8.0f;

  Tensor<ArrayEngine<float, kRows>, Layout<Shape<Int<kRows>>>> row_offset = make_tensor<float>(Shape<Int<kRows>>{});
  RowSums<kRows, kThreads, kSumsInSmem> row_sum;

  // Offsets start at the lowest finite float, not -inf: every exponent below is then finite - finite or
  // -inf - finite, so no row needs a second, sanitised copy of its offset (registers at the kernel's peak).
  // A row that has seen no finite score keeps it; its exponents are <= 0 and its sum stays 0.
  // smem_sums: the (kRows, kThreads) shared array when kSumsInSmem, else unused.
  CUTE_DEVICE OnlineSoftmax(float (*smem_sums)[kThreads], int tid) : row_sum(smem_sums) {
    fill(row_offset, -FLT_MAX);
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) row_sum(mi, tid) = 0.0f;
  }

  // Fold one tile of scores into the running statistics: S becomes exp2(S * scale_log2 - offset) in
  // place. When some row of the warp sees its max exceed offset + kMaxLag, the whole warp moves every
  // offset to its current max and rescales its output rows (by exp2(-FLT_MAX - max) = 0 on the first
  // tile, where O and the sum are still 0).
  template <class TS, class TO>
  CUTE_DEVICE void update(TS& scores, TO& acc_o_rowcol, float scale_log2, int tid) {
    static_assert(decltype(size<0>(scores))::value == kRows);
    float tile_max[kRows];
    bool grow = false;
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      float m = -INFINITY;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(scores); ++ni) m = fmaxf(m, scores(mi, ni));
      tile_max[mi] = quad_allreduce(m, MaxOp{}) * scale_log2;
      grow |= tile_max[mi] > row_offset(mi) + kMaxLag;
    }
    if (__any_sync(0xffffffffu, grow)) {
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        const float offset = fmaxf(row_offset(mi), tile_max[mi]);
        const float correction = exp2f(row_offset(mi) - offset);
        row_sum(mi, tid) *= correction;
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(acc_o_rowcol); ++ni) acc_o_rowcol(mi, ni) *= correction;
        row_offset(mi) = offset;
      }
    }
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const float offset = row_offset(mi);
      float sum = 0.0f;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(scores); ++ni) {
        const float p = exp2f(scores(mi, ni) * scale_log2 - offset);
        scores(mi, ni) = p;
        sum += p;
      }
      row_sum(mi, tid) += sum;  // per-thread partial; the quad reduction happens once, in finalize
    }
  }

  // Normalise the output rows and return, per row, LSE = log(sum exp(S)) in natural log (score units
  // are raw * scale_log2 / log2(e)); -inf with O = 0 for rows that saw no visible key.
  template <class TO, class TL>
  CUTE_DEVICE void finalize(TO& acc_o_rowcol, TL& lse, int tid) {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const float sum = quad_allreduce(row_sum(mi, tid), SumOp{});
      const bool empty = !(sum > 0.0f);
      const float inv = empty ? 0.0f : 1.0f / sum;
      lse(mi) = empty ? -INFINITY : (row_offset(mi) + log2f(sum)) * float(M_LN2);
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(acc_o_rowcol); ++ni) acc_o_rowcol(mi, ni) *= inv;
    }
  }
};

}  // namespace cuteattn::sm80
