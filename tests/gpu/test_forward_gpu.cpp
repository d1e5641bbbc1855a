// GPU tests of the sm80 forward kernels (softmax with LSE, HSTU): output and LSE against the float64 CPU
// oracle under the FlashAttention tolerance rule (2x the error of the plain low-precision computation),
// every output element written over a NaN poison. Covers fixed and varlen layouts (zero-length
// sequences), odd lengths, GQA/MQA, causal, window, softcap, every head-dim bucket, head dims below their
// bucket, d != d_v, and every HSTU mask (causal, window, contextual, targets with group sizes) with and
// without rab.
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cuteattn/attention.h"
#include "gpu/case_lists.h"
#include "gpu/device_case.h"

namespace cuteattn::test {
namespace {

void check_forward(const CaseConfig& cfg) { check_forward_on_device(cfg, Backend::kSm80); }

// ---- softmax, fixed layout ----

TEST(Sm80Forward, SoftmaxHeadDimsAndDtypes) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t d : {64, 128}) {
      for (bool causal : {false, true}) {
        CaseConfig cfg = softmax_fixed(dt, 2, 3, 3, d, 113, 200);
        cfg.causal = causal;
        check_forward(cfg);
      }
    }
  }
}

TEST(Sm80Forward, SoftmaxOddLengths) {
  for (int64_t s : {1, 113, 1023}) {
    for (bool causal : {false, true}) {
      CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 128, s, s);
      cfg.causal = causal;
      check_forward(cfg);
    }
  }
}

TEST(Sm80Forward, SoftmaxLong4224) {
  for (bool causal : {false, true}) {
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 1, 1, 64, 4224, 4224);
    cfg.causal = causal;
    check_forward(cfg);
  }
}

// Causal is bottom-right aligned: with sq > sk the first sq - sk rows see no key (O = 0, LSE = -inf).
TEST(Sm80Forward, SoftmaxCausalUnequalLengths) {
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{113, 1023}, {1023, 113}, {1, 300}, {300, 1}}) {
    CaseConfig cfg = softmax_fixed(DType::kFloat16, 2, 2, 1, 64, sq, sk);
    cfg.causal = true;
    check_forward(cfg);
  }
}

TEST(Sm80Forward, SoftmaxGqa) {
  for (int64_t groups : {1, 2, 4, 8}) {
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 8, 8 / groups, 128, 257, 333);
    cfg.causal = groups % 2 == 0;
    check_forward(cfg);
  }
}

TEST(Sm80Forward, SoftmaxWindowAndSoftcap) {
  struct W {
    int64_t left, right;
    bool causal;
  };
  for (W w : {W{64, 32, false}, W{100, 0, true}, W{0, 0, false}, W{-1, 7, false}, W{300, -1, false}}) {
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 2, 2, 64, 500, 700);
    cfg.window_left = w.left;
    cfg.window_right = w.causal ? 0 : w.right;
    cfg.causal = w.causal;
    check_forward(cfg);
  }
  for (bool causal : {false, true}) {
    CaseConfig cfg = softmax_fixed(DType::kFloat16, 1, 4, 2, 128, 333, 333);
    cfg.softcap = 5.0f;
    cfg.softmax_scale = 0.3f;
    cfg.causal = causal;
    check_forward(cfg);
  }
}

// Head dims below their bucket (zero-padded columns) and d != d_v.
TEST(Sm80Forward, SoftmaxPartialHeadDims) {
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{48, 48}, {80, 80}, {112, 64}, {64, 128}, {8, 40}}) {
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 2, 1, d, 129, 190);
    cfg.head_dim_v = dv;
    cfg.causal = d == 80;
    check_forward(cfg);
  }
}

// 64-bit offsets: batch 1 of every tensor starts past element 2^31 (a batch stride just above 2^31),
// so any 32-bit index arithmetic in the kernel reads or writes the wrong place.
TEST(Sm80Forward, SoftmaxOffsetsBeyond2To31) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 2, 1, 64, 100, 150);
  cfg.causal = true;
  check_forward_on_device(cfg, Backend::kSm80, /*batch_stride=*/(int64_t{1} << 31) + 1024);
}

