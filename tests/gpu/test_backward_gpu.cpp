// GPU tests of the sm80 backward kernels (softmax and HSTU with dRab): dQ/dK/dV/dRab against the float64 CPU
// oracle under the FlashAttention tolerance rule, every output element written, every head-dim bucket, jagged
// batches of many short sequences, and the deterministic mode bit for bit (3 runs in several tests, 1000 runs in
// Deterministic1000Runs).
// The forward outputs the backward consumes (O, LSE) come from the CPU tiled backend unless a test says
// otherwise, so a failure here points at the backward kernels.
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cuteattn/attention.h"
#include "gpu/case_lists.h"
#include "gpu/device_case.h"

namespace cuteattn::test {
namespace {

void check_backward(const CaseConfig& cfg, bool deterministic = false, int repeats = 0,
                    ForwardOn fwd = ForwardOn::kCpu) {
  check_backward_on_device(cfg, Backend::kSm80, deterministic, repeats, fwd);
}

// ---- softmax ----

TEST(Sm80Backward, SoftmaxOddLengths) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t s : {1, 113, 1023}) check_backward(softmax_fixed(dt, 2, 2, 2, 64, s, s));
  }
  check_backward(softmax_fixed(DType::kBFloat16, 1, 2, 2, 128, 113, 300));
  check_backward(softmax_fixed(DType::kFloat16, 1, 2, 2, 128, 257, 97));
}

TEST(Sm80Backward, SoftmaxHeadDimBelowBucket) {
  check_backward(softmax_fixed(DType::kBFloat16, 2, 2, 2, 48, 130, 200));
  CaseConfig cfg = softmax_fixed(DType::kFloat16, 1, 2, 2, 128, 150, 150);
  cfg.head_dim_v = 64;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 72, 129, 129);
  cfg.head_dim_v = 104;
  check_backward(cfg);
}

TEST(Sm80Backward, SoftmaxCausalWindowSoftcap) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 2, 2, 64, 333, 333);
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kFloat16, 1, 2, 2, 128, 200, 457);  // causal with s_q < s_k (bottom-right aligned)
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kFloat16, 1, 2, 2, 128, 457, 200);  // causal with s_q > s_k: rows without keys
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 64, 500, 500);
  cfg.window_left = 70;
  cfg.window_right = 33;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 64, 300, 300);
  cfg.softcap = 5.0f;
  cfg.softmax_scale = 0.3f;
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
}

TEST(Sm80Backward, SoftmaxGqa) {
  check_backward(softmax_fixed(DType::kBFloat16, 2, 6, 2, 64, 200, 200));
  CaseConfig cfg = softmax_fixed(DType::kFloat16, 1, 8, 1, 128, 129, 257);
  cfg.causal = true;
  check_backward(cfg);
}

TEST(Sm80Backward, SoftmaxVarlenWithEmptySequences) {
  CaseConfig cfg = softmax_varlen(DType::kBFloat16, {0, 113, 1, 0, 300, 64}, {5, 113, 0, 0, 257, 200}, 3, 3, 64);
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
  cfg.heads_k = 1;
  check_backward(cfg);
}

// Many short sequences, lengths 1 .. kBlockM + 1 (kBlockM = 128 at d = 64, 64 at d = 128 and for HSTU): the dQ
// workspace gives each sequence whole query-block tiles starting at its own block, so every block boundary and
// every partial last block of a jagged batch is exercised.
TEST(Sm80Backward, VarlenShortSequences) {
  auto lengths = [](int32_t n) {
    std::vector<int32_t> l(n);
    for (int32_t i = 0; i < n; ++i) l[i] = i + 1;
    return l;
  };
  check_backward(softmax_varlen(DType::kBFloat16, lengths(129), {}, 2, 1, 64));
  CaseConfig cfg = softmax_varlen(DType::kFloat16, lengths(65), {}, 2, 2, 128);
  cfg.causal = true;
  check_backward(cfg);
  check_backward(cfg, /*deterministic=*/true, /*repeats=*/2);
  check_backward(hstu_varlen(DType::kBFloat16, lengths(65), 2, 64, true, 1.0f / 64));
}

TEST(Sm80Backward, SoftmaxDeterministic) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 4, 2, 64, 700, 700);
  check_backward(cfg, /*deterministic=*/true, /*repeats=*/2);
  cfg = softmax_fixed(DType::kFloat16, 1, 2, 2, 128, 1023, 1023);
  cfg.causal = true;
  check_backward(cfg, /*deterministic=*/true, /*repeats=*/2);
}

TEST(Sm80Backward, SoftmaxWithGpuForward) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 4, 2, 128, 515, 515);
  cfg.causal = true;
  check_backward(cfg, /*deterministic=*/false, /*repeats=*/0, ForwardOn::kGpu);
}

TEST(Sm80Backward, SoftmaxBuckets96And256) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 2, 2, 96, 177, 177);
  cfg.causal = true;
  check_backward(cfg);
  check_backward(softmax_fixed(DType::kFloat16, 1, 4, 2, 80, 211, 150));
  check_backward(softmax_fixed(DType::kFloat16, 1, 2, 2, 256, 130, 250));
  cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 200, 300, 300);
  cfg.causal = true;
  check_backward(cfg, /*deterministic=*/true, /*repeats=*/2);
}

