// Host-only test utilities (see test_util.h): host tensors, random cases, the plain low-precision computation
// and the tolerance rule.
#include "common/test_util.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include "core/params.h"
#include "cpu/cpu_backend.h"
#include "cpu/element_cpu.h"

namespace cuteattn::test {

using detail::cpu::load_element;
using detail::cpu::round_to;
using detail::cpu::store_element;

// ---- HostTensor ----

HostTensor::HostTensor(DType dt, std::vector<int64_t> sh) : dtype(dt), shape(std::move(sh)) {
  bytes.assign(static_cast<size_t>(numel()) * dtype_size(dtype), 0);
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return shape.empty() ? 0 : n;
}

Tensor HostTensor::view() {
  Tensor t;
  if (shape.empty()) return t;
  t.data = bytes.data();
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.stride[d] = stride;
    stride *= shape[d];
  }
  return t;
}

float HostTensor::get(int64_t i) const {
  if (dtype == DType::kInt32) return static_cast<float>(get_int(i));
  return load_element(bytes.data(), dtype, i);
}

void HostTensor::set(int64_t i, float value) {
  if (dtype == DType::kInt32) {
    const int32_t v = static_cast<int32_t>(value);
    std::memcpy(bytes.data() + 4 * i, &v, 4);
    return;
  }
  store_element(bytes.data(), dtype, i, value);
}

int32_t HostTensor::get_int(int64_t i) const {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

// ---- creation, conversion, poisoning, comparison ----

uint64_t test_seed() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "no-test";
  return std::hash<std::string>{}(name) ^ 0x5eedc0ffee123457ull;
}

HostTensor random_normal(DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng, float stddev) {
  HostTensor t(dtype, std::move(shape));
  std::normal_distribution<float> normal(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
  return t;
}

HostTensor int_tensor(const std::vector<int32_t>& values) {
  HostTensor t(DType::kInt32, {static_cast<int64_t>(values.size())});
  if (!values.empty()) std::memcpy(t.data(), values.data(), 4 * values.size());
  return t;
}

HostTensor cast(const HostTensor& t, DType dtype) {
  if (t.empty()) return {};
  HostTensor out(dtype, t.shape);
  for (int64_t i = 0; i < t.numel(); ++i) out.set(i, t.get(i));
  return out;
}

// All-ones bits are a NaN in fp16, bf16 and fp32 alike.
void poison(HostTensor& t) { std::fill(t.bytes.begin(), t.bytes.end(), static_cast<unsigned char>(0xff)); }

int64_t count_nan(const HostTensor& t) {
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += std::isnan(t.get(i)) ? 1 : 0;
  return n;
}

ErrorStats compare(const HostTensor& a, const HostTensor& b) {
  ErrorStats e;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    const double x = a.get(i), y = b.get(i);
    if (!std::isfinite(x) || !std::isfinite(y)) {
      if (!(x == y)) ++e.mismatched_nonfinite;
      continue;
    }
    const double diff = std::fabs(x - y);
    e.max_abs = std::max(e.max_abs, diff);
    e.max_rel = std::max(e.max_rel, diff / std::max(std::fabs(y), 1e-6));
    e.max_ref = std::max(e.max_ref, std::fabs(y));
  }
  return e;
}

