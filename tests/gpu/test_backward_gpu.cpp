// GPU tests of the sm80 backward kernels (softmax and HSTU with dRab): dQ/dK/dV/dRab against the float64 CPU
// oracle under the FlashAttention tolerance rule, every output element written, determinism bit for bit.
// The forward outputs the backward consumes (O, LSE) come from the CPU tiled backend unless a test says
// otherwise, so a failure here points at the backward kernels.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cuteattn/attention.h"
#include "gpu/device_case.h"

namespace cuteattn::test {
namespace {

enum class ForwardOn { kCpu, kGpu };

// Runs the sm80 backward on `c` (forward outputs from `fwd`), compares with the float64 oracle, and when
// `check_determinism` runs the deterministic mode twice and demands identical bits.
void check_backward(const CaseConfig& cfg, bool deterministic = false, bool check_determinism = false,
                    ForwardOn fwd = ForwardOn::kCpu) {
  SCOPED_TRACE(cfg.describe() + (deterministic ? " deterministic" : ""));
  Case c = Case::make(cfg, test_seed());
  Case ref = c.fp32_copy();
  ASSERT_TRUE(run_forward(ref, Backend::kCpuReference));
  ASSERT_TRUE(run_backward(ref, Backend::kCpuReference));
  Case plain = c.fresh_copy();
  plain_backward(plain);

  if (fwd == ForwardOn::kCpu && cfg.score == ScoreFunction::kSoftmax) ASSERT_TRUE(run_forward(c, Backend::kCpu));
  DeviceCase dc(c, Backend::kSm80, DeviceCase::Pass::kBackward);
  if (fwd == ForwardOn::kGpu && cfg.score == ScoreFunction::kSoftmax) {
    const Status s = attention_forward(dc.forward_args());
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dc.download(c.out);
    dc.download(c.lse);
  }
  const Status s = attention_backward(dc.backward_args(deterministic));
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dc.download_gradients();

  const bool hstu = cfg.score == ScoreFunction::kHstuSilu;
  const double factor = hstu ? kHstuFactor : kGradFactor;
  EXPECT_TRUE(check_close("dq", c.dq, plain.dq, ref.dq, factor));
  EXPECT_TRUE(check_close("dk", c.dk, plain.dk, ref.dk, factor));
  EXPECT_TRUE(check_close("dv", c.dv, plain.dv, ref.dv, factor));
  if (cfg.drab) EXPECT_TRUE(check_close("drab", c.drab, plain.drab, ref.drab, kHstuFactor));

  if (check_determinism) {
    const std::vector<HostTensor> first = {c.dq, c.dk, c.dv, c.drab};
    for (int run = 0; run < 2; ++run) {
      dc.poison_gradients();
      const Status s2 = attention_backward(dc.backward_args(deterministic));
      ASSERT_TRUE(s2.ok()) << s2.message;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      dc.download_gradients();
      const std::vector<HostTensor> again = {c.dq, c.dk, c.dv, c.drab};
      const char* names[] = {"dq", "dk", "dv", "drab"};
      for (size_t i = 0; i < first.size(); ++i) {
        EXPECT_EQ(first[i].bytes.size(), again[i].bytes.size());
        EXPECT_TRUE(first[i].bytes == again[i].bytes) << names[i] << " differs between deterministic runs";
      }
    }
  }
}

CaseConfig softmax_cfg(DType dt, int64_t b, int64_t h, int64_t hk, int64_t d, int64_t sq, int64_t sk) {
  CaseConfig cfg;
  cfg.score = ScoreFunction::kSoftmax;
  cfg.dtype = dt;
  cfg.batch = b;
  cfg.heads = h;
  cfg.heads_k = hk;
  cfg.head_dim = d;
  cfg.seqlen_q = sq;
  cfg.seqlen_k = sk;
  return cfg;
}

CaseConfig hstu_cfg(DType dt, std::vector<int32_t> lens, int64_t h, int64_t d) {
  CaseConfig cfg;
  cfg.score = ScoreFunction::kHstuSilu;
  cfg.dtype = dt;
  cfg.seqlens_q = std::move(lens);
  cfg.heads = h;
  cfg.heads_k = h;
  cfg.head_dim = d;
  cfg.alpha = 1.0f / static_cast<float>(d);
  cfg.causal = true;
  return cfg;
}

// ---- softmax ----

TEST(Sm80Backward, SoftmaxOddLengths) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t s : {1, 113, 1023}) check_backward(softmax_cfg(dt, 2, 2, 2, 64, s, s));
  }
  check_backward(softmax_cfg(DType::kBFloat16, 1, 2, 2, 128, 113, 300));
  check_backward(softmax_cfg(DType::kFloat16, 1, 2, 2, 128, 257, 97));
}

TEST(Sm80Backward, SoftmaxHeadDimBelowBucket) {
  check_backward(softmax_cfg(DType::kBFloat16, 2, 2, 2, 48, 130, 200));
  CaseConfig cfg = softmax_cfg(DType::kFloat16, 1, 2, 2, 128, 150, 150);
  cfg.head_dim_v = 64;
  check_backward(cfg);
  cfg = softmax_cfg(DType::kBFloat16, 1, 2, 2, 72, 129, 129);
  cfg.head_dim_v = 104;
  check_backward(cfg);
}

