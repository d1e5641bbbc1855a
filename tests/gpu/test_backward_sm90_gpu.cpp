// GPU tests of the sm90 backward kernel (TMA + wgmma), softmax: dQ/dK/dV against the float64 CPU oracle under
// the FlashAttention gradient rule (3x the error of a plain bf16/fp16 computation), every output element written
// over a NaN poison, for odd lengths (1, 113, 1023, 4224), s_q != s_k, the d 64, d 128 and d 256 buckets and
// head dims below them, causal with s_q != s_k (rows without keys), sliding windows, softcap, GQA and varlen with
// empty sequences; d 64 (128-row query steps) with lengths across the step height; d 256 (64-key blocks, dK and
// dV split by columns, dQ by reductions from registers) over the same matrix. O and LSE come from the CPU tiled
// forward, so a failure points at the backward.
// HSTU (Sm90BackwardHstu): dQ/dK/dV/dRab under the HSTU rule (5x), jagged lengths with empty sequences, rab of
// 1 and h heads with and without dRab, contexts and targets, a window, d 96 in the d 128 bucket, and the calls
// the kernel refuses (deterministic, d != d_v) routed to the sm80 backward by auto dispatch. The wide mask and
// length matrix runs through the sm90 backward in test_hstu_matrix_gpu.cpp.
#include <cuda_runtime.h>

#include <string>
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

// d 64 runs 128-row query steps: lengths around and across the step (1, 65, 127, 129, 1023 vs 1, 113, 4224).
TEST_F(Sm90Backward, HeadDim64TallSteps) {
  for (int64_t sq : {1, 65, 127, 129, 1023})
    for (int64_t sk : {1, 113, 4224}) check_backward(softmax_fixed(DType::kBFloat16, 1, 2, 1, 64, sq, sk));
  for (int64_t sq : {65, 129, 1023}) {
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 64, sq, 4224);  // causal with s_q < s_k
    cfg.causal = true;
    check_backward(cfg);
  }
  for (int64_t sk : {1, 113}) {
    CaseConfig cfg = softmax_fixed(DType::kFloat16, 1, 2, 2, 64, 1023, sk);  // causal with s_q > s_k
    cfg.causal = true;
    check_backward(cfg);
  }
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 64, 1023, 1023);
  cfg.window_left = 200;
  cfg.window_right = 37;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 2, 8, 1, 64, 129, 257);  // GQA 8:1
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_varlen(DType::kBFloat16, {0, 129, 1, 0, 300, 127, 65}, {5, 113, 0, 0, 257, 200, 65}, 8, 1, 64);
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
  cfg.softcap = 5.0f;
  cfg.softmax_scale = 0.3f;
  check_backward(cfg);
}

// A small d 64 case (128-row steps, tail rows, GQA) for the sanitizers.
TEST_F(Sm90Backward, HeadDim64Sanitize) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 4, 2, 64, 193, 150);
  cfg.causal = true;
  check_backward(cfg);
}

// d 256: 64-row steps over 64-key blocks, lengths around and across both (1, 65, 127, 129, 1023 vs 1, 113, 4224).
// Not s_q 1023 with s_k 1 unmasked: dK is exactly 0 there (one key), the plain computation's dP - D cancels
// exactly (same summation order), ours leaves fp32 rounding of two 256-term dot products in different orders
// summed over 1023 rows (3.5e-5 against the 1e-5 atol); 1023 rows seeing one key causally are covered below.
TEST_F(Sm90Backward, HeadDim256) {
  for (int64_t sq : {1, 65, 127, 129, 1023}) {
    for (int64_t sk : {1, 113, 4224}) {
      CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 2, 1, 256, sq, sk);
      // One key: dS = P (dP - D) is zero in exact arithmetic and in the plain computation, ours keeps the fp32
      // rounding of dP (wgmma) against D (the dot-product pass), ~2e-6 a row at d 256, summed over 1023 rows
      // into dK (3.5e-5 measured): dK's atol 1e-4 there instead of 1e-5.
      if (sk == 1 && sq == 1023) cfg.dk_atol = 1e-4;
      check_backward(cfg);
    }
  }
}

TEST_F(Sm90Backward, HeadDim256Masks) {
  for (int64_t sq : {65, 129, 1023}) {
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 256, sq, 4224);  // causal with s_q < s_k
    cfg.causal = true;
    check_backward(cfg);
  }
  for (int64_t sk : {1, 113}) {
    CaseConfig cfg = softmax_fixed(DType::kFloat16, 1, 2, 2, 256, 1023, sk);  // causal with s_q > s_k
    cfg.causal = true;
    check_backward(cfg);
  }
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 256, 1023, 1023);
  cfg.window_left = 200;
  cfg.window_right = 37;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 256, 300, 300);
  cfg.softcap = 5.0f;
  cfg.softmax_scale = 0.3f;
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
}