::testing::AssertionResult check_close(const std::string& what, const HostTensor& ours, const HostTensor& plain,
                                       const HostTensor& ref, double factor, double atol) {
  if (ours.shape != ref.shape || plain.shape != ref.shape)
    return ::testing::AssertionFailure() << what << ": shapes differ";
  const int64_t unwritten = count_nan(ours);
  const ErrorStats e_ours = compare(ours, ref), e_plain = compare(plain, ref);
  if (atol < 0.0) atol = 1e-5 * std::max(1.0, e_ours.max_ref);
  const double bound = factor * e_plain.max_abs + atol;
  std::ostringstream msg;
  msg << what << ": max|ours-ref| " << e_ours.max_abs << " (rel " << e_ours.max_rel << "), max|plain-ref| "
      << e_plain.max_abs << ", bound " << bound << " = " << factor << " x plain + " << atol << ", max|ref| "
      << e_ours.max_ref << ", unwritten (NaN) " << unwritten << ", non-finite mismatches "
      << e_ours.mismatched_nonfinite;
  if (unwritten > 0 || e_ours.mismatched_nonfinite > 0 || !(e_ours.max_abs <= bound))
    return ::testing::AssertionFailure() << msg.str();
  return ::testing::AssertionSuccess() << msg.str();
}

// ---- cases ----

std::string CaseConfig::describe() const {
  std::ostringstream s;
  s << (score == ScoreFunction::kSoftmax ? "softmax" : "hstu") << " " << dtype_name(dtype) << " b" << batch << " h"
    << heads << "/" << heads_k << " d" << head_dim << "/" << (head_dim_v ? head_dim_v : head_dim);
  if (varlen()) {
    s << " varlen q[";
    for (size_t i = 0; i < seqlens_q.size(); ++i) s << (i ? "," : "") << seqlens_q[i];
    s << "] k[";
    const auto& kl = seqlens_k.empty() ? seqlens_q : seqlens_k;
    for (size_t i = 0; i < kl.size(); ++i) s << (i ? "," : "") << kl[i];
    s << "]";
  } else {
    s << " s" << seqlen_q << "/" << seqlen_k;
  }
  if (causal) s << " causal";
  if (window_left >= 0 || window_right >= 0) s << " window(" << window_left << "," << window_right << ")";
  if (softcap > 0.0f) s << " softcap" << softcap;
  if (rab_heads) s << " rab" << rab_heads << (drab ? "+drab" : "");
  if (score == ScoreFunction::kHstuSilu) s << " alpha" << alpha;
  if (!num_contexts.empty()) s << " contexts";
  if (!num_targets.empty()) s << " targets(G=" << target_group_size << ")";
  if (max_seqlen_q) s << " max_seqlen_q" << max_seqlen_q;
  if (max_seqlen_k) s << " max_seqlen_k" << max_seqlen_k;
  return s.str();
}

std::string case_test_name(const CaseConfig& cfg, size_t index) {
  std::string name = std::to_string(index);
  const std::string text = cfg.describe();
  bool gap = true;  // a '_' is due before the next letter or digit
  for (size_t i = 0; i < text.size(); ++i) {
    const auto ch = static_cast<unsigned char>(text[i]);
    const bool minus = ch == '-' && i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1]));
    if (std::isalnum(ch) || minus) {
      if (gap) name += '_';
      name += minus ? 'm' : char(ch);
      gap = false;
    } else {
      gap = true;
    }
  }
  return name;
}

void PrintTo(const CaseConfig& cfg, std::ostream* os) { *os << cfg.describe(); }

CaseConfig softmax_fixed(DType dtype, int64_t batch, int64_t heads, int64_t heads_k, int64_t head_dim,
                         int64_t seqlen_q, int64_t seqlen_k) {
  CaseConfig c;
  c.dtype = dtype;
  c.batch = batch;
  c.heads = heads;
  c.heads_k = heads_k;
  c.head_dim = head_dim;
  c.seqlen_q = seqlen_q;
  c.seqlen_k = seqlen_k;
  return c;
}

CaseConfig softmax_varlen(DType dtype, std::vector<int32_t> lengths_q, std::vector<int32_t> lengths_k, int64_t heads,
                          int64_t heads_k, int64_t head_dim) {
  CaseConfig c;
  c.dtype = dtype;
  c.batch = static_cast<int64_t>(lengths_q.size());
  c.seqlens_q = std::move(lengths_q);
  c.seqlens_k = std::move(lengths_k);
  c.heads = heads;
  c.heads_k = heads_k;
  c.head_dim = head_dim;
  return c;
}

