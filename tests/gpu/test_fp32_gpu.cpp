// GPU tests of fp32 inputs on the sm80 kernels (tf32 tensor-core math, fp32 accumulation and outputs): forward
// (out, LSE) and backward (dQ, dK, dV) against the float64 oracle, with the plain tf32 computation of
// tests/common as the yardstick (2x forward, 3x gradients), every head-dim bucket, odd lengths, varlen with empty
// sequences, GQA/MQA, causal/window/softcap, deterministic backward bit for bit, and fp32 HSTU refused.
#include <cstdint>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cuteattn/attention.h"
#include "gpu/device_case.h"

namespace cuteattn::test {
namespace {

constexpr DType kF32 = DType::kFloat32;

void check_forward(const CaseConfig& cfg) { check_forward_on_device(cfg, Backend::kSm80); }

// O and LSE come from the fp32 GPU forward, as in training: the backward recomputes P = exp(S - LSE) from tf32
// scores, which sums to 1 only with the LSE of the same tf32 scores (an fp32 CPU LSE leaves P off by the tf32
// error of S, e.g. P = 1 + 1e-3 for a row with one key, which the plain yardstick does not see).
void check_backward(const CaseConfig& cfg, bool deterministic = false, int repeats = 0) {
  check_backward_on_device(cfg, Backend::kSm80, deterministic, repeats, ForwardOn::kGpu);
}

// ---- forward ----

TEST(Fp32Forward, EveryBucket) {
  for (int64_t d : {32, 64, 96, 128, 192, 256}) {
    check_forward(softmax_fixed(kF32, 2, 2, 2, d, 113, 200));
    check_forward(with(softmax_fixed(kF32, 1, 2, 2, d, 257, 129), [](CaseConfig& c) { c.causal = true; }));
  }
  // Head dims below their bucket, d != d_v.
  check_forward(softmax_fixed(kF32, 1, 2, 2, 44, 150, 150));
  check_forward(with(softmax_fixed(kF32, 1, 2, 2, 128, 150, 170), [](CaseConfig& c) { c.head_dim_v = 68; }));
}

TEST(Fp32Forward, OddLengths) {
  for (int64_t s : {1, 113, 1023}) check_forward(softmax_fixed(kF32, 2, 2, 2, 64, s, s));
  check_forward(softmax_fixed(kF32, 1, 2, 2, 128, 1, 1023));
  check_forward(softmax_fixed(kF32, 1, 1, 1, 32, 4224, 4224));
}

TEST(Fp32Forward, CausalWindowSoftcap) {
  check_forward(with(softmax_fixed(kF32, 1, 2, 2, 128, 200, 457), [](CaseConfig& c) { c.causal = true; }));
  check_forward(with(softmax_fixed(kF32, 1, 2, 2, 64, 457, 200), [](CaseConfig& c) { c.causal = true; }));
  check_forward(with(softmax_fixed(kF32, 1, 2, 2, 96, 500, 500), [](CaseConfig& c) {
    c.window_left = 70;
    c.window_right = 33;
  }));
  const CaseConfig cap = with(softmax_fixed(kF32, 2, 2, 2, 64, 300, 300), [](CaseConfig& c) {
    c.softcap = 5.0f;
    c.softmax_scale = 0.3f;
  });
  check_forward(cap);
  check_forward(with(cap, [](CaseConfig& c) { c.causal = true; }));
}

TEST(Fp32Forward, GqaAndMqa) {
  check_forward(softmax_fixed(kF32, 2, 8, 2, 64, 200, 231));
  check_forward(with(softmax_fixed(kF32, 1, 8, 1, 128, 129, 257), [](CaseConfig& c) { c.causal = true; }));
}

TEST(Fp32Forward, VarlenWithEmptySequences) {
  CaseConfig cfg = softmax_varlen(kF32, {0, 113, 1, 0, 300, 64}, {5, 113, 0, 0, 257, 200}, 4, 4, 64);
  check_forward(cfg);
  cfg.causal = true;
  check_forward(cfg);
  cfg.heads_k = 1;
  cfg.head_dim = 256;
  check_forward(cfg);
}

// ---- backward ----

TEST(Fp32Backward, EveryBucket) {
  for (int64_t d : {32, 64, 96, 128, 192, 256}) {
    check_backward(softmax_fixed(kF32, 2, 2, 2, d, 113, 200));
    check_backward(with(softmax_fixed(kF32, 1, 2, 2, d, 257, 129), [](CaseConfig& c) { c.causal = true; }));
  }
  check_backward(softmax_fixed(kF32, 1, 2, 2, 44, 150, 150));
  check_backward(with(softmax_fixed(kF32, 1, 2, 2, 128, 150, 170), [](CaseConfig& c) { c.head_dim_v = 68; }));
}

TEST(Fp32Backward, OddLengths) {
  for (int64_t s : {1, 113, 1023}) check_backward(softmax_fixed(kF32, 2, 2, 2, 64, s, s));
  check_backward(softmax_fixed(kF32, 1, 1, 1, 32, 4224, 4224));
}

TEST(Fp32Backward, CausalWindowSoftcap) {
  check_backward(with(softmax_fixed(kF32, 1, 2, 2, 128, 200, 457), [](CaseConfig& c) { c.causal = true; }));
  check_backward(with(softmax_fixed(kF32, 1, 2, 2, 64, 457, 200), [](CaseConfig& c) { c.causal = true; }));
  check_backward(with(softmax_fixed(kF32, 1, 2, 2, 96, 500, 500), [](CaseConfig& c) {
    c.window_left = 70;
    c.window_right = 33;
  }));
  const CaseConfig cap = with(softmax_fixed(kF32, 1, 2, 2, 64, 300, 300), [](CaseConfig& c) {
    c.softcap = 5.0f;
    c.softmax_scale = 0.3f;
  });
  check_backward(cap);
  check_backward(with(cap, [](CaseConfig& c) { c.causal = true; }));
}

TEST(Fp32Backward, GqaAndMqa) {
  check_backward(softmax_fixed(kF32, 2, 8, 2, 64, 200, 231));
  check_backward(with(softmax_fixed(kF32, 1, 8, 1, 128, 129, 257), [](CaseConfig& c) { c.causal = true; }));
}

TEST(Fp32Backward, VarlenWithEmptySequences) {
  CaseConfig cfg = softmax_varlen(kF32, {0, 113, 1, 0, 300, 64}, {5, 113, 0, 0, 257, 200}, 4, 4, 64);
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
  cfg.heads_k = 1;
  cfg.head_dim = 256;
  check_backward(cfg);
}

TEST(Fp32Backward, DeterministicBitIdentical) {
  check_backward(softmax_fixed(kF32, 2, 4, 2, 64, 700, 700), /*deterministic=*/true, /*repeats=*/3);
  check_backward(with(softmax_fixed(kF32, 1, 2, 2, 192, 515, 515), [](CaseConfig& c) { c.causal = true; }),
                 /*deterministic=*/true, /*repeats=*/3);
}

TEST(Fp32Backward, LargerBatchCausal) {
  check_backward(with(softmax_fixed(kF32, 2, 4, 2, 128, 515, 515), [](CaseConfig& c) { c.causal = true; }));
}

// ---- HSTU: fp16/bf16 only on the GPU ----

TEST(Fp32Hstu, RefusedWithNotSupported) {
  for (Backend backend : {Backend::kSm80, Backend::kAuto}) {
    Case c = Case::make(hstu_varlen(kF32, {113, 0, 64}, 2, 64, true, 1.0f / 64), test_seed());
    DeviceCase dc(c, backend, DeviceCase::Pass::kBackward);
    const Status f = attention_forward(dc.forward_args());
    EXPECT_EQ(f.code, StatusCode::kNotSupported) << backend_name(backend) << ": " << f.message;
    const Status b = attention_backward(dc.backward_args(false));
    EXPECT_EQ(b.code, StatusCode::kNotSupported) << backend_name(backend) << ": " << b.message;
  }
}

}  // namespace
}  // namespace cuteattn::test