TEST_F(Sm90Backward, HeadDim256GqaVarlen) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 8, 1, 256, 129, 257);  // GQA 8:1
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_varlen(DType::kBFloat16, {0, 129, 1, 0, 300, 127, 65}, {5, 113, 0, 0, 257, 200, 65}, 8, 1, 256);
  check_backward(cfg);
  cfg.causal = true;
  check_backward(cfg);
  cfg.softcap = 5.0f;
  cfg.softmax_scale = 0.3f;
  check_backward(cfg);
  cfg = softmax_varlen(DType::kFloat16, {0, 113, 1, 0, 300, 64}, {5, 113, 0, 0, 257, 200}, 3, 3, 256);
  cfg.causal = true;
  check_backward(cfg);
}

// Head dims below the d 256 bucket (columns past d: zero K, Q, dO columns, no dQ reductions there).
TEST_F(Sm90Backward, HeadDim256Narrower) {
  check_backward(softmax_fixed(DType::kBFloat16, 2, 2, 2, 192, 333, 200));
  CaseConfig cfg = softmax_fixed(DType::kFloat16, 1, 4, 2, 160, 257, 1023);
  cfg.causal = true;
  check_backward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 136, 129, 129);
  cfg.window_left = 30;
  cfg.window_right = 5;
  check_backward(cfg);
}

// A small d 256 case (tail rows and keys, GQA, causal) for the sanitizers.
TEST_F(Sm90Backward, HeadDim256Sanitize) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 4, 2, 256, 150, 193);
  cfg.causal = true;
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

// Few query blocks, many key blocks: the CTAs of all 32 key blocks bring their dQ to the same tiles at about the
// same time. Causal (bottom-right: every row sees nearly every key), the dQ tiles' claims, the waits for a tile's
// first store and the reduce-adds behind it race on every tile (sm90/dq_tiles_sm90.cuh); non-causal, the
// reduce-adds into the zero-filled accumulator. Two runs each, d 128 (64-row steps) and d 64 (128-row steps).
TEST_F(Sm90Backward, ManyKeyBlocksShareDqTiles) {
  for (int run = 0; run < 2; ++run) {
    for (bool causal : {true, false}) {
      auto set_causal = [causal](CaseConfig& c) { c.causal = causal; };
      check_backward(with(softmax_fixed(DType::kBFloat16, 1, 4, 4, 128, 100, 4096), set_causal));
      check_backward(with(softmax_fixed(DType::kBFloat16, 1, 2, 1, 64, 200, 4096), set_causal));
    }
    // Non-causal with s_q >= s_k: tracked tiles, each key block's walk starting at its diagonal query block.
    check_backward(softmax_fixed(DType::kBFloat16, 1, 4, 2, 128, 2047, 2047));
  }
}

class Sm90BackwardHstu : public Sm90Backward {};

// Jagged lengths with empty sequences and tile tails; max_seqlen_k a multiple of 8 (16-byte rab rows).
CaseConfig hstu_case(DType dtype, int64_t heads, int64_t head_dim, int64_t rab_heads, bool drab) {
  CaseConfig cfg = hstu_varlen(dtype, {0, 113, 1, 0, 600, 64, 257}, heads, head_dim, /*causal=*/true, 0.1f);
  cfg.max_seqlen_k = 600;
  cfg.rab_heads = rab_heads;
  cfg.drab = drab;
  return cfg;
}

TEST_F(Sm90BackwardHstu, RabAndDrab) {
  check_backward(hstu_case(DType::kBFloat16, 2, 128, 0, false));
  check_backward(hstu_case(DType::kBFloat16, 3, 128, 1, false));
  check_backward(hstu_case(DType::kBFloat16, 3, 128, 1, true));  // dRab of per-head tiles, summed after
  check_backward(hstu_case(DType::kBFloat16, 6, 128, 1, true));  // more heads: summed by fp32 atomics
  check_backward(hstu_case(DType::kBFloat16, 3, 128, 3, true));  // dRab per head (TMA store)
  check_backward(hstu_case(DType::kFloat16, 2, 128, 2, true));
  check_backward(hstu_case(DType::kFloat16, 1, 128, 1, true));   // one head: dRab stored straight
  check_backward(hstu_case(DType::kBFloat16, 2, 64, 1, true));
  check_backward(hstu_case(DType::kFloat16, 2, 64, 2, true));
  CaseConfig cfg = hstu_case(DType::kBFloat16, 2, 96, 2, true);  // d 96 in the d 128 bucket
  cfg.alpha = 1.0f;
  check_backward(cfg);
}