CaseConfig hstu_varlen(DType dtype, std::vector<int32_t> lengths, int64_t heads, int64_t head_dim, bool causal,
                       float alpha) {
  CaseConfig c;
  c.score = ScoreFunction::kHstuSilu;
  c.dtype = dtype;
  c.batch = static_cast<int64_t>(lengths.size());
  c.seqlens_q = std::move(lengths);
  c.heads = c.heads_k = heads;
  c.head_dim = head_dim;
  c.causal = causal;
  c.alpha = alpha;
  return c;
}

Case Case::make(const CaseConfig& cfg, uint64_t seed) {
  Case c;
  c.cfg = cfg;
  std::mt19937_64 rng(seed);
  const int64_t h = cfg.heads, hk = cfg.heads_k, d = cfg.head_dim, dv = cfg.head_dim_v ? cfg.head_dim_v : d;
  const DType dt = cfg.dtype;
  if (cfg.varlen()) {
    const std::vector<int32_t>& lq = cfg.seqlens_q;
    const std::vector<int32_t>& lk = cfg.seqlens_k.empty() ? cfg.seqlens_q : cfg.seqlens_k;
    std::vector<int32_t> cu_q{0}, cu_k{0};
    for (size_t i = 0; i < lq.size(); ++i) {
      cu_q.push_back(cu_q.back() + lq[i]);
      cu_k.push_back(cu_k.back() + lk[i]);
      c.max_seqlen_q = std::max<int64_t>(c.max_seqlen_q, lq[i]);
      c.max_seqlen_k = std::max<int64_t>(c.max_seqlen_k, lk[i]);
    }
    c.max_seqlen_q = std::max(c.max_seqlen_q, cfg.max_seqlen_q);
    c.max_seqlen_k = std::max(c.max_seqlen_k, cfg.max_seqlen_k);
    c.cu_seqlens_q = int_tensor(cu_q);
    c.cu_seqlens_k = int_tensor(cu_k);
    const int64_t tq = cu_q.back(), tk = cu_k.back();
    c.q = random_normal(dt, {tq, h, d}, rng);
    c.k = random_normal(dt, {tk, hk, d}, rng);
    c.v = random_normal(dt, {tk, hk, dv}, rng);
    c.dout = random_normal(dt, {tq, h, dv}, rng);
    c.out = HostTensor(dt, {tq, h, dv});
    if (cfg.score == ScoreFunction::kSoftmax) c.lse = HostTensor(DType::kFloat32, {h, tq});
    c.dq = HostTensor(dt, {tq, h, d});
  } else {
    c.max_seqlen_q = cfg.seqlen_q;
    c.max_seqlen_k = cfg.seqlen_k;
    const int64_t b = cfg.batch, sq = cfg.seqlen_q, sk = cfg.seqlen_k;
    c.q = random_normal(dt, {b, sq, h, d}, rng);
    c.k = random_normal(dt, {b, sk, hk, d}, rng);
    c.v = random_normal(dt, {b, sk, hk, dv}, rng);
    c.dout = random_normal(dt, {b, sq, h, dv}, rng);
    c.out = HostTensor(dt, {b, sq, h, dv});
    if (cfg.score == ScoreFunction::kSoftmax) c.lse = HostTensor(DType::kFloat32, {b, h, sq});
    c.dq = HostTensor(dt, {b, sq, h, d});
  }
  c.dk = HostTensor(dt, c.k.shape);
  c.dv = HostTensor(dt, c.v.shape);
  const int64_t b = cfg.varlen() ? static_cast<int64_t>(cfg.seqlens_q.size()) : cfg.batch;
  if (cfg.rab_heads > 0) {
    c.rab = random_normal(dt, {b, cfg.rab_heads, c.max_seqlen_k, c.max_seqlen_k}, rng);
    if (cfg.drab) c.drab = HostTensor(dt, c.rab.shape);
  }
  if (!cfg.num_contexts.empty()) c.num_contexts = int_tensor(cfg.num_contexts);
  if (!cfg.num_targets.empty()) c.num_targets = int_tensor(cfg.num_targets);
  c.poison_outputs();
  return c;
}

