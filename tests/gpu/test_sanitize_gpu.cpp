// Tiny GPU cases for scripts/gpu-sanitize (compute-sanitizer memcheck, racecheck, synccheck): one small forward
// and one small backward of every kernel family and score function, each still checked against the float64
// oracle. They stay tiny because the sanitizers run instrumented kernels; the other suites cover the features.
// Sequences are jagged with an empty one and lengths that end inside a tile, so masked tails and partial tiles
// are exercised.
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cuteattn/attention.h"
#include "gpu/device_case.h"

namespace cuteattn::test {
namespace {

CaseConfig small_softmax(int64_t head_dim) {
  CaseConfig cfg = softmax_varlen(DType::kBFloat16, {0, 37, 70}, {5, 37, 131}, 2, 1, head_dim);
  cfg.causal = true;
  return cfg;
}

// max_seqlen_k 72 (16-byte rab rows) with sequences of at most 70 keys.
CaseConfig small_hstu(int64_t head_dim) {
  CaseConfig cfg = hstu_varlen(DType::kFloat16, {0, 45, 70}, 2, head_dim, /*causal=*/true, 0.1f);
  cfg.max_seqlen_k = 72;
  cfg.rab_heads = 1;
  cfg.drab = true;
  cfg.num_contexts = {0, 3, 5};
  cfg.num_targets = {0, 4, 9};
  cfg.target_group_size = 2;
  return cfg;
}

TEST(Sanitize, Sm80ForwardSoftmax) { check_forward_on_device(small_softmax(64), Backend::kSm80); }

// Both tiles of the d 256 bucket, whose warps leave the masked blocks their rows do not see
// (Sm80Forward.WarpsSkipHiddenBlocks): 64 x 64 up to 1024 keys, 128 x 64 with 8 warps past them.
TEST(Sanitize, Sm80ForwardSoftmaxD256) {
  check_forward_on_device(small_softmax(256), Backend::kSm80);
  CaseConfig long_keys = softmax_varlen(DType::kBFloat16, {0, 37, 70}, {5, 37, 1030}, 2, 1, 256);
  long_keys.causal = true;
  check_forward_on_device(long_keys, Backend::kSm80);
}

TEST(Sanitize, Sm80ForwardHstu) { check_forward_on_device(small_hstu(64), Backend::kSm80); }

TEST(Sanitize, Sm80BackwardSoftmax) { check_backward_on_device(small_softmax(64), Backend::kSm80); }

TEST(Sanitize, Sm80BackwardHstu) { check_backward_on_device(small_hstu(64), Backend::kSm80); }

TEST(Sanitize, Sm80BackwardDeterministic) {
  check_backward_on_device(small_hstu(64), Backend::kSm80, /*deterministic=*/true);
}

TEST(Sanitize, Sm80Fp32ForwardBackward) {
  CaseConfig cfg = small_softmax(64);
  cfg.dtype = DType::kFloat32;
  check_forward_on_device(cfg, Backend::kSm80);
  check_backward_on_device(cfg, Backend::kSm80, /*deterministic=*/false, /*repeats=*/0, ForwardOn::kGpu);
}

TEST(Sanitize, Sm90ForwardSoftmax) { check_forward_on_device(small_softmax(128), Backend::kSm90); }

TEST(Sanitize, Sm90ForwardHstu) {
  CaseConfig cfg = small_hstu(128);
  cfg.drab = false;
  check_forward_on_device(cfg, Backend::kSm90);
}

TEST(Sanitize, Sm90BackwardSoftmax) { check_backward_on_device(small_softmax(128), Backend::kSm90); }

TEST(Sanitize, Sm90BackwardHstu) { check_backward_on_device(small_hstu(128), Backend::kSm90); }

TEST(Sanitize, Sm90BackwardHstuDrabPerHead) {
  CaseConfig cfg = small_hstu(64);
  cfg.rab_heads = cfg.heads;
  check_backward_on_device(cfg, Backend::kSm90);
}

}  // namespace
}  // namespace cuteattn::test
