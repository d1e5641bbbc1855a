// Score functions and their derivatives (SEMANTICS.md sections 1 and 2), shared by every backend.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace cuteattn::detail {

// Softmax scores: S = scale * qk, optionally S = softcap * tanh(S / softcap).
struct SoftcapScore {
  float scale = 1.0f;
  float softcap = 0.0f;  // 0 = off

  CUTEATTN_HD float apply(float qk) const {
    const float s = scale * qk;
    return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
  }
  // dS/d(qk) given the transformed score s.
  CUTEATTN_HD float derivative_from_score(float s) const {
    if (softcap <= 0.0f) return scale;
    const float t = s / softcap;
    return scale * (1.0f - t * t);
  }
};

CUTEATTN_HD float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// HSTU: S = alpha * (qk + rab), P = silu(S) * inv_scaling_seqlen.
struct HstuScore {
  float alpha = 1.0f;
  float inv_scaling_seqlen = 1.0f;

  CUTEATTN_HD float pre(float qk, float rab) const { return alpha * (qk + rab); }
  CUTEATTN_HD float prob(float s) const { return s * sigmoidf(s) * inv_scaling_seqlen; }
  // dP/d(qk + rab) from the pre-activation s: alpha * dsilu(s) / scaling_seqlen.
  CUTEATTN_HD float dprob(float s) const {
    const float sg = sigmoidf(s);
    return alpha * sg * (1.0f + s * (1.0f - sg)) * inv_scaling_seqlen;
  }
};

}  // namespace cuteattn::detail