void Case::poison_outputs() {
  for (HostTensor* t : {&out, &lse, &dq, &dk, &dv, &drab}) poison(*t);
}

Case Case::fresh_copy() const {
  Case c = *this;
  c.poison_outputs();
  return c;
}

Case Case::fp32_copy() const {
  Case c = *this;
  c.cfg.dtype = DType::kFloat32;
  for (HostTensor* t : {&c.q, &c.k, &c.v, &c.rab, &c.dout, &c.out, &c.dq, &c.dk, &c.dv, &c.drab})
    *t = cast(*t, DType::kFloat32);
  c.poison_outputs();
  return c;
}

Problem Case::problem(Backend backend) {
  Problem p;
  p.score = cfg.score;
  p.q = q.view();
  p.k = k.view();
  p.v = v.view();
  if (cfg.varlen()) {
    p.cu_seqlens_q = cu_seqlens_q.view();
    p.cu_seqlens_k = cu_seqlens_k.view();
    p.max_seqlen_q = max_seqlen_q;
    p.max_seqlen_k = max_seqlen_k;
  }
  p.causal = cfg.causal;
  p.window_left = cfg.window_left;
  p.window_right = cfg.causal ? 0 : cfg.window_right;
  p.softmax_scale = cfg.softmax_scale;
  p.softcap = cfg.softcap;
  if (cfg.score == ScoreFunction::kHstuSilu) {
    p.alpha = cfg.alpha;
    p.scaling_seqlen = cfg.scaling_seqlen;
    p.rab = rab.view();
    p.num_contexts = num_contexts.view();
    p.num_targets = num_targets.view();
    p.target_group_size = cfg.target_group_size;
  }
  p.backend = backend;
  p.device = DeviceKind::kCpu;
  p.num_threads = cfg.num_threads;
  return p;
}

ForwardArgs Case::forward_args(Backend backend) {
  ForwardArgs a;
  a.problem = problem(backend);
  a.out = out.view();
  a.lse = lse.view();
  return a;
}

BackwardArgs Case::backward_args(Backend backend) {
  BackwardArgs a;
  a.problem = problem(backend);
  if (cfg.score == ScoreFunction::kSoftmax) {
    a.out = out.view();
    a.lse = lse.view();
  }
  a.dout = dout.view();
  a.dq = dq.view();
  a.dk = dk.view();
  a.dv = dv.view();
  a.drab = drab.view();
  return a;
}

bool run_forward(Case& c, Backend backend) {
  const Status s = attention_forward(c.forward_args(backend));
  if (!s.ok()) ADD_FAILURE() << backend_name(backend) << " forward failed: " << s.message;
  return s.ok();
}

bool run_backward(Case& c, Backend backend) {
  const Status s = attention_backward(c.backward_args(backend));
  if (!s.ok()) ADD_FAILURE() << backend_name(backend) << " backward failed: " << s.message;
  return s.ok();
}

References make_references(const Case& c, bool backward) {
  References r{c.fp32_copy(), c.fresh_copy()};
  if (run_forward(r.ref, Backend::kCpuReference) && backward) run_backward(r.ref, Backend::kCpuReference);
  plain_forward(r.plain);
  if (backward) plain_backward(r.plain);
  return r;
}

References make_references_tf32(const Case& c, bool backward) {
  References r{c.fp32_copy(), c.fresh_copy()};
  if (run_forward(r.ref, Backend::kCpuReference) && backward) run_backward(r.ref, Backend::kCpuReference);
  plain_forward_tf32(r.plain);
  if (backward) plain_backward_tf32(r.plain);
  return r;
}

