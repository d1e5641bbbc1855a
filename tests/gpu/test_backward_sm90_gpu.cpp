// GPU tests of the sm90 backward kernel (TMA + wgmma, softmax): dQ/dK/dV against the float64 CPU oracle under
// the FlashAttention gradient rule (3x the error of a plain bf16/fp16 computation), every output element written
// over a NaN poison, for odd lengths (1, 113, 1023, 4224), s_q != s_k, the d 64 and d 128 buckets and head dims
// below them, causal with s_q != s_k (rows without keys), sliding windows, softcap, GQA and varlen with empty
// sequences. O and LSE come from the CPU tiled forward, so a failure points at the backward.
#include <cuda_runtime.h>

#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cuteattn/attention.h"
#include "gpu/device_case.h"

namespace cuteattn::test {
namespace {

void check_backward(const CaseConfig& cfg) { check_backward_on_device(cfg, Backend::kSm90); }

class Sm90Backward : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!is_hopper()) GTEST_SKIP() << "the sm90 kernels need a Hopper GPU";
  }
};

TEST_F(Sm90Backward, OddLengths) {
  for (int64_t s : {1, 113, 1023}) check_backward(softmax_fixed(DType::kBFloat16, 2, 2, 2, 128, s, s));
  check_backward(softmax_fixed(DType::kBFloat16, 1, 1, 1, 128, 4224, 4224));
  check_backward(softmax_fixed(DType::kBFloat16, 1, 2, 2, 128, 113, 300));
  check_backward(softmax_fixed(DType::kBFloat16, 1, 2, 2, 128, 257, 97));
}

TEST_F(Sm90Backward, Float16) {
  check_backward(softmax_fixed(DType::kFloat16, 2, 2, 2, 128, 333, 333));
  CaseConfig cfg = softmax_fixed(DType::kFloat16, 1, 2, 2, 128, 200, 457);
  cfg.causal = true;
  check_backward(cfg);
}

TEST_F(Sm90Backward, HeadDimsBelowBucket) {
  check_backward(softmax_fixed(DType::kBFloat16, 2, 2, 2, 64, 130, 200));
  check_backward(softmax_fixed(DType::kBFloat16, 1, 2, 2, 72, 129, 129));
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 96, 177, 177);
  cfg.causal = true;
  check_backward(cfg);
}

TEST_F(Sm90Backward, HeadDim64) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 2, 2, 64, 1023, 1023);
  cfg.causal = true;
  check_backward(cfg);
  check_backward(softmax_fixed(DType::kFloat16, 1, 6, 2, 64, 200, 333));
  cfg = softmax_varlen(DType::kFloat16, {0, 113, 1, 0, 300, 64}, {5, 113, 0, 0, 257, 200}, 2, 1, 64);
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 64, 300, 300);
  cfg.softcap = 5.0f;
  cfg.softmax_scale = 0.3f;
  cfg.window_left = 40;
  cfg.window_right = 0;
  check_backward(cfg);
}

TEST_F(Sm90Backward, CausalWindowSoftcap) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 2, 2, 128, 333, 333);
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 128, 200, 457);  // causal with s_q < s_k (bottom-right aligned)
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 128, 457, 200);  // causal with s_q > s_k: rows without keys
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 128, 500, 500);
  cfg.window_left = 70;
  cfg.window_right = 33;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 128, 300, 300);
  cfg.softcap = 5.0f;
  cfg.softmax_scale = 0.3f;
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
}

TEST_F(Sm90Backward, Gqa) {
  check_backward(softmax_fixed(DType::kBFloat16, 2, 6, 2, 128, 200, 200));
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 8, 1, 128, 129, 257);
  cfg.causal = true;
  check_backward(cfg);
}

TEST_F(Sm90Backward, VarlenWithEmptySequences) {
  CaseConfig cfg = softmax_varlen(DType::kBFloat16, {0, 113, 1, 0, 300, 64}, {5, 113, 0, 0, 257, 200}, 3, 3, 128);
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
  cfg.heads_k = 1;
  check_backward(cfg);
}

TEST_F(Sm90Backward, LongCausalGqa) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 4, 2, 128, 1023, 1023);
  cfg.causal = true;
  check_backward(cfg);
}

}  // namespace
}  // namespace cuteattn::test
