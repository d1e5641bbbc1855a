// The shared GPU case lists (case_lists.h).
#include "gpu/case_lists.h"

namespace cuteattn::test {

std::vector<CaseConfig> bucket_cases(int64_t head_dim) {
  std::vector<CaseConfig> cases;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (bool causal : {false, true}) {
      const bool gqa = dt == DType::kFloat16 && causal;
      CaseConfig cfg = softmax_fixed(dt, 2, gqa ? 4 : 2, gqa ? 1 : 2, head_dim, 113, 177);
      cfg.causal = causal;
      cases.push_back(cfg);
    }
  }
  CaseConfig cfg = softmax_varlen(DType::kBFloat16, {0, 77, 1, 130}, {9, 77, 0, 200}, 2, 2, head_dim);
  cfg.causal = true;
  cases.push_back(cfg);
  // 152 keys: rab rows start on 16-byte boundaries (checked).
  CaseConfig hstu = hstu_varlen(DType::kFloat16, {152, 0, 61}, 2, head_dim, true, 1.0f / float(head_dim));
  hstu.rab_heads = 1;
  hstu.drab = true;
  hstu.num_targets = {20, 0, 7};
  hstu.target_group_size = 4;
  cases.push_back(hstu);
  return cases;
}

std::vector<CaseConfig> key_block_edge_cases(int64_t head_dim) {
  std::vector<CaseConfig> cases;
  const int64_t lengths[][2] = {{337, 337}, {161, 419}, {419, 161}};
  for (bool causal : {false, true}) {
    for (const auto& len : lengths) {
      CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 2, 1, head_dim, len[0], len[1]);
      cfg.causal = causal;
      cases.push_back(cfg);
    }
  }
  CaseConfig cfg = softmax_fixed(DType::kFloat16, 1, 1, 1, head_dim, 419, 419);
  cfg.window_left = 81;
  cfg.window_right = 47;
  cases.push_back(cfg);
  cfg = softmax_varlen(DType::kBFloat16, {0, 80, 112, 1, 255}, {}, 2, 2, head_dim);
  cfg.causal = true;
  cases.push_back(cfg);
  return cases;
}

std::vector<CaseConfig> hstu_window_cases() {
  // rab rows are max_seqlen_k long and must start on 16-byte boundaries (checked), hence max = 304.
  CaseConfig cfg = hstu_varlen(DType::kBFloat16, {304, 17, 129, 0}, 2, 128, /*causal=*/false, 1.0f / 128);
  cfg.rab_heads = 2;
  std::vector<CaseConfig> cases = {cfg};
  for (auto [left, right] : {std::pair{40, 0}, std::pair{40, 25}, std::pair{-1, 130}}) {
    cfg.window_left = left;
    cfg.window_right = right;
    cases.push_back(cfg);
  }
  cases.back().rab_heads = 0;
  return cases;
}

std::vector<CaseConfig> hstu_context_target_cases() {
  std::vector<CaseConfig> cases;
  for (int64_t group : {1, 3, 8, 128}) {
    CaseConfig cfg = hstu_varlen(DType::kBFloat16, {301, 0, 257, 40, 1016, 1}, 2, 128, true, 1.0f / 128);
    cfg.num_contexts = {5, 0, 64, 3, 100, 0};
    cfg.num_targets = {20, 0, 17, 0, 300, 1};
    cfg.target_group_size = group;
    cfg.rab_heads = group == 3 ? 2 : 1;
    cases.push_back(cfg);
  }
  CaseConfig cfg = hstu_varlen(DType::kFloat16, {304, 129}, 2, 64, true, 1.0f / 64);
  cfg.num_targets = {35, 128};
  cfg.target_group_size = 4;
  cases.push_back(cfg);
  cfg.num_targets.clear();
  cfg.target_group_size = 1;
  cfg.num_contexts = {303, 1};
  cfg.rab_heads = 2;
  cases.push_back(cfg);
  return cases;
}

}  // namespace cuteattn::test