void expect_matches(const Case& ours, const References& refs, bool backward) {
  EXPECT_TRUE(check_close("out", ours.out, refs.plain.out, refs.ref.out, kForwardFactor));
  if (!ours.lse.empty()) {
    const ErrorStats e = compare(ours.lse, refs.ref.lse);
    EXPECT_EQ(count_nan(ours.lse), 0) << "lse: unwritten (NaN) entries";
    EXPECT_EQ(e.mismatched_nonfinite, 0) << "lse: rows with -inf differ from the reference";
    EXPECT_LE(e.max_abs, 1e-4 * (1.0 + e.max_ref)) << "lse: max abs error";
  }
  if (!backward) return;
  const double factor = ours.cfg.score == ScoreFunction::kHstuSilu ? kHstuFactor : kGradFactor;
  EXPECT_TRUE(check_close("dq", ours.dq, refs.plain.dq, refs.ref.dq, factor));
  EXPECT_TRUE(check_close("dk", ours.dk, refs.plain.dk, refs.ref.dk, factor));
  EXPECT_TRUE(check_close("dv", ours.dv, refs.plain.dv, refs.ref.dv, factor));
  if (!ours.drab.empty()) {
    EXPECT_TRUE(check_close("drab", ours.drab, refs.plain.drab, refs.ref.drab, kHstuFactor));
  }
}

// ---- the plain low-precision computation ----
namespace {

// Row-wise access to a case's contiguous tensors for sequence bi.
struct Layout {
  const Case& c;
  int64_t bi, q_start, k_start, sq, sk;

  Layout(const Case& cs, int64_t b) : c(cs), bi(b) {
    if (cs.cfg.varlen()) {
      q_start = cs.cu_seqlens_q.get_int(b);
      k_start = cs.cu_seqlens_k.get_int(b);
      sq = cs.cu_seqlens_q.get_int(b + 1) - q_start;
      sk = cs.cu_seqlens_k.get_int(b + 1) - k_start;
    } else {
      q_start = b * cs.cfg.seqlen_q;
      k_start = b * cs.cfg.seqlen_k;
      sq = cs.cfg.seqlen_q;
      sk = cs.cfg.seqlen_k;
    }
  }
  // Element index of (local row, head, column) in a q-side / k-side tensor with `heads` heads of `cols`.
  int64_t qi(int64_t i, int64_t head, int64_t heads, int64_t cols, int64_t c0) const {
    return ((q_start + i) * heads + head) * cols + c0;
  }
  int64_t ki(int64_t j, int64_t head, int64_t heads, int64_t cols, int64_t c0) const {
    return ((k_start + j) * heads + head) * cols + c0;
  }
  int64_t lse_index(int64_t head, int64_t i) const {
    return c.cfg.varlen() ? head * c.q.shape[0] + q_start + i : (bi * c.cfg.heads + head) * sq + i;
  }
  int64_t rab_index(int64_t head, int64_t r, int64_t j) const {
    const int64_t hr = c.cfg.rab_heads == 1 ? 0 : head;
    return ((bi * c.cfg.rab_heads + hr) * c.max_seqlen_k + r) * c.max_seqlen_k + j;
  }
};

// Mask fields for the oracle's visibility rule.
detail::Params mask_params(const Case& c) {
  detail::Params p;
  p.window_left = c.cfg.window_left;
  p.window_right = c.cfg.causal ? 0 : c.cfg.window_right;
  p.num_contexts = c.num_contexts.empty() ? nullptr : static_cast<const int32_t*>(c.num_contexts.data());
  p.num_targets = c.num_targets.empty() ? nullptr : static_cast<const int32_t*>(c.num_targets.data());
  p.target_group_size = c.cfg.target_group_size;
  return p;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// fp32 -> tf32 (10-bit mantissa) rounding to nearest, ties away from zero: cvt.rna.tf32.f32 of the GPU kernels.
float round_tf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits = (bits + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &bits, sizeof bits);
  return x;
}

struct Plain {
  Case& c;
  DType dt;
  bool tf32;  // matmul operands rounded to tf32 (plain_forward_tf32 / plain_backward_tf32)
  int64_t h, hk, group, d, dv;
  bool hstu;
  float scale, inv_scaling;
  detail::Params mp;