// Long query-block walks at d = 64 and 256 (on sm90, d = 256 double-buffers Q/dO like d = 64 does everywhere):
// many steps, steps skipped by a window, the last block partial, rows without keys, GQA, varlen with empty
// sequences, the deterministic mode.
TEST(Sm80Backward, SoftmaxLongWalks) {
  for (int64_t d : {64, 256}) {
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      for (int64_t s : {1, 113, 1023}) check_backward(softmax_fixed(dt, 1, 2, 2, d, s, s));
    }
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 4, 2, d, 700, 900);  // causal with s_q < s_k
    cfg.causal = true;
    check_backward(cfg);
    cfg = softmax_fixed(DType::kFloat16, 1, 2, 2, d, 900, 600);  // causal with s_q > s_k: rows without keys
    cfg.causal = true;
    check_backward(cfg);
    cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, d, 1000, 1000);  // most query blocks skip each key block
    cfg.window_left = 150;
    cfg.window_right = 40;
    check_backward(cfg);
    cfg.softcap = 5.0f;
    cfg.softmax_scale = 0.3f;
    check_backward(cfg);
    cfg = softmax_varlen(DType::kBFloat16, {0, 513, 1, 700}, {3, 513, 0, 650}, 2, 1, d);
    cfg.causal = true;
    check_backward(cfg);
    cfg = softmax_fixed(DType::kBFloat16, 2, 2, 1, d, 777, 777);
    cfg.causal = true;
    check_backward(cfg, /*deterministic=*/true, /*repeats=*/2);
  }
}

// The buckets the tests above do not reach (32, 96, 192, 256).
TEST(Sm80Backward, EveryOtherBucket) {
  for (int64_t d : {32, 96, 192, 256}) {
    for (const CaseConfig& cfg : bucket_cases(d)) check_backward(cfg);
  }
}

// ---- HSTU ----

TEST(Sm80Backward, HstuCausalAndNoMask) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    CaseConfig cfg = hstu_varlen(dt, {113, 0, 1, 400}, 2, 64, true, 1.0f / 64);
    check_backward(cfg);
    cfg.causal = false;
    check_backward(cfg);
  }
  check_backward(hstu_varlen(DType::kBFloat16, {1023, 77}, 2, 128, true, 1.0f / 128));
}

// Cases with rab keep max_seqlen_k a multiple of 8: the checker wants 16-byte aligned rab rows.
TEST(Sm80Backward, HstuRabAndDrab) {
  for (int64_t rab_heads : {1, 2}) {
    CaseConfig cfg = hstu_varlen(DType::kBFloat16, {200, 0, 131}, 2, 64, true, 1.0f / 64);
    cfg.rab_heads = rab_heads;
    cfg.drab = true;
    check_backward(cfg);
    check_backward(cfg, /*deterministic=*/true, /*repeats=*/2);
    cfg.rab_heads = rab_heads;
    cfg.drab = false;
    check_backward(cfg);
  }
  CaseConfig cfg = hstu_varlen(DType::kFloat16, {304, 17}, 3, 128, true, 1.0f / 128);
  cfg.rab_heads = 1;
  cfg.drab = true;
  check_backward(cfg);
}

TEST(Sm80Backward, HstuBuckets96And256) {
  CaseConfig cfg = hstu_varlen(DType::kBFloat16, {200, 31, 0}, 2, 96, true, 1.0f / 96);
  cfg.rab_heads = 1;
  cfg.drab = true;
  check_backward(cfg);
  cfg = hstu_varlen(DType::kFloat16, {160, 97}, 2, 256, true, 1.0f / 256);
  cfg.rab_heads = 2;
  cfg.drab = true;
  check_backward(cfg, /*deterministic=*/true, /*repeats=*/2);
}

TEST(Sm80Backward, HstuContextTargetWindow) {
  CaseConfig cfg = hstu_varlen(DType::kBFloat16, {296, 45, 263}, 2, 64, true, 1.0f / 64);
  cfg.num_contexts = {20, 3, 0};
  cfg.num_targets = {17, 5, 40};
  cfg.target_group_size = 3;
  cfg.rab_heads = 2;
  cfg.drab = true;
  check_backward(cfg);
  cfg = hstu_varlen(DType::kFloat16, {333, 129}, 2, 128, true, 1.0f / 128);
  cfg.causal = false;
  cfg.window_left = 50;
  cfg.window_right = 20;
  check_backward(cfg);
}

// ---- determinism ----

// Small deterministic backwards run 1000 times each, every run bit-identical with the first: softmax GQA causal,
// HSTU with an h-head rab and dRab, and HSTU with a 1-head rab (dRab summed over the heads).
TEST(Sm80Backward, Deterministic1000Runs) {
  CaseConfig softmax = softmax_fixed(DType::kBFloat16, 2, 4, 2, 64, 257, 257);
  softmax.causal = true;
  check_backward(softmax, /*deterministic=*/true, /*repeats=*/999);
  for (int64_t rab_heads : {2, 1}) {
    CaseConfig hstu = hstu_varlen(DType::kBFloat16, {200, 0, 131}, 2, 64, true, 1.0f / 64);
    hstu.rab_heads = rab_heads;
    hstu.drab = true;
    hstu.num_targets = {17, 0, 9};
    hstu.target_group_size = 3;
    check_backward(hstu, /*deterministic=*/true, /*repeats=*/999);
  }
}

}  // namespace
}  // namespace cuteattn::test
