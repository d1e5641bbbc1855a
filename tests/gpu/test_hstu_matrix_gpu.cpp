// The HSTU matrix on the GPU: a covering design over max lengths, contexts, targets, group sizes, alpha, rab
// (none, 1 head, h heads; with and without dRab), head dims and dtypes. Each row runs the forward with
// Backend::kSm80 and Backend::kAuto and the backward with Backend::kSm80 (and Backend::kSm90 on a Hopper GPU)
// on random jagged lengths (a
// zero-length sequence in every row), all against the float64 oracle (out 2x, dQ/dK/dV/dRab 5x the error of
// the plain low-precision computation), every output element written over a NaN poison.
//
// Design: 32 rows, one per (lengths, contexts) pair; targets = (l + c) % 4 and rab = (l + 2c) % 3 of the
// value indices l, c make every pair of {lengths, contexts, targets, rab} appear (HstuMatrixDesign.CoversEveryPair
// checks it). Per sequence the counts are clipped to its length (targets first on the
// longest sequence, contexts first on the second), so every row runs; rows whose counts cannot fit their
// longest sequence also check that the unclipped counts are refused. With rab, rows whose max_seqlen_k is not
// a multiple of 8 (16-byte rab rows) check that refusal, then run with max_seqlen_k padded to a multiple of 8;
// rows with max_seqlen_q < max_seqlen_k check that a sequence with more queries than keys is refused with rab.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cuteattn/attention.h"
#include "gpu/device_case.h"

