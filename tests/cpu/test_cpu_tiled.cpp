// The tiled CPU backend (Backend::kCpu) against the float64 oracle (Backend::kCpuReference) for every feature
// combination, forward and backward, under the tolerance rule of test_util.h.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"

namespace cuteattn::test {
namespace {

constexpr DType kBf16 = DType::kBFloat16, kFp16 = DType::kFloat16, kFp32 = DType::kFloat32;

// The CPU suites scale HSTU scores by 1/sqrt(d).
CaseConfig hstu(DType dt, std::vector<int32_t> lens, int64_t h, int64_t d) {
  return hstu_varlen(dt, std::move(lens), h, d, /*causal=*/false, 1.0f / std::sqrt(static_cast<float>(d)));
}

std::vector<CaseConfig> cases() {
  std::vector<CaseConfig> v;
  // Softmax, fixed layout.
  v.push_back(softmax_fixed(kBf16, 2, 4, 4, 64, 128, 128));
  v.push_back(with(softmax_fixed(kFp16, 1, 4, 2, 64, 113, 113), [](CaseConfig& c) { c.causal = true; }));
  v.push_back(with(softmax_fixed(kFp32, 2, 8, 1, 32, 17, 33), [](CaseConfig& c) { c.causal = true; }));
  v.push_back(with(softmax_fixed(kBf16, 1, 4, 1, 64, 1, 77), [](CaseConfig& c) { c.causal = true; }));
  v.push_back(with(softmax_fixed(kBf16, 1, 2, 2, 64, 200, 150), [](CaseConfig& c) {  // rows that see no key
    c.causal = true;
    c.num_threads = 1;
  }));
  v.push_back(with(softmax_fixed(kFp16, 2, 4, 2, 64, 65, 90), [](CaseConfig& c) {
    c.window_left = 8;
    c.window_right = 8;
  }));
  v.push_back(with(softmax_fixed(kBf16, 1, 2, 2, 64, 300, 300), [](CaseConfig& c) {
    c.window_left = 32;
    c.window_right = 16;
  }));
  v.push_back(with(softmax_fixed(kBf16, 1, 2, 1, 32, 150, 140), [](CaseConfig& c) { c.window_left = 50; }));
  v.push_back(with(softmax_fixed(kFp32, 1, 2, 2, 64, 97, 97), [](CaseConfig& c) { c.window_right = 7; }));
  v.push_back(with(softmax_fixed(kBf16, 1, 4, 1, 64, 64, 64), [](CaseConfig& c) {  // causal + left window
    c.causal = true;
    c.window_left = 20;
  }));
  v.push_back(with(softmax_fixed(kFp16, 1, 4, 2, 64, 130, 130), [](CaseConfig& c) {
    c.causal = true;
    c.softcap = 3.0f;
    c.softmax_scale = 0.5f;
  }));
  v.push_back(with(softmax_fixed(kBf16, 2, 2, 2, 64, 70, 70), [](CaseConfig& c) {
    c.softcap = 5.0f;
    c.head_dim_v = 128;
  }));
  v.push_back(with(softmax_fixed(kFp32, 1, 2, 1, 96, 70, 81), [](CaseConfig& c) {
    c.head_dim_v = 40;
    c.causal = true;
    c.num_threads = 1;
  }));
  v.push_back(with(softmax_fixed(kBf16, 1, 2, 1, 256, 66, 66), [](CaseConfig& c) { c.causal = true; }));
  v.push_back(with(softmax_fixed(kBf16, 1, 1, 1, 64, 1023, 1023), [](CaseConfig& c) { c.causal = true; }));
  v.push_back(with(softmax_fixed(kFp32, 1, 8, 4, 16, 33, 29), [](CaseConfig& c) { c.head_dim_v = 8; }));
  // Softmax, varlen (zero-length sequences, q and k lengths that differ).
  v.push_back(with(softmax_varlen(kBf16, {0, 17, 113, 1, 64, 0}, {}, 4, 2, 64),
                   [](CaseConfig& c) { c.causal = true; }));
  v.push_back(softmax_varlen(kFp16, {5, 0, 100, 3}, {20, 7, 0, 130}, 2, 1, 64));
  v.push_back(with(softmax_varlen(kFp32, {5, 0, 100, 3}, {20, 7, 0, 130}, 8, 1, 32),
                   [](CaseConfig& c) { c.causal = true; }));
  v.push_back(with(softmax_varlen(kBf16, {90, 31, 70}, {90, 31, 140}, 4, 4, 64), [](CaseConfig& c) {
    c.window_left = 10;
    c.window_right = 3;
    c.softcap = 10.0f;
  }));
  // HSTU (jagged, h_k = h).
  v.push_back(with(hstu(kBf16, {0, 37, 120, 1}, 2, 64), [](CaseConfig& c) { c.causal = true; }));
  v.push_back(with(hstu(kFp16, {50, 0, 81}, 2, 32), [](CaseConfig& c) {
    c.rab_heads = 1;
    c.drab = true;
  }));
  v.push_back(with(hstu(kBf16, {40, 100, 7}, 2, 64), [](CaseConfig& c) {
    c.causal = true;
    c.rab_heads = 2;
    c.drab = true;
    c.num_contexts = {3, 0, 2};
  }));
  v.push_back(with(hstu(kBf16, {60, 100, 13}, 3, 64), [](CaseConfig& c) {
    c.causal = true;
    c.rab_heads = 1;
    c.drab = true;
    c.num_targets = {5, 30, 13};
  }));
  v.push_back(with(hstu(kFp32, {60, 100, 23}, 2, 32), [](CaseConfig& c) {
    c.causal = true;
    c.rab_heads = 2;
    c.drab = true;
    c.num_targets = {25, 30, 11};
    c.target_group_size = 11;
  }));
  v.push_back(with(hstu(kBf16, {150, 0, 77}, 2, 64), [](CaseConfig& c) {  // contexts + targets
    c.causal = true;
    c.rab_heads = 2;
    c.drab = true;
    c.num_contexts = {10, 0, 5};
    c.num_targets = {20, 0, 33};
    c.target_group_size = 4;
    c.head_dim_v = 32;
  }));
  v.push_back(with(hstu(kFp16, {130, 64, 9}, 2, 64), [](CaseConfig& c) {  // local window, no rab gradient
    c.causal = true;
    c.window_left = 20;
    c.rab_heads = 2;
    c.scaling_seqlen = 64.0f;
  }));
  v.push_back(with(hstu(kBf16, {140, 90, 0, 200}, 2, 32), [](CaseConfig& c) {  // contexts and targets at once
    c.causal = true;
    c.rab_heads = 1;
    c.drab = true;
    c.num_contexts = {70, 5, 0, 20};
    c.num_targets = {20, 11, 0, 64};
    c.target_group_size = 8;
  }));
  // Many targets: query tiles of target rows skip the key blocks of other targets (Mask::key_hole), and key
  // blocks of targets visit only their own rows (row_range).
  v.push_back(with(hstu(kBf16, {700, 0, 450}, 2, 32), [](CaseConfig& c) {
    c.causal = true;
    c.rab_heads = 2;
    c.drab = true;
    c.num_targets = {500, 0, 300};
  }));
  v.push_back(with(hstu(kFp16, {900, 520}, 1, 32), [](CaseConfig& c) {
    c.causal = true;
    c.rab_heads = 1;
    c.drab = true;
    c.num_contexts = {40, 7};
    c.num_targets = {600, 400};
    c.target_group_size = 37;
  }));
  v.push_back(with(hstu(kFp32, {70, 33}, 1, 16), [](CaseConfig& c) {
    c.window_left = 5;
    c.window_right = 9;
    c.alpha = 0.7f;
  }));
  return v;
}

class TiledVsOracle : public ::testing::TestWithParam<CaseConfig> {};
std::string case_name(const ::testing::TestParamInfo<CaseConfig>& info) {
  return case_test_name(info.param, info.index);
}

TEST_P(TiledVsOracle, ForwardAndBackward) {
  const CaseConfig& cfg = GetParam();
  SCOPED_TRACE(cfg.describe());
  Case ours = Case::make(cfg, test_seed());
  ASSERT_TRUE(run_forward(ours, Backend::kCpu));
  ASSERT_TRUE(run_backward(ours, Backend::kCpu));
  expect_matches(ours, make_references(ours, /*backward=*/true), /*backward=*/true);
}

INSTANTIATE_TEST_SUITE_P(Cases, TiledVsOracle, ::testing::ValuesIn(cases()), case_name);

// Small random problems mixing every option, fp32 so that the comparison is tight.
std::vector<CaseConfig> random_cases() {
  std::mt19937_64 rng(20261121);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::vector<CaseConfig> v;
  for (int t = 0; t < 40; ++t) {
    const bool is_hstu = t % 3 == 2;
    const int64_t b = pick(1, 3);
    std::vector<int32_t> lq, lk;
    for (int64_t i = 0; i < b; ++i) {
      lq.push_back(static_cast<int32_t>(pick(0, 150)));
      lk.push_back(is_hstu ? lq.back() : static_cast<int32_t>(pick(0, 150)));
    }
    const int64_t d = 8 * pick(1, 12);
    CaseConfig c = is_hstu ? hstu(kFp32, lq, pick(1, 3), d) : softmax_varlen(kFp32, lq, lk, 0, 0, d);
    if (!is_hstu) {
      c.heads_k = pick(1, 2);
      c.heads = c.heads_k * (int64_t{1} << pick(0, 3));
      if (pick(0, 3) == 0) c.softcap = 2.0f + pick(0, 20);
    }
    if (pick(0, 2) == 0) c.head_dim_v = 8 * pick(1, 12);
    c.causal = pick(0, 1) == 1;
    if (pick(0, 2) == 0) c.window_left = pick(0, 70);
    if (!c.causal && pick(0, 2) == 0) c.window_right = pick(0, 70);
    if (is_hstu) {
      c.rab_heads = pick(0, 1) ? (pick(0, 1) ? 1 : c.heads) : 0;
      c.drab = c.rab_heads > 0 && pick(0, 1) == 1;
      if (c.causal && c.window_left < 0) {  // contexts and targets need causal and no local window
        std::vector<int32_t> ctx, tgt;
        for (int32_t len : lq) {
          tgt.push_back(static_cast<int32_t>(pick(0, len / 2)));
          ctx.push_back(static_cast<int32_t>(pick(0, len - tgt.back())));
        }
        if (pick(0, 1)) c.num_targets = tgt;
        if (pick(0, 1)) c.num_contexts = ctx;
        if (!c.num_targets.empty()) c.target_group_size = pick(1, 12);
      }
    }
    c.num_threads = static_cast<int>(pick(0, 3));
    v.push_back(c);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Random, TiledVsOracle, ::testing::ValuesIn(random_cases()), case_name);

}  // namespace
}  // namespace cuteattn::test
