// The HSTU pointwise function on GPU registers, shared by the sm80 and sm90 kernels: P = silu(alpha u) /
// scaling_seqlen from u = qk + rab through tanh.approx, and its slope dP/du for the backward (SEMANTICS.md
// section 2; the CPU backend's detail::HstuScore computes the same with expf).
#pragma once

#include <cute/tensor.hpp>

#include "core/params.h"

namespace cuteattn::detail {

CUTE_DEVICE float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// silu(x) = x * sigmoid(x) = x / 2 * (1 + tanh(x / 2)): one MUFU operation per element (exp and a reciprocal
// would take two, and at d = 128 two MUFU operations per score cost as much time as both GEMMs).
struct HstuPointwise {
  float half_alpha;  // alpha / 2
  float half_scale;  // alpha / 2 / scaling_seqlen

  CUTE_DEVICE explicit HstuPointwise(const detail::Params& p)
      : half_alpha(0.5f * p.alpha), half_scale(0.5f * p.alpha * p.inv_scaling_seqlen) {}

  CUTE_DEVICE float prob(float u) const {
    const float h = u * half_scale;
    return fmaf(h, tanh_approx(u * half_alpha), h);
  }
  // P and its slope dP/du = alpha / scaling dsilu(alpha u) (the backward): with h = alpha u / 2, t = tanh(h) and
  // g = alpha / 2 / scaling (1 + t), P = u g and dP/du = g (1 + h (1 - t)): five operations and the tanh, where
  // P and the product form of dP/du took seven (H100 bf16 causal h 4, same process: backward dense d 128 2k / 4k /
  // 16k +2.5% / +2.6% / +1.3%, jagged d 64 max 1k / 4k +4%).
  CUTE_DEVICE float prob_and_slope(float u, float& slope) const {
    const float h = u * half_alpha;
    const float t = tanh_approx(h);
    const float g = fmaf(half_scale, t, half_scale);
    slope = fmaf(g, fmaf(-h, t, h), g);
    return u * g;
  }

  template <class TensorS>
  CUTE_DEVICE void apply(TensorS& tSrS) const {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(tSrS); ++i) tSrS(i) = prob(tSrS(i));
  }
};

}  // namespace cuteattn::detail