  Plain(Case& cs, bool tf32_operands)
      : c(cs),
        dt(cs.cfg.dtype),
        tf32(tf32_operands),
        h(cs.cfg.heads),
        hk(cs.cfg.heads_k),
        group(cs.cfg.heads / cs.cfg.heads_k),
        d(cs.cfg.head_dim),
        dv(cs.cfg.head_dim_v ? cs.cfg.head_dim_v : cs.cfg.head_dim),
        hstu(cs.cfg.score == ScoreFunction::kHstuSilu),
        mp(mask_params(cs)) {
    scale = c.cfg.softmax_scale != 0.0f ? c.cfg.softmax_scale : 1.0f / std::sqrt(static_cast<float>(d));
    const float scaling = c.cfg.scaling_seqlen != 0.0f ? c.cfg.scaling_seqlen : static_cast<float>(c.max_seqlen_q);
    inv_scaling = scaling > 0.0f ? 1.0f / scaling : 1.0f;
  }
  int64_t batches() const { return c.cfg.varlen() ? static_cast<int64_t>(c.cfg.seqlens_q.size()) : c.cfg.batch; }
  float r(float x) const { return round_to(dt, x); }
  // A matmul operand: unchanged, or rounded to tf32.
  float op(float x) const { return tf32 ? round_tf32(x) : x; }

  // Row i of head `head`: the rounded scores (HSTU: the rounded pre-activation), P (rounded), LSE.
  void row(const Layout& L, int64_t head, int64_t i, std::vector<float>& S, std::vector<float>& P, float& lse) const {
    S.assign(L.sk, 0.0f);
    P.assign(L.sk, 0.0f);
    float m = -std::numeric_limits<float>::infinity();
    std::vector<char> vis(L.sk);
    for (int64_t j = 0; j < L.sk; ++j) {
      vis[j] = detail::cpu::reference_visible(mp, L.bi, L.sq, L.sk, i, j);
      if (!vis[j]) continue;
      float acc = 0.0f;
      for (int64_t x = 0; x < d; ++x) acc += op(c.q.get(L.qi(i, head, h, d, x))) * op(c.k.get(L.ki(j, head / group, hk, d, x)));
      float s = r(acc);
      if (hstu) {
        if (!c.rab.empty()) s = r(s + c.rab.get(L.rab_index(head, i + L.sk - L.sq, j)));
        s = r(c.cfg.alpha * s);
        S[j] = s;
        P[j] = r(r(s * sigmoid(s)) * inv_scaling);
      } else {
        s = r(s * scale);
        if (c.cfg.softcap > 0.0f) s = r(c.cfg.softcap * std::tanh(s / c.cfg.softcap));
        S[j] = s;
        m = std::max(m, s);
      }
    }
    lse = -std::numeric_limits<float>::infinity();
    if (hstu || m == -std::numeric_limits<float>::infinity()) return;
    float sum = 0.0f;
    for (int64_t j = 0; j < L.sk; ++j)
      if (vis[j]) sum += std::exp(S[j] - m);
    lse = m + std::log(sum);
    for (int64_t j = 0; j < L.sk; ++j)
      if (vis[j]) P[j] = r(std::exp(S[j] - m) / sum);
  }

