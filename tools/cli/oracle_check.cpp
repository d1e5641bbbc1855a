// cuteattn-cli correctness check against the float64 oracle, slice by slice (see oracle_check.h).
#include "oracle_check.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "cpu/element_cpu.h"

namespace cuteattn::cli {
namespace {

// Multiply-adds of one slice that the float64 oracle finishes in about a second.
constexpr double kOracleBudget = 4e8;
constexpr int64_t kSampledRows = 64;

// Query heads [g0 * G, g1 * G) and kv heads [g0, g1) of sequence bi; query rows [row0, row0 + rows) against
// keys [0, keys). Rows keep their key positions r = i + off when the slice's own offset keys - rows equals
// off + row0; where it cannot (no mask), rab rows are shifted by rab_shift instead.
struct Slice {
  int64_t bi = 0, g0 = 0, g1 = 1, row0 = 0, rows = 0, keys = 0, rab_shift = 0;
  bool whole = false;
};

// The coarse pass bound on max_err / max_ref: low-precision kernels land well inside it, a wrong mask or a
// missed tile far outside. The strict FlashAttention rule lives in the test suites.
double tolerance(DType dtype, bool gradient, bool hstu) {
  double t = 0.0;
  switch (dtype) {
    case DType::kFloat32:
      t = gradient ? 1e-4 : 2e-5;
      break;
    case DType::kFloat16:
      t = gradient ? 1e-2 : 4e-3;
      break;
    default:
      t = gradient ? 5e-2 : 2e-2;
      break;
  }
  return hstu && gradient ? 2.0 * t : t;
}

// Which query rows a row-sampled slice may take: any block when the mask ignores key positions, any block
// with the keys beyond its last row cut off when no row sees a key to its right, else only the last rows.
enum class RowFreedom { kLastOnly, kCutKeys, kAny };

RowFreedom row_freedom(const ProblemSpec& s) {
  if (s.has_contexts || s.has_targets) return RowFreedom::kLastOnly;
  if (!s.causal && s.window_left < 0 && s.window_right < 0) return RowFreedom::kAny;
  if (s.causal || s.window_right == 0) return RowFreedom::kCutKeys;
  return RowFreedom::kLastOnly;
}

std::vector<Slice> plan_slices(const ProblemSpec& s, bool backward) {
  const int64_t group = s.h / s.hk;
  // dRab with one rab head sums over every query head, so such a slice must hold them all.
  const bool all_heads = backward && !s.softmax() && s.rab_heads == 1;
  const int64_t picks[3][2] = {{0, 0}, {s.b - 1, s.hk - 1}, {s.b / 2, s.hk / 2}};
  const RowFreedom freedom = row_freedom(s);
  std::vector<Slice> slices;
  for (int p = 0; p < 3; ++p) {
    Slice sl;
    sl.bi = picks[p][0];
    sl.g0 = all_heads ? 0 : picks[p][1];
    sl.g1 = all_heads ? s.hk : picks[p][1] + 1;
    const int64_t sq = s.len_q(sl.bi), sk = s.len_k(sl.bi);
    const double cost = static_cast<double>((sl.g1 - sl.g0) * group) * static_cast<double>(sq) *
                        static_cast<double>(sk) * static_cast<double>(s.d + s.dv) * (backward ? 3.5 : 1.0);
    if (s.check_rows > 0)
      sl.rows = std::min(s.check_rows, sq);
    else
      sl.rows = cost <= kOracleBudget ? sq : std::min(kSampledRows, sq);
    sl.whole = sl.rows == sq;
    // Sampled slices take the last rows, then the first ones, then the middle ones, where the mask allows.
    sl.row0 = sq - sl.rows;
    if (freedom != RowFreedom::kLastOnly && p > 0) sl.row0 = p == 1 ? 0 : (sq - sl.rows) / 2;
    const int64_t off = sk - sq;
    sl.keys = freedom == RowFreedom::kCutKeys ? std::clamp<int64_t>(off + sl.row0 + sl.rows, 0, sk) : sk;
    sl.rab_shift = off + sl.row0 - (sl.keys - sl.rows);
    const bool seen = std::any_of(slices.begin(), slices.end(),
                                  [&](const Slice& o) { return o.bi == sl.bi && o.g0 == sl.g0 && o.row0 == sl.row0; });
    if (!seen) slices.push_back(sl);
  }
  return slices;
}

// One slice as an fp32, one-sequence jagged problem for the oracle, and the oracle's outputs.
struct SliceProblem {
  int64_t heads = 0, heads_k = 0, rab_heads = 0, sk = 0;
  std::vector<float> q, k, v, rab, dout, out, lse, dq, dk, dv, drab;
  std::vector<int32_t> cu_q, cu_k, contexts, targets;
};

void fill_inputs(const ProblemSpec& s, const Slice& sl, bool backward, SliceProblem* sp) {
  const int64_t group = s.h / s.hk, h0 = sl.g0 * group;
  const int64_t H = (sl.g1 - sl.g0) * group, K = sl.g1 - sl.g0, R = sl.rows;
  const int64_t q0 = s.cu_q[sl.bi] + sl.row0, k0 = s.cu_k[sl.bi], sk = sl.keys;
  sp->heads = H;
  sp->heads_k = K;
  sp->sk = sk;
  sp->q.resize(R * H * s.d);
  sp->dout.resize(backward ? R * H * s.dv : 0);
  for (int64_t t = 0; t < R; ++t)
    for (int64_t hh = 0; hh < H; ++hh) {
      for (int64_t c = 0; c < s.d; ++c)
        sp->q[(t * H + hh) * s.d + c] = input_value(s.seed, Input::kQ, ((q0 + t) * s.h + h0 + hh) * s.d + c, s.dtype);
      for (int64_t c = 0; backward && c < s.dv; ++c)
        sp->dout[(t * H + hh) * s.dv + c] =
            input_value(s.seed, Input::kDout, ((q0 + t) * s.h + h0 + hh) * s.dv + c, s.dtype);
    }
  sp->k.resize(sk * K * s.d);
  sp->v.resize(sk * K * s.dv);
  for (int64_t j = 0; j < sk; ++j)
    for (int64_t gg = 0; gg < K; ++gg) {
      for (int64_t c = 0; c < s.d; ++c)
        sp->k[(j * K + gg) * s.d + c] =
            input_value(s.seed, Input::kK, ((k0 + j) * s.hk + sl.g0 + gg) * s.d + c, s.dtype);
      for (int64_t c = 0; c < s.dv; ++c)
        sp->v[(j * K + gg) * s.dv + c] =
            input_value(s.seed, Input::kV, ((k0 + j) * s.hk + sl.g0 + gg) * s.dv + c, s.dtype);
    }
  if (s.rab_heads > 0) {
    // Only the rows of the sliced queries and the slice's keys are read; the rest stays 0.
    sp->rab_heads = s.rab_heads == 1 ? 1 : H;
    sp->rab.assign(sp->rab_heads * s.max_k * s.max_k, 0.0f);
    for (int64_t hr = 0; hr < sp->rab_heads; ++hr) {
      const int64_t src = s.rab_heads == 1 ? 0 : h0 + hr;
      for (int64_t r = std::max<int64_t>(0, sk - R); r < sk; ++r)
        for (int64_t j = 0; j < sk; ++j)
          sp->rab[(hr * s.max_k + r) * s.max_k + j] =
              input_value(s.seed, Input::kRab, s.rab_index(sl.bi, src, r + sl.rab_shift, j), s.dtype);
    }
  }
  sp->cu_q = {0, static_cast<int32_t>(R)};
  sp->cu_k = {0, static_cast<int32_t>(sk)};
  if (s.has_contexts) sp->contexts = {s.contexts[sl.bi]};
  if (s.has_targets) sp->targets = {s.targets[sl.bi]};
}

Status run_oracle(const ProblemSpec& s, const Slice& sl, bool backward, SliceProblem* sp) {
  const int64_t R = sl.rows, H = sp->heads, K = sp->heads_k, sk = sp->sk;
  const DType f32 = DType::kFloat32;
  Problem p;
  p.score = s.score;
  p.q = make_tensor(sp->q.data(), f32, {R, H, s.d});
  p.k = make_tensor(sp->k.data(), f32, {sk, K, s.d});
  p.v = make_tensor(sp->v.data(), f32, {sk, K, s.dv});
  p.cu_seqlens_q = make_tensor(sp->cu_q.data(), DType::kInt32, {2});
  p.cu_seqlens_k = make_tensor(sp->cu_k.data(), DType::kInt32, {2});
  p.max_seqlen_q = R;
  p.max_seqlen_k = s.max_k;
  p.causal = s.causal;
  p.window_left = s.window_left;
  p.window_right = s.window_right;
  p.softcap = s.softcap;
  p.alpha = s.alpha;
  if (!s.softmax() && s.max_q > 0) p.scaling_seqlen = static_cast<float>(s.max_q);  // the full problem's default
  if (s.rab_heads > 0) p.rab = make_tensor(sp->rab.data(), f32, {1, sp->rab_heads, s.max_k, s.max_k});
  if (s.has_contexts) p.num_contexts = make_tensor(sp->contexts.data(), DType::kInt32, {1});
  if (s.has_targets) p.num_targets = make_tensor(sp->targets.data(), DType::kInt32, {1});
  p.target_group_size = s.group_size;
  p.backend = Backend::kCpuReference;
  p.device = DeviceKind::kCpu;
  p.num_threads = 1;

  sp->out.assign(R * H * s.dv, 0.0f);
  ForwardArgs f;
  f.problem = p;
  f.out = make_tensor(sp->out.data(), f32, {R, H, s.dv});
  if (s.softmax()) {
    sp->lse.assign(H * R, 0.0f);
    f.lse = make_tensor(sp->lse.data(), f32, {H, R});
  }
  Status st = attention_forward(f);
  if (!st.ok() || !backward) return st;

  sp->dq.assign(R * H * s.d, 0.0f);
  sp->dk.assign(sk * K * s.d, 0.0f);
  sp->dv.assign(sk * K * s.dv, 0.0f);
  BackwardArgs b;
  b.problem = p;
  if (s.softmax()) {
    b.out = f.out;
    b.lse = f.lse;
  }
  b.dout = make_tensor(sp->dout.data(), f32, {R, H, s.dv});
  b.dq = make_tensor(sp->dq.data(), f32, {R, H, s.d});
  b.dk = make_tensor(sp->dk.data(), f32, {sk, K, s.d});
  b.dv = make_tensor(sp->dv.data(), f32, {sk, K, s.dv});
  if (s.rab_heads > 0) {
    sp->drab.assign(sp->rab.size(), 0.0f);
    b.drab = make_tensor(sp->drab.data(), f32, {1, sp->rab_heads, s.max_k, s.max_k});
  }
  return attention_backward(b);
}

void compare(ErrorStat* st, float ours, float ref) {
  ++st->compared;
  if (std::isfinite(ref)) st->max_ref = std::max(st->max_ref, static_cast<double>(std::fabs(ref)));
  if (ours == ref) return;  // includes the -inf LSE of rows without visible keys
  if (!std::isfinite(ours) || !std::isfinite(ref)) {
    ++st->not_finite;
    return;
  }
  st->max_err = std::max(st->max_err, static_cast<double>(std::fabs(ours - ref)));
}

// Compares one slice; stats[] is {out, lse, dq, dk, dv, drab}.
void compare_slice(const ProblemSpec& s, const Slice& sl, const SliceProblem& sp, const RunOutputs& ours, bool backward,
                   ErrorStat* stats) {
  const int64_t group = s.h / s.hk, h0 = sl.g0 * group, H = sp.heads, K = sp.heads_k, R = sl.rows;
  const int64_t q0 = s.cu_q[sl.bi] + sl.row0, k0 = s.cu_k[sl.bi], sk = sp.sk;
  auto elem = [&](const std::vector<unsigned char>& buf, int64_t index) {
    return detail::cpu::load_element(buf.data(), s.dtype, index);
  };
  for (int64_t t = 0; t < R; ++t)
    for (int64_t hh = 0; hh < H; ++hh) {
      const int64_t row = (q0 + t) * s.h + h0 + hh;
      if (!backward) {
        for (int64_t c = 0; c < s.dv; ++c)
          compare(&stats[0], elem(ours.out, row * s.dv + c), sp.out[(t * H + hh) * s.dv + c]);
        if (s.softmax())
          compare(&stats[1], reinterpret_cast<const float*>(ours.lse.data())[s.lse_index(sl.bi, h0 + hh, sl.row0 + t)],
                  sp.lse[hh * R + t]);
      } else {
        for (int64_t c = 0; c < s.d; ++c)
          compare(&stats[2], elem(ours.dq, row * s.d + c), sp.dq[(t * H + hh) * s.d + c]);
      }
    }
  if (!backward || !sl.whole) return;
  for (int64_t j = 0; j < sk; ++j)
    for (int64_t gg = 0; gg < K; ++gg) {
      const int64_t row = (k0 + j) * s.hk + sl.g0 + gg;
      for (int64_t c = 0; c < s.d; ++c) compare(&stats[3], elem(ours.dk, row * s.d + c), sp.dk[(j * K + gg) * s.d + c]);
      for (int64_t c = 0; c < s.dv; ++c)
        compare(&stats[4], elem(ours.dv, row * s.dv + c), sp.dv[(j * K + gg) * s.dv + c]);
    }
  if (s.rab_heads == 0) return;
  const int64_t off = sk - s.len_q(sl.bi);
  for (int64_t hr = 0; hr < sp.rab_heads; ++hr) {
    const int64_t src = s.rab_heads == 1 ? 0 : h0 + hr;
    for (int64_t r = std::max<int64_t>(0, off); r < sk; ++r)
      for (int64_t j = 0; j < sk; ++j)
        compare(&stats[5], elem(ours.drab, s.rab_index(sl.bi, src, r, j)), sp.drab[(hr * s.max_k + r) * s.max_k + j]);
  }
}

}  // namespace

bool ErrorStat::passed() const {
  const double rel = max_ref > 0.0 ? max_err / max_ref : max_err;
  return not_finite == 0 && rel <= tolerance;
}

bool CheckResult::passed() const {
  if (!error.empty()) return false;
  return std::all_of(stats.begin(), stats.end(), [](const ErrorStat& s) { return s.passed(); });
}

CheckResult check_against_oracle(const ProblemSpec& s, const RunOutputs& ours, bool backward) {
  CheckResult result;
  if (s.check_rows == 0) return result;
  result.ran = true;
  const std::vector<Slice> slices = plan_slices(s, backward);
  std::vector<SliceProblem> problems(slices.size());
  std::vector<Status> status(slices.size());
  std::vector<std::thread> workers;
  for (size_t i = 0; i < slices.size(); ++i)
    workers.emplace_back([&, i] {
      fill_inputs(s, slices[i], backward, &problems[i]);
      status[i] = run_oracle(s, slices[i], backward, &problems[i]);
    });
  for (std::thread& w : workers) w.join();

  const bool hstu = !s.softmax();
  ErrorStat stats[6];
  const char* names[6] = {"out", "lse", "dq", "dk", "dv", "drab"};
  for (int i = 0; i < 6; ++i) {
    stats[i].name = names[i];
    stats[i].tolerance = tolerance(i == 1 ? DType::kFloat32 : s.dtype, i >= 2, hstu);
  }
  bool whole = true;
  std::string picked, sampled = ":";
  for (size_t i = 0; i < slices.size(); ++i) {
    if (!status[i].ok()) {
      result.error = "oracle failed: " + status[i].message;
      return result;
    }
    compare_slice(s, slices[i], problems[i], ours, backward, stats);
    whole = whole && slices[i].whole;
    sampled += " from row " + std::to_string(slices[i].row0);
    picked += " (" + std::to_string(slices[i].bi) + "," + std::to_string(slices[i].g0) +
              (slices[i].g1 - slices[i].g0 > 1 ? "-" + std::to_string(slices[i].g1 - 1) : "") + ")";
  }
  result.scope = std::to_string(slices.size()) + " (batch,kv-head) slices" + picked +
                 (whole ? ", all rows"
                        : ", " + std::to_string(slices[0].rows) + " sampled query rows each" + sampled +
                              " (dk/dv/drab not compared)");
  for (int i = 0; i < 6; ++i)
    if (stats[i].compared > 0) result.stats.push_back(stats[i]);
  return result;
}

}  // namespace cuteattn::cli
