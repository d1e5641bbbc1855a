// The tiled backend is deterministic: repeated runs and runs with different thread counts give bit-identical
// outputs and gradients (the backward owns every output element in exactly one work item).
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"

namespace cuteattn::test {
namespace {

bool same_bits(const HostTensor& a, const HostTensor& b) { return a.bytes == b.bytes; }

void check_deterministic(CaseConfig cfg) {
  SCOPED_TRACE(cfg.describe());
  const Case base = Case::make(cfg, test_seed());
  Case first;
  for (int threads : {1, 2, 3, 5, 2}) {
    SCOPED_TRACE("num_threads " + std::to_string(threads));
    Case c = base.fresh_copy();
    c.cfg.num_threads = threads;
    ASSERT_TRUE(run_forward(c, Backend::kCpu));
    BackwardArgs args = c.backward_args(Backend::kCpu);
    args.deterministic = true;
    const Status s = attention_backward(args);
    ASSERT_TRUE(s.ok()) << s.message;
    if (first.q.empty()) {
      first = c;
      continue;
    }
    EXPECT_TRUE(same_bits(c.out, first.out)) << "out";
    EXPECT_TRUE(same_bits(c.lse, first.lse)) << "lse";
    EXPECT_TRUE(same_bits(c.dq, first.dq)) << "dq";
    EXPECT_TRUE(same_bits(c.dk, first.dk)) << "dk";
    EXPECT_TRUE(same_bits(c.dv, first.dv)) << "dv";
    EXPECT_TRUE(same_bits(c.drab, first.drab)) << "drab";
  }
  EXPECT_EQ(count_nan(first.dq) + count_nan(first.dk) + count_nan(first.dv) + count_nan(first.drab), 0);
}

TEST(TiledDeterminism, SoftmaxGqaVarlen) {
  CaseConfig c = softmax_varlen(DType::kBFloat16, {130, 0, 257, 64}, {200, 5, 257, 1}, 8, 2, 64);
  c.causal = true;
  check_deterministic(c);
}

TEST(TiledDeterminism, SoftmaxFixedWindowSoftcap) {
  CaseConfig c = softmax_fixed(DType::kFloat32, 2, 4, 4, 32, 300, 300);
  c.window_left = 70;
  c.window_right = 20;
  c.softcap = 8.0f;
  check_deterministic(c);
}

TEST(TiledDeterminism, HstuSharedRabGradient) {
  CaseConfig c = hstu_varlen(DType::kBFloat16, {200, 0, 129}, 4, 64, /*causal=*/true, 0.125f);
  c.rab_heads = 1;
  c.drab = true;
  c.num_targets = {20, 0, 9};
  c.target_group_size = 3;
  check_deterministic(c);
}

}  // namespace
}  // namespace cuteattn::test
