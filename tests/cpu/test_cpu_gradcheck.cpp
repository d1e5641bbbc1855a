// Finite-difference checks of the oracle's backward (Backend::kCpuReference) on tiny fp32 problems: the
// gradient of L = sum(O * dO) with respect to q, k, v (and rab) by central differences against dQ, dK, dV, dRab.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"

namespace cuteattn::test {
namespace {

double loss(Case& c) {
  c.poison_outputs();
  if (!run_forward(c, Backend::kCpuReference)) return NAN;
  double l = 0.0;
  for (int64_t e = 0; e < c.out.numel(); ++e) l += double(c.out.get(e)) * double(c.dout.get(e));
  return l;
}

// Central differences over every element of `input` against `grad` (computed by the oracle's backward).
void check_gradient(Case& c, HostTensor Case::*input, const HostTensor& grad, const char* name) {
  const float eps = 1e-2f;
  HostTensor& x = c.*input;
  double worst = 0.0;
  for (int64_t e = 0; e < x.numel(); ++e) {
    const float x0 = x.get(e);
    x.set(e, x0 + eps);
    const float hi = x.get(e);
    const double l_hi = loss(c);
    x.set(e, x0 - eps);
    const float lo = x.get(e);
    const double l_lo = loss(c);
    x.set(e, x0);
    const double fd = (l_hi - l_lo) / (double(hi) - double(lo));
    const double analytic = grad.get(e);
    const double err = std::fabs(fd - analytic);
    worst = std::max(worst, err);
    ASSERT_LE(err, 2e-3 * (1.0 + std::fabs(analytic))) << name << "[" << e << "]: finite difference " << fd
                                                       << ", backward " << analytic;
  }
  SUCCEED() << name << ": worst |fd - backward| " << worst;
}

void gradcheck(const CaseConfig& cfg) {
  SCOPED_TRACE(cfg.describe());
  Case c = Case::make(cfg, test_seed());
  ASSERT_TRUE(run_forward(c, Backend::kCpuReference));
  ASSERT_TRUE(run_backward(c, Backend::kCpuReference));
  const HostTensor dq = c.dq, dk = c.dk, dv = c.dv, drab = c.drab;
  check_gradient(c, &Case::q, dq, "dq");
  check_gradient(c, &Case::k, dk, "dk");
  check_gradient(c, &Case::v, dv, "dv");
  if (cfg.drab) check_gradient(c, &Case::rab, drab, "drab");
}

CaseConfig tiny_softmax() {
  return with(softmax_fixed(DType::kFloat32, 2, 4, 2, 4, 5, 7), [](CaseConfig& c) { c.head_dim_v = 3; });
}

CaseConfig tiny_hstu() {
  return with(hstu_varlen(DType::kFloat32, {6, 0, 9}, 2, 4, /*causal=*/true, 0.8f),
              [](CaseConfig& c) { c.head_dim_v = 3; });
}

TEST(OracleGradcheck, Softmax) { gradcheck(tiny_softmax()); }

TEST(OracleGradcheck, SoftmaxCausal) {
  CaseConfig c = tiny_softmax();
  c.causal = true;
  gradcheck(c);
}

TEST(OracleGradcheck, SoftmaxSoftcapWindow) {
  CaseConfig c = tiny_softmax();
  c.softcap = 1.5f;
  c.window_left = 2;
  c.window_right = 1;
  gradcheck(c);
}

TEST(OracleGradcheck, SoftmaxVarlen) {
  CaseConfig c = tiny_softmax();
  c.seqlens_q = {3, 0, 6};
  c.seqlens_k = {5, 2, 4};
  c.causal = true;
  gradcheck(c);
}

TEST(OracleGradcheck, HstuRabPerHead) {
  CaseConfig c = tiny_hstu();
  c.rab_heads = 2;
  c.drab = true;
  c.num_contexts = {2, 0, 1};
  gradcheck(c);
}

TEST(OracleGradcheck, HstuRabSharedTargets) {
  CaseConfig c = tiny_hstu();
  c.rab_heads = 1;
  c.drab = true;
  c.num_targets = {2, 0, 5};
  c.target_group_size = 2;
  gradcheck(c);
}

TEST(OracleGradcheck, HstuNoMaskNoRab) {
  CaseConfig c = tiny_hstu();
  c.causal = false;
  c.scaling_seqlen = 3.0f;
  gradcheck(c);
}

}  // namespace
}  // namespace cuteattn::test