TEST(Sm80Backward, SoftmaxCausalWindowSoftcap) {
  CaseConfig cfg = softmax_cfg(DType::kBFloat16, 2, 2, 2, 64, 333, 333);
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_cfg(DType::kFloat16, 1, 2, 2, 128, 200, 457);  // causal with s_q < s_k (bottom-right aligned)
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_cfg(DType::kFloat16, 1, 2, 2, 128, 457, 200);  // causal with s_q > s_k: rows without keys
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_cfg(DType::kBFloat16, 1, 2, 2, 64, 500, 500);
  cfg.window_left = 70;
  cfg.window_right = 33;
  check_backward(cfg);
  cfg = softmax_cfg(DType::kBFloat16, 1, 2, 2, 64, 300, 300);
  cfg.softcap = 5.0f;
  cfg.softmax_scale = 0.3f;
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
}

TEST(Sm80Backward, SoftmaxGqa) {
  check_backward(softmax_cfg(DType::kBFloat16, 2, 6, 2, 64, 200, 200));
  CaseConfig cfg = softmax_cfg(DType::kFloat16, 1, 8, 1, 128, 129, 257);
  cfg.causal = true;
  check_backward(cfg);
}

TEST(Sm80Backward, SoftmaxVarlenWithEmptySequences) {
  CaseConfig cfg = softmax_cfg(DType::kBFloat16, 0, 3, 3, 64, 0, 0);
  cfg.seqlens_q = {0, 113, 1, 0, 300, 64};
  cfg.seqlens_k = {5, 113, 0, 0, 257, 200};
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
  cfg.heads_k = 1;
  check_backward(cfg);
}

TEST(Sm80Backward, SoftmaxDeterministic) {
  CaseConfig cfg = softmax_cfg(DType::kBFloat16, 2, 4, 2, 64, 700, 700);
  check_backward(cfg, /*deterministic=*/true, /*check_determinism=*/true);
  cfg = softmax_cfg(DType::kFloat16, 1, 2, 2, 128, 1023, 1023);
  cfg.causal = true;
  check_backward(cfg, true, true);
}

TEST(Sm80Backward, SoftmaxWithGpuForward) {
  CaseConfig cfg = softmax_cfg(DType::kBFloat16, 2, 4, 2, 128, 515, 515);
  cfg.causal = true;
  check_backward(cfg, false, false, ForwardOn::kGpu);
}

TEST(Sm80Backward, SoftmaxBuckets96And256) {
  CaseConfig cfg = softmax_cfg(DType::kBFloat16, 2, 2, 2, 96, 177, 177);
  cfg.causal = true;
  check_backward(cfg);
  check_backward(softmax_cfg(DType::kFloat16, 1, 4, 2, 80, 211, 150));
  check_backward(softmax_cfg(DType::kFloat16, 1, 2, 2, 256, 130, 250));
  cfg = softmax_cfg(DType::kBFloat16, 1, 2, 2, 200, 300, 300);
  cfg.causal = true;
  check_backward(cfg, /*deterministic=*/true, /*check_determinism=*/true);
}

// ---- HSTU ----

TEST(Sm80Backward, HstuCausalAndNoMask) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    CaseConfig cfg = hstu_cfg(dt, {113, 0, 1, 400}, 2, 64);
    check_backward(cfg);
    cfg.causal = false;
    check_backward(cfg);
  }
  check_backward(hstu_cfg(DType::kBFloat16, {1023, 77}, 2, 128));
}

// Cases with rab keep max_seqlen_k a multiple of 8: the checker wants 16-byte aligned rab rows.
TEST(Sm80Backward, HstuRabAndDrab) {
  for (int64_t rab_heads : {1, 2}) {
    CaseConfig cfg = hstu_cfg(DType::kBFloat16, {200, 0, 131}, 2, 64);
    cfg.rab_heads = rab_heads;
    cfg.drab = true;
    check_backward(cfg);
    check_backward(cfg, /*deterministic=*/true, /*check_determinism=*/true);
    cfg.rab_heads = rab_heads;
    cfg.drab = false;
    check_backward(cfg);
  }
  CaseConfig cfg = hstu_cfg(DType::kFloat16, {304, 17}, 3, 128);
  cfg.rab_heads = 1;
  cfg.drab = true;
  check_backward(cfg);
}

TEST(Sm80Backward, HstuBuckets96And256) {
  CaseConfig cfg = hstu_cfg(DType::kBFloat16, {200, 31, 0}, 2, 96);
  cfg.rab_heads = 1;
  cfg.drab = true;
  check_backward(cfg);
  cfg = hstu_cfg(DType::kFloat16, {160, 97}, 2, 256);
  cfg.rab_heads = 2;
  cfg.drab = true;
  check_backward(cfg, /*deterministic=*/true, /*check_determinism=*/true);
}

TEST(Sm80Backward, HstuContextTargetWindow) {
  CaseConfig cfg = hstu_cfg(DType::kBFloat16, {296, 45, 263}, 2, 64);
  cfg.num_contexts = {20, 3, 0};
  cfg.num_targets = {17, 5, 40};
  cfg.target_group_size = 3;
  cfg.rab_heads = 2;
  cfg.drab = true;
  check_backward(cfg);
  cfg = hstu_cfg(DType::kFloat16, {333, 129}, 2, 128);
  cfg.causal = false;
  cfg.window_left = 50;
  cfg.window_right = 20;
  check_backward(cfg);
}

}  // namespace
}  // namespace cuteattn::test