TEST_F(Sm90BackwardHstu, ContextsTargetsWindow) {
  CaseConfig cfg = hstu_case(DType::kBFloat16, 2, 128, 1, true);
  cfg.num_contexts = {0, 99, 1, 0, 333, 7, 0};
  cfg.num_targets = {0, 14, 0, 0, 257, 32, 1};
  cfg.target_group_size = 11;
  check_backward(cfg);
  cfg.target_group_size = 1;
  cfg.rab_heads = 2;
  check_backward(cfg);
  cfg.num_contexts.clear();
  cfg.alpha = 1.0f;
  check_backward(cfg);
  cfg = hstu_case(DType::kFloat16, 2, 128, 2, true);
  cfg.causal = false;
  check_backward(cfg);
  cfg.window_left = 70;
  cfg.window_right = 9;
  check_backward(cfg);
}

TEST_F(Sm90BackwardHstu, LongJagged) {
  CaseConfig cfg = hstu_varlen(DType::kBFloat16, {1500, 0, 1111, 1, 777}, 2, 128, /*causal=*/true, 0.1f);
  cfg.max_seqlen_k = 1504;
  cfg.rab_heads = 1;
  cfg.drab = true;
  cfg.num_contexts = {333, 0, 0, 0, 99};
  cfg.num_targets = {257, 0, 32, 1, 257};
  cfg.target_group_size = 11;
  check_backward(cfg);
}

// Non-causal: every key block of a sequence contributes to every dQ tile, all starting together (the race of
// Sm90Backward.ManyKeyBlocksShareDqTiles on jagged HSTU tiles, tails included).
TEST_F(Sm90BackwardHstu, NonCausalShareDqTiles) {
  for (int run = 0; run < 2; ++run) {
    CaseConfig cfg = hstu_varlen(DType::kBFloat16, {1200, 1, 700, 0, 77}, 2, 128, /*causal=*/false, 0.1f);
    cfg.max_seqlen_k = 1200;
    check_backward(cfg);
  }
}

// d 64 (64-row query steps, 128-key blocks): contexts, targets and a window with rab and dRab of 1 head (summed
// over heads) and of h heads (TMA store of the dS tile), sequences around the step and block sizes.
TEST_F(Sm90BackwardHstu, HeadDim64TallSteps) {
  CaseConfig cfg = hstu_varlen(DType::kBFloat16, {1023, 0, 129, 1, 127, 65, 600}, 3, 64, /*causal=*/true, 0.1f);
  cfg.max_seqlen_k = 1024;
  cfg.rab_heads = 1;
  cfg.drab = true;
  cfg.num_contexts = {333, 0, 7, 0, 0, 64, 99};
  cfg.num_targets = {257, 0, 14, 1, 0, 1, 32};
  cfg.target_group_size = 11;
  check_backward(cfg);
  cfg.rab_heads = 3;
  check_backward(cfg);
  cfg.num_contexts.clear();
  cfg.target_group_size = 1;
  cfg.dtype = DType::kFloat16;
  check_backward(cfg);
  cfg.num_targets.clear();
  cfg.rab_heads = 0;
  cfg.drab = false;
  cfg.causal = false;
  cfg.window_left = 70;
  cfg.window_right = 9;
  check_backward(cfg);
}

// A small HSTU d 64 case with rab and per-head dRab for the sanitizers.
TEST_F(Sm90BackwardHstu, HeadDim64Sanitize) {
  CaseConfig cfg = hstu_varlen(DType::kBFloat16, {200, 0, 129}, 2, 64, /*causal=*/true, 0.1f);
  cfg.max_seqlen_k = 200;
  cfg.rab_heads = 2;
  cfg.drab = true;
  cfg.num_targets = {14, 0, 1};
  check_backward(cfg);
}

// Deterministic calls and d != d_v are not the sm90 kernel's: forced they are refused, auto runs them on sm80.
TEST_F(Sm90BackwardHstu, RefusedCallsFallBack) {
  auto refused_by_sm90 = [](const CaseConfig& cfg, bool deterministic) {
    Case c = Case::make(cfg, test_seed());
    DeviceCase dc(c, Backend::kSm90, DeviceCase::Pass::kBackward);
    const Status s = attention_backward(dc.backward_args(deterministic));
    return !s.ok();
  };
  const CaseConfig plain = hstu_case(DType::kBFloat16, 2, 128, 1, true);
  EXPECT_TRUE(refused_by_sm90(plain, /*deterministic=*/true));
  check_backward_on_device(plain, Backend::kAuto, /*deterministic=*/true, /*repeats=*/1);
  CaseConfig narrow_v = plain;
  narrow_v.head_dim_v = 64;
  EXPECT_TRUE(refused_by_sm90(narrow_v, /*deterministic=*/false));
  check_backward_on_device(narrow_v, Backend::kAuto);
}

}  // namespace
}  // namespace cuteattn::test