namespace cuteattn::test {
namespace {

struct MaxLengths {
  int32_t q, k;
};
constexpr MaxLengths kLengths[] = {{32, 32}, {99, 99}, {256, 256}, {1111, 1111},
                                   {27, 32}, {8, 99},  {51, 256},  {160, 2000}};
constexpr int32_t kContexts[] = {0, 99, 160, 333};
constexpr int32_t kTargets[] = {0, 32, 257, 1024};
constexpr int64_t kGroupSizes[] = {1, 11, 222};
constexpr float kAlphas[] = {1.0f, 0.1f};
enum class Rab { kNone, kOneHead, kAllHeads };
constexpr Rab kRabs[] = {Rab::kNone, Rab::kOneHead, Rab::kAllHeads};
constexpr int64_t kHeads = 2;

struct Row {
  int index;
  int l, c, t, r;  // value indices into kLengths, kContexts, kTargets, kRabs
  int64_t group_size, head_dim;
  float alpha;
  bool drab;
  DType dtype;
};

std::vector<Row> design() {
  std::vector<Row> rows;
  int t_rows = 0;  // rows with targets so far: the group sizes take turns among them
  for (int l = 0; l < 8; ++l) {
    for (int c = 0; c < 4; ++c) {
      Row row;
      row.index = static_cast<int>(rows.size());
      row.l = l;
      row.c = c;
      row.t = (l + c) % 4;
      row.r = (l + 2 * c) % 3;
      row.group_size = kTargets[row.t] > 0 ? kGroupSizes[t_rows++ % 3] : 1;
      row.alpha = kAlphas[(c + c / 2 + l) % 2];
      row.drab = kRabs[row.r] != Rab::kNone && (c + l) % 2 == 0;
      row.head_dim = (c / 2 + l) % 2 ? 128 : 64;
      row.dtype = (c + l / 4) % 2 ? DType::kFloat16 : DType::kBFloat16;
      rows.push_back(row);
    }
  }
  return rows;
}

int32_t pick(std::mt19937& rng, int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); }

int64_t round_up8(int64_t x) { return (x + 7) / 8 * 8; }

// The accepted configuration of a row. Sequences: (max_q, max_k), an empty one, a random one, and a fourth
// that, in rows without rab where max_q < max_k, has more queries than keys (legal without rab).
CaseConfig row_config(const Row& row) {
  const MaxLengths m = kLengths[row.l];
  const int32_t C = kContexts[row.c], T = kTargets[row.t];
  const Rab rab = kRabs[row.r];
  std::mt19937 rng(1000 + row.index);
  std::vector<int32_t> lq = {m.q, 0}, lk = {m.k, 0};
  const int32_t k2 = pick(rng, 1, m.k);
  lk.push_back(k2);
  lq.push_back(m.q == m.k ? k2 : pick(rng, 1, std::min(m.q, k2)));
  if (rab == Rab::kNone && m.q < m.k) {
    lq.push_back(m.q);
    lk.push_back(pick(rng, 1, m.q - 1));
  } else {
    const int32_t k3 = pick(rng, 1, std::min<int32_t>(m.k, 256));
    lk.push_back(k3);
    lq.push_back(m.q == m.k ? k3 : pick(rng, 1, std::min(m.q, k3)));
  }

  CaseConfig cfg = hstu_varlen(row.dtype, lq, kHeads, row.head_dim, /*causal=*/true, row.alpha);
  cfg.seqlens_k = lk;
  if (C == 0 && T == 0) {  // the two rows without contexts or targets: no mask, and a local window
    cfg.causal = false;
    if (m.q != m.k) {
      cfg.window_left = 7;
      cfg.window_right = 2;
    }
  } else {
    std::vector<int32_t> ctx(lk.size()), tgt(lk.size());
    for (size_t i = 0; i < lk.size(); ++i) {
      if (i == 0) {
        tgt[i] = std::min(T, lk[i]);
        ctx[i] = std::min(C, lk[i] - tgt[i]);
      } else if (i == 2) {
        ctx[i] = std::min(C, lk[i]);
        tgt[i] = std::min(T, lk[i] - ctx[i]);
      } else {
        tgt[i] = pick(rng, 0, std::min(T, lk[i]));
        ctx[i] = pick(rng, 0, std::min(C, lk[i] - tgt[i]));
      }
    }
    if (C > 0) cfg.num_contexts = ctx;
    if (T > 0) {
      cfg.num_targets = tgt;
      cfg.target_group_size = row.group_size;
    }
  }
  if (rab != Rab::kNone) {
    cfg.rab_heads = rab == Rab::kOneHead ? 1 : kHeads;
    cfg.drab = row.drab;
    cfg.max_seqlen_k = round_up8(m.k);  // 16-byte rab rows for 16-bit types
  }
  return cfg;
}

std::string row_name(const Row& row) {
  const MaxLengths m = kLengths[row.l];
  const char* rab[] = {"none", "1", "h"};
  char alpha[16];
  std::snprintf(alpha, sizeof alpha, "%g", row.alpha);
  std::string a = alpha;
  std::replace(a.begin(), a.end(), '.', 'p');
  return "L" + std::to_string(m.q) + "x" + std::to_string(m.k) + "_C" + std::to_string(kContexts[row.c]) + "_T" +
         std::to_string(kTargets[row.t]) + "_G" + std::to_string(row.group_size) + "_rab" + rab[row.r] +
         (row.drab ? "drab" : "") + "_a" + a + "_d" + std::to_string(row.head_dim) + "_" + dtype_name(row.dtype);
}

void PrintTo(const Row& row, std::ostream* os) { *os << row_name(row); }

bool named(const Status& s, const std::string& argument) {
  return s.code == StatusCode::kInvalidArgument && s.message.rfind(argument + ":", 0) == 0;
}

// Forward (kSm80, kAuto) and backward (kSm80) must refuse `cfg` with an error naming `argument`, writing nothing.
void expect_refused(const CaseConfig& cfg, const std::string& argument) {
  SCOPED_TRACE("expected refusal naming " + argument + ": " + cfg.describe());
  Case c = Case::make(cfg, test_seed());
  DeviceCase dc(c, Backend::kSm80, DeviceCase::Pass::kBackward);
  for (Backend backend : {Backend::kSm80, Backend::kAuto}) {
    ForwardArgs args = dc.forward_args();
    args.problem.backend = backend;
    const Status s = attention_forward(args);
    EXPECT_TRUE(named(s, argument)) << backend_name(backend) << " forward: " << (s.ok() ? "accepted" : s.message);
  }
  const Status s = attention_backward(dc.backward_args(/*deterministic=*/false));
  EXPECT_TRUE(named(s, argument)) << "sm80 backward: " << (s.ok() ? "accepted" : s.message);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dc.download_forward();
  dc.download_gradients();
  for (const HostTensor* t : {&c.out, &c.dq, &c.dk, &c.dv, &c.drab}) {
    EXPECT_EQ(count_nan(*t), t->numel()) << "a refused call wrote an output";
  }
}

// The refusals a row implies (see the file comment).
void check_refusals(const Row& row, const CaseConfig& accepted) {
  const MaxLengths m = kLengths[row.l];
  const int32_t C = kContexts[row.c], T = kTargets[row.t];
  if (C + T > m.k) {
    CaseConfig cfg = accepted;
    cfg.num_contexts.assign(cfg.seqlens_q.size(), 0);
    cfg.num_targets.assign(cfg.seqlens_q.size(), 0);
    cfg.num_contexts[0] = C;
    cfg.num_targets[0] = T;
    cfg.target_group_size = row.group_size;
    expect_refused(cfg, T > m.k ? "num_targets" : "num_contexts");
  }
  if (accepted.rab_heads == 0) return;
  if (m.k % 8 != 0) {
    CaseConfig cfg = accepted;
    cfg.max_seqlen_k = 0;
    expect_refused(cfg, "rab");
  }
  if (m.q < m.k) {
    CaseConfig cfg = accepted;
    cfg.seqlens_q.back() = m.q;
    cfg.seqlens_k.back() = m.q - 1;
    if (!cfg.num_contexts.empty()) cfg.num_contexts.back() = 0;
    if (!cfg.num_targets.empty()) cfg.num_targets.back() = 0;
    expect_refused(cfg, "rab");
  }
}

class HstuMatrix : public ::testing::TestWithParam<Row> {};

TEST_P(HstuMatrix, ForwardAndBackward) {
  const Row& row = GetParam();
  const CaseConfig cfg = row_config(row);
  SCOPED_TRACE(cfg.describe());
  check_refusals(row, cfg);

  Case c = Case::make(cfg, test_seed());
  const References refs = make_references(c, /*backward=*/true);
  DeviceCase dc(c, Backend::kSm80, DeviceCase::Pass::kBackward);
  for (Backend backend : {Backend::kSm80, Backend::kAuto}) {
    ForwardArgs args = dc.forward_args();
    args.problem.backend = backend;
    Backend chosen = backend;
    ASSERT_TRUE(resolve_backend(args, &chosen).ok());
    SCOPED_TRACE(std::string("forward ") + backend_name(backend) + " -> " + backend_name(chosen));
    dc.poison_forward();
    const Status s = attention_forward(args);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dc.download_forward();
    EXPECT_TRUE(check_close("out", c.out, refs.plain.out, refs.ref.out, kForwardFactor));
  }
  std::vector<Backend> backward_backends = {Backend::kSm80};
  if (is_hopper()) backward_backends.push_back(Backend::kSm90);
  for (Backend backend : backward_backends) {
    SCOPED_TRACE(std::string("backward ") + backend_name(backend));
    BackwardArgs args = dc.backward_args(/*deterministic=*/false);
    args.problem.backend = backend;
    dc.poison_gradients();
    const Status s = attention_backward(args);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dc.download_gradients();
    EXPECT_TRUE(check_close("dq", c.dq, refs.plain.dq, refs.ref.dq, kHstuFactor));
    EXPECT_TRUE(check_close("dk", c.dk, refs.plain.dk, refs.ref.dk, kHstuFactor));
    EXPECT_TRUE(check_close("dv", c.dv, refs.plain.dv, refs.ref.dv, kHstuFactor));
    if (cfg.drab) {
      EXPECT_TRUE(check_close("drab", c.drab, refs.plain.drab, refs.ref.drab, kHstuFactor));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, HstuMatrix, ::testing::ValuesIn(design()),
                         [](const ::testing::TestParamInfo<Row>& info) { return row_name(info.param); });

// Host-only: the design covers every value of every axis and every pair of {lengths, contexts, targets, rab}.
TEST(HstuMatrixDesign, CoversEveryPair) {
  const std::vector<Row> rows = design();
  auto axis = [](const Row& row, int a) { return a == 0 ? row.l : a == 1 ? row.c : a == 2 ? row.t : row.r; };
  const int sizes[] = {8, 4, 4, 3};
  for (int a = 0; a < 4; ++a) {
    for (int b = a + 1; b < 4; ++b) {
      std::set<std::pair<int, int>> seen;
      for (const Row& row : rows) seen.insert({axis(row, a), axis(row, b)});
      EXPECT_EQ(static_cast<int>(seen.size()), sizes[a] * sizes[b]) << "axes " << a << " and " << b;
    }
  }
  std::set<int64_t> groups, dims;
  std::set<float> alphas;
  std::set<std::pair<int, bool>> rab_drab;
  std::set<DType> dtypes;
  for (const Row& row : rows) {
    if (kTargets[row.t] > 0) groups.insert(row.group_size);
    dims.insert(row.head_dim);
    alphas.insert(row.alpha);
    rab_drab.insert({row.r, row.drab});
    dtypes.insert(row.dtype);
  }
  EXPECT_EQ(groups.size(), 3u);
  EXPECT_EQ(dims.size(), 2u);
  EXPECT_EQ(alphas.size(), 2u);
  EXPECT_EQ(rab_drab.size(), 5u);  // no rab; 1 head and h heads, each with and without dRab
  EXPECT_EQ(dtypes.size(), 2u);
}

}  // namespace
}  // namespace cuteattn::test