  void forward() {
    std::vector<float> S, P, o;
    for (int64_t bi = 0; bi < batches(); ++bi) {
      const Layout L(c, bi);
      for (int64_t head = 0; head < h; ++head)
        for (int64_t i = 0; i < L.sq; ++i) {
          float lse;
          row(L, head, i, S, P, lse);
          o.assign(dv, 0.0f);
          for (int64_t j = 0; j < L.sk; ++j)
            if (P[j] != 0.0f)
              for (int64_t x = 0; x < dv; ++x) o[x] += op(P[j]) * op(c.v.get(L.ki(j, head / group, hk, dv, x)));
          for (int64_t x = 0; x < dv; ++x) c.out.set(L.qi(i, head, h, dv, x), r(o[x]));
          if (!c.lse.empty()) c.lse.set(L.lse_index(head, i), lse);
        }
    }
  }

  void backward() {
    std::vector<float> dk(c.dk.numel(), 0.0f), dvacc(c.dv.numel(), 0.0f), drab(c.drab.numel(), 0.0f);
    std::vector<float> S, P, dP, dq;
    for (int64_t bi = 0; bi < batches(); ++bi) {
      const Layout L(c, bi);
      for (int64_t head = 0; head < h; ++head) {
        const int64_t kh = head / group;
        for (int64_t i = 0; i < L.sq; ++i) {
          float lse;
          row(L, head, i, S, P, lse);
          dP.assign(L.sk, 0.0f);
          float D = 0.0f;
          for (int64_t j = 0; j < L.sk; ++j) {
            if (!detail::cpu::reference_visible(mp, bi, L.sq, L.sk, i, j)) continue;
            float acc = 0.0f;
            for (int64_t x = 0; x < dv; ++x) acc += op(c.dout.get(L.qi(i, head, h, dv, x))) * op(c.v.get(L.ki(j, kh, hk, dv, x)));
            dP[j] = r(acc);
            D += P[j] * dP[j];
          }
          dq.assign(d, 0.0f);
          for (int64_t j = 0; j < L.sk; ++j) {
            if (!detail::cpu::reference_visible(mp, bi, L.sq, L.sk, i, j)) continue;
            float ds;
            if (hstu) {
              const float sg = sigmoid(S[j]);
              ds = r(c.cfg.alpha * r(r(dP[j] * inv_scaling) * sg * (1.0f + S[j] * (1.0f - sg))));
              if (!c.drab.empty()) drab[L.rab_index(head, i + L.sk - L.sq, j)] += ds;
            } else {
              ds = r(P[j] * (dP[j] - D));
              if (c.cfg.softcap > 0.0f) {
                const float t = S[j] / c.cfg.softcap;
                ds = r(ds * (1.0f - t * t));
              }
              ds = r(ds * scale);
            }
            for (int64_t x = 0; x < d; ++x) {
              dq[x] += op(ds) * op(c.k.get(L.ki(j, kh, hk, d, x)));
              dk[L.ki(j, kh, hk, d, x)] += op(ds) * op(c.q.get(L.qi(i, head, h, d, x)));
            }
            for (int64_t x = 0; x < dv; ++x) dvacc[L.ki(j, kh, hk, dv, x)] += op(P[j]) * op(c.dout.get(L.qi(i, head, h, dv, x)));
          }
          for (int64_t x = 0; x < d; ++x) c.dq.set(L.qi(i, head, h, d, x), r(dq[x]));
        }
      }
    }
    for (int64_t e = 0; e < c.dk.numel(); ++e) c.dk.set(e, r(dk[e]));
    for (int64_t e = 0; e < c.dv.numel(); ++e) c.dv.set(e, r(dvacc[e]));
    for (int64_t e = 0; e < c.drab.numel(); ++e) c.drab.set(e, r(drab[e]));
  }
};

}  // namespace

void plain_forward(Case& c) { Plain(c, false).forward(); }
void plain_backward(Case& c) { Plain(c, false).backward(); }
void plain_forward_tf32(Case& c) { Plain(c, true).forward(); }
void plain_backward_tf32(Case& c) { Plain(c, true).backward(); }

}  // namespace cuteattn::test
