// Strided layouts: every q/k/v/out/dout/grad/rab tensor is a view with padded batch, row and head strides.
// Padding of inputs holds NaN (so a stray read shows up), padding of outputs a sentinel that must survive,
// and both CPU backends must give results bit-identical to the same call on contiguous tensors.
#include <limits>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"

namespace cuteattn::test {
namespace {

constexpr float kSentinel = 4096.0f;  // exact in fp16, bf16 and fp32

// A copy of `t` inside a larger buffer: every dimension but the first grows by one, the last by 8.
struct Padded {
  HostTensor buffer;
  Tensor view;

  Padded(const HostTensor& t, float fill) {
    if (t.empty()) return;
    std::vector<int64_t> padded = t.shape;
    for (size_t d = 1; d < padded.size(); ++d) padded[d] += d + 1 == padded.size() ? 8 : 1;
    buffer = HostTensor(t.dtype, padded);
    for (int64_t e = 0; e < buffer.numel(); ++e) buffer.set(e, fill);
    view = buffer.view();
    for (int d = 0; d < view.rank; ++d) view.shape[d] = t.shape[d];
    for (int64_t e = 0; e < t.numel(); ++e) buffer.set(offset(e), t.get(e));
  }
  // Buffer index of logical (contiguous) element e.
  int64_t offset(int64_t e) const {
    int64_t off = 0;
    for (int d = view.rank - 1; d >= 0; --d) {
      off += (e % view.shape[d]) * view.stride[d];
      e /= view.shape[d];
    }
    return off;
  }
  HostTensor logical() const {
    if (buffer.empty()) return {};
    std::vector<int64_t> shape(view.shape, view.shape + view.rank);
    HostTensor t(buffer.dtype, shape);
    for (int64_t e = 0; e < t.numel(); ++e) t.set(e, buffer.get(offset(e)));
    return t;
  }
  // Every padding element still holds the sentinel.
  bool padding_intact() const {
    if (buffer.empty()) return true;
    std::vector<char> logical_elem(buffer.numel(), 0);
    int64_t n = 1;
    for (int d = 0; d < view.rank; ++d) n *= view.shape[d];
    for (int64_t e = 0; e < n; ++e) logical_elem[offset(e)] = 1;
    for (int64_t e = 0; e < buffer.numel(); ++e)
      if (!logical_elem[e] && buffer.get(e) != kSentinel) return false;
    return true;
  }
};

void check_layout(const CaseConfig& cfg, Backend backend) {
  SCOPED_TRACE(cfg.describe() + " backend " + backend_name(backend));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Case dense = Case::make(cfg, test_seed());
  ASSERT_TRUE(run_forward(dense, backend));
  ASSERT_TRUE(run_backward(dense, backend));

  Case c = dense.fresh_copy();
  Padded q(c.q, nan), k(c.k, nan), v(c.v, nan), rab(c.rab, nan), dout(c.dout, nan);
  Padded out(c.out, kSentinel), dq(c.dq, kSentinel), dk(c.dk, kSentinel), dv(c.dv, kSentinel),
      drab(c.drab, kSentinel);
  ForwardArgs fwd = c.forward_args(backend);
  fwd.problem.q = q.view;
  fwd.problem.k = k.view;
  fwd.problem.v = v.view;
  fwd.problem.rab = rab.view;
  fwd.out = out.view;
  const Status sf = attention_forward(fwd);
  ASSERT_TRUE(sf.ok()) << sf.message;
  EXPECT_TRUE(out.padding_intact());
  EXPECT_EQ(out.logical().bytes, dense.out.bytes) << "out";
  EXPECT_EQ(c.lse.bytes, dense.lse.bytes) << "lse";

  BackwardArgs bwd = c.backward_args(backend);
  bwd.problem = fwd.problem;
  if (cfg.score == ScoreFunction::kSoftmax) bwd.out = out.view;
  bwd.dout = dout.view;
  bwd.dq = dq.view;
  bwd.dk = dk.view;
  bwd.dv = dv.view;
  bwd.drab = drab.view;
  const Status sb = attention_backward(bwd);
  ASSERT_TRUE(sb.ok()) << sb.message;
  for (const auto& [name, padded, expected] :
       {std::tuple<const char*, const Padded*, const HostTensor*>{"dq", &dq, &dense.dq},
        {"dk", &dk, &dense.dk},
        {"dv", &dv, &dense.dv},
        {"drab", &drab, &dense.drab}}) {
    EXPECT_TRUE(padded->padding_intact()) << name;
    EXPECT_EQ(padded->logical().bytes, expected->bytes) << name;
  }
}

CaseConfig fixed_case() {
  return with(softmax_fixed(DType::kBFloat16, 2, 4, 2, 64, 70, 90), [](CaseConfig& c) {
    c.head_dim_v = 32;
    c.causal = true;
  });
}

CaseConfig varlen_case() {
  return with(softmax_varlen(DType::kFloat16, {33, 0, 80}, {40, 3, 80}, 2, 1, 32), [](CaseConfig& c) {
    c.window_left = 16;
    c.window_right = 4;
  });
}

CaseConfig hstu_case() {
  return with(hstu_varlen(DType::kBFloat16, {50, 0, 77}, 2, 32, /*causal=*/true, 0.2f), [](CaseConfig& c) {
    c.rab_heads = 2;
    c.drab = true;
    c.num_contexts = {4, 0, 6};
    c.num_targets = {10, 0, 7};
    c.target_group_size = 2;
  });
}

TEST(StridedLayout, SoftmaxFixedTiled) { check_layout(fixed_case(), Backend::kCpu); }
TEST(StridedLayout, SoftmaxFixedReference) { check_layout(fixed_case(), Backend::kCpuReference); }
TEST(StridedLayout, SoftmaxVarlenTiled) { check_layout(varlen_case(), Backend::kCpu); }
TEST(StridedLayout, SoftmaxVarlenReference) { check_layout(varlen_case(), Backend::kCpuReference); }
TEST(StridedLayout, HstuTiled) { check_layout(hstu_case(), Backend::kCpu); }
TEST(StridedLayout, HstuReference) { check_layout(hstu_case(), Backend::kCpuReference); }

}  // namespace
}  // namespace cuteattn::test
