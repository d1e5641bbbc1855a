// Online softmax of the sm90 forward kernel on wgmma accumulators (exp2 domain), the register-layout views
// it needs (accumulator as rows x cols, accumulator reused as the register A operand of P V) and the
// fragment conversion to 16 bits.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

namespace cuteattn::sm90 {

using namespace cute;

// A wgmma m64nN accumulator ((2, 2, N/8), MMA_M, MMA_N) seen as (rows, cols) = ((2, MMA_M), (2, N/8, MMA_N)):
// per thread, value bit 1 picks row g or g + 8 of its 16-row slice, bit 0 and the chunk index the column.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_rowcol(Layout acc) {
  static_assert(decltype(rank<0>(acc))::value == 3, "expects a wgmma accumulator layout ((2,2,V),M,N)");
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// The same registers as the A operand ((2, 2, 2), MMA_M, K/16) of a 16-bit RS wgmma with K = N: one k16 slice
// is accumulator chunks 2k and 2k+1, so P never moves between registers.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_as_a_operand(Layout acc) {
  static_assert(decltype(rank<0>(acc))::value == 3, "expects a wgmma accumulator layout ((2,2,V),M,N)");
  auto split = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});  // (2, 2, (2, V/2))
  return make_layout(make_layout(get<0>(split), get<1>(split), get<2, 0>(split)), get<1>(acc),
                     coalesce(make_layout(get<2, 1>(split), get<2>(acc))));
}

// Element-wise conversion into a register fragment of the same size (any layout over the same storage order,
// e.g. an accumulator into its A-operand view).
template <class EngineS, class LayoutS, class EngineD, class LayoutD>
CUTE_DEVICE void convert_fragment(cute::Tensor<EngineS, LayoutS> const& src, cute::Tensor<EngineD, LayoutD>& dst) {
  using From = typename EngineS::value_type;
  using To = typename EngineD::value_type;
  constexpr int kN = decltype(size(src))::value;
  static_assert(kN == decltype(size(dst))::value);
  cutlass::NumericArrayConverter<To, From, kN> converter;
  *reinterpret_cast<cutlass::Array<To, kN>*>(dst.data()) =
      converter(*reinterpret_cast<cutlass::Array<From, kN> const*>(src.data()));
}

template <class Op>
CUTE_DEVICE float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return op(x, __shfl_xor_sync(0xffffffffu, x, 1));
}

// Running max and sum of kRows rows. Scores are kept unscaled; `scale_log2` turns them into log2 units, so
// p = exp2(s * scale_log2 - max * scale_log2). A row that has seen only -inf keeps max = -inf and sum = 0.
template <int kRows>
struct OnlineSoftmax {
  static constexpr int kNumRows = kRows;
  float row_max[kRows];
  float row_sum[kRows];  // per thread: partial over its columns; reduced over the quad in finalize
  float scale_log2;

  CUTE_DEVICE explicit OnlineSoftmax(float scale_log2_) : scale_log2(scale_log2_) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.0f;
    }
  }

  // S (rows, cols) -> P in place; returns in `rescale` the factor the rows of O must be multiplied by.
  template <class Tensor0>
  CUTE_DEVICE void update(Tensor0& s, float (&rescale)[kRows]) {
    static_assert(decltype(size<0>(s))::value == kRows);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float m = row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) m = fmaxf(m, s(r, c));
      m = quad_allreduce(m, [](float a, float b) { return fmaxf(a, b); });
      // All -inf so far: subtract 0 instead so that exp2 gives 0 rather than NaN.
      const float m_scaled = m == -INFINITY ? 0.0f : m * scale_log2;
      rescale[r] = exp2f(row_max[r] * scale_log2 - m_scaled);
      row_max[r] = m;
      float sum = 0.0f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = exp2f(fmaf(s(r, c), scale_log2, -m_scaled));
        sum += s(r, c);
      }
      row_sum[r] = row_sum[r] * rescale[r] + sum;
    }
  }

  // Turns the running sums into the factors 1/sum that normalise O (0 for empty rows) and returns
  // LSE = ln(sum exp(s * scale)) per row (-inf for empty rows).
  CUTE_DEVICE void finalize(float (&inv_sum)[kRows], float (&lse)[kRows]) const {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_allreduce(row_sum[r], [](float a, float b) { return a + b; });
      const bool empty = sum == 0.0f || sum != sum;
      inv_sum[r] = empty ? 0.0f : 1.0f / sum;
      lse[r] = empty ? -INFINITY : (row_max[r] * scale_log2 + log2f(sum)) * float(M_LN2);
    }
  }
};

template <class Tensor0, int kRows>
CUTE_DEVICE void scale_rows(Tensor0& acc_rc, float const (&factor)[kRows]) {
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(acc_rc); ++c) acc_rc(r, c) *= factor[r];
  }
}

}  // namespace cuteattn::sm90