// The tiles of the 256 bucket: 128 x 64 with 8 warps (softmax not masked on the right or with more than 1024 keys,
// HSTU) and 64 x 64 with 4 warps (softmax masked on the right with at most 1024 keys: Sm80Forward::short_masked_rows).
TEST(Sm80Forward, HeadDim256) {
  for (bool causal : {false, true}) {
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 2, 1, 256, 200, 333);
    cfg.causal = causal;
    check_forward(cfg);
  }
  CaseConfig cfg = softmax_varlen(DType::kFloat16, {0, 129, 300}, {}, 2, 2, 256);
  cfg.causal = true;
  check_forward(cfg);

  CaseConfig hstu = hstu_varlen(DType::kBFloat16, {200, 57}, 2, 256, true, 1.0f / 256);
  hstu.rab_heads = 2;
  hstu.num_targets = {13, 5};
  hstu.target_group_size = 3;
  check_forward(hstu);
}

// The softmax tiles of 16-row warp slices (d 192, 256), whose warps leave a masked block none of their 16 rows
// sees (the upper part of a causal diagonal, blocks past either edge of a window), and the same with softcap. At
// d 256 the masked cases up to 1024 keys run the 64-row tile, and those past 1024 keys the 128-row one.
TEST(Sm80Forward, WarpsSkipHiddenBlocks) {
  for (int64_t d : {192, 256}) {
    for (const CaseConfig& cfg : key_block_edge_cases(d)) check_forward(cfg);
    CaseConfig softcap = softmax_fixed(DType::kFloat16, 1, 2, 2, d, 333, 333);
    softcap.softcap = 5.0f;
    softcap.window_left = 40;
    softcap.window_right = 0;
    softcap.causal = true;
    check_forward(softcap);
  }
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1100, 1100}, {161, 1201}}) {
    CaseConfig causal = softmax_fixed(DType::kBFloat16, 1, 2, 1, 256, sq, sk);
    causal.causal = true;
    check_forward(causal);
  }
  CaseConfig window = softmax_fixed(DType::kFloat16, 1, 2, 2, 256, 1300, 1300);
  window.window_left = 300;
  window.window_right = 61;
  check_forward(window);
}

// The buckets the tests above do not reach (32, 96, 192, 256).
TEST(Sm80Forward, EveryOtherBucket) {
  for (int64_t d : {32, 96, 192, 256}) {
    for (const CaseConfig& cfg : bucket_cases(d)) check_forward(cfg);
  }
}

// ---- softmax, varlen ----

TEST(Sm80Forward, SoftmaxVarlenWithEmptySequences) {
  for (bool causal : {false, true}) {
    for (int64_t d : {64, 128}) {
      CaseConfig cfg =
          softmax_varlen(DType::kBFloat16, {0, 113, 1, 500, 0, 257, 64}, {5, 113, 0, 700, 0, 257, 1}, 4, 2, d);
      cfg.causal = causal;
      check_forward(cfg);
    }
  }
  CaseConfig cfg = softmax_varlen(DType::kFloat16, {1023, 0, 129}, {}, 2, 2, 64);
  cfg.window_left = 50;
  cfg.window_right = 20;
  check_forward(cfg);
}

// ---- HSTU (jagged layout) ----

TEST(Sm80Forward, HstuCausalAndRab) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t d : {64, 128}) {
      for (int64_t rab_heads : {0, 1, 3}) {
        CaseConfig cfg = hstu_varlen(dt, {113, 0, 200, 1, 64}, 3, d, true, 1.0f / d);
        cfg.rab_heads = rab_heads;
        check_forward(cfg);
      }
    }
  }
}

TEST(Sm80Forward, HstuNoMaskAndWindow) {
  for (const CaseConfig& cfg : hstu_window_cases()) check_forward(cfg);
}

TEST(Sm80Forward, HstuContextAndTargets) {
  for (const CaseConfig& cfg : hstu_context_target_cases()) check_forward(cfg);
}

TEST(Sm80Forward, HstuLong4224) {
  CaseConfig cfg = hstu_varlen(DType::kBFloat16, {4224, 1023}, 1, 64, true, 1.0f / 64);
  cfg.rab_heads = 1;
  cfg.num_targets = {30, 10};
  cfg.target_group_size = 2;
  check_forward(cfg);
}

}  // namespace
}  // namespace cuteattn::test
