// Online softmax of the sm80 forward kernel: running row max and row sum over key tiles in exp2 form,
// rescaling of the output accumulator, and the final normalisation with the natural-log LSE.
// Scores arrive as a (rows, cols) register view of the S accumulator; masked entries hold -inf.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "sm80/utils_sm80.cuh"

namespace cuteattn::sm80 {

using namespace cute;
using cute::make_tensor;  // not cuteattn::make_tensor / cuteattn::Tensor (public API names)
using cute::Tensor;

template <int kRows>
struct OnlineSoftmax {
  // The exponent offset may lag behind the true running max by up to this much (log2 units): P values
  // then reach 2^kMaxLag (exact in fp32 and bf16 alike) and the output is only rescaled when the max
  // jumps by more, which after the first key tiles almost never happens. Offset and sum stay consistent,
  // so the result is the same softmax.
  static constexpr float kMaxLag = 8.0f;

  Tensor<ArrayEngine<float, kRows>, Layout<Shape<Int<kRows>>>> row_offset = make_tensor<float>(Shape<Int<kRows>>{});
  Tensor<ArrayEngine<float, kRows>, Layout<Shape<Int<kRows>>>> row_sum = make_tensor<float>(Shape<Int<kRows>>{});

  CUTE_DEVICE OnlineSoftmax() {
    fill(row_offset, -INFINITY);
    clear(row_sum);
  }

  // Fold one tile of scores into the running statistics: S becomes exp2(S * scale_log2 - offset) in
  // place. When some row of the warp sees its max exceed offset + kMaxLag, the whole warp moves every
  // offset to its current max and rescales its output rows (by exp2(-inf) = 0 on the first tile, where
  // O and the sum are still 0). A row whose every score so far is -inf keeps offset = -inf and uses 0 in
  // the exponent so that exp2(-inf - 0) = 0 instead of NaN.
  template <class TS, class TO>
  CUTE_DEVICE void update(TS& scores, TO& acc_o_rowcol, float scale_log2) {
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
        const float correction = exp2f(row_offset(mi) - (offset == -INFINITY ? 0.0f : offset));
        row_sum(mi) *= correction;
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(acc_o_rowcol); ++ni) acc_o_rowcol(mi, ni) *= correction;
        row_offset(mi) = offset;
      }
    }
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const float offset = row_offset(mi) == -INFINITY ? 0.0f : row_offset(mi);
      float sum = row_sum(mi);
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(scores); ++ni) {
        const float p = exp2f(scores(mi, ni) * scale_log2 - offset);
        scores(mi, ni) = p;
        sum += p;
      }
      row_sum(mi) = sum;  // per-thread partial; the quad reduction happens once, in finalize
    }
  }

  // Normalise the output rows and return, per row, LSE = log(sum exp(S)) in natural log (score units
  // are raw * scale_log2 / log2(e)); -inf with O = 0 for rows that saw no visible key.
  template <class TO, class TL>
  CUTE_DEVICE void finalize(TO& acc_o_rowcol, TL& lse) {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const float sum = quad_allreduce(row_sum(mi), SumOp{});
      const bool empty = !(sum > 0.0f);
      const float inv = empty ? 0.0f : 1.0f / sum;
      lse(mi) = empty ? -INFINITY : (row_offset(mi) + log2f(sum)) * float(M_LN2);
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(acc_o_rowcol); ++ni) acc_o_rowcol(mi, ni) *= inv;
    }
  }
};

}  // namespace cuteattn::sm80
