// The float64 oracle (SEMANTICS.md sections 1 and 2): plain loops over every (row, key) pair, nothing fused,
// nothing skipped. It carries its own visibility rule, written from the SEMANTICS text, so that tests of the
// shared Mask policy have an independent check.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/element_cpu.h"
#include "variants/sequence.h"

namespace cuteattn::detail::cpu {

// SEMANTICS.md: visibility of key j to query row i (0-based within sequence bi).
bool reference_visible(const Params& p, int64_t bi, int64_t sq, int64_t sk, int64_t i, int64_t j) {
  if (i < 0 || i >= sq || j < 0 || j >= sk) return false;
  const int64_t r = i + (sk - sq);
  const int64_t n_t = p.num_targets ? p.num_targets[bi] : 0;
  const int64_t n_c = p.num_contexts ? p.num_contexts[bi] : 0;
  const int64_t hist = sk - n_t;
  if (r >= hist) {  // target row: the whole history plus its own target group up to itself
    const int64_t group_first = hist + ((r - hist) / p.target_group_size) * p.target_group_size;
    return j < hist || (group_first <= j && j <= r);
  }
  if (0 <= r && r < n_c) return j < hist;  // contextual row (none without contexts)
  if (p.window_right >= 0 && j > r + p.window_right) return false;
  if (p.window_left >= 0 && j < r - p.window_left) return false;
  return true;
}

namespace {

double silu(double x) { return x / (1.0 + std::exp(-x)); }
double dsilu(double x) {
  const double sg = 1.0 / (1.0 + std::exp(-x));
  return sg * (1.0 + x * (1.0 - sg));
}

struct Oracle {
  const Params& p;
  int64_t group;  // query heads per kv head

  explicit Oracle(const Params& params) : p(params), group(params.heads / params.heads_k) {}

  double get(const RowMajorView& t, int64_t offset) const { return load_element(t.ptr, p.dtype, offset); }

  // <q_i, k_j> of query head h.
  double qk(const SequenceInfo& s, int64_t bi, int64_t h, int64_t i, int64_t j) const {
    const int64_t qo = s.q_offset(p.q, bi, i, h), ko = s.k_offset(p.k, bi, j, h / group);
    double acc = 0.0;
    for (int64_t c = 0; c < p.head_dim; ++c) acc += get(p.q, qo + c) * get(p.k, ko + c);
    return acc;
  }

  int64_t rab_offset(int64_t bi, int64_t h, int64_t r, int64_t j, bool grad) const {
    const int64_t hr = p.rab_heads == 1 ? 0 : h;
    if (grad) return bi * p.drab_batch_stride + hr * p.drab_head_stride + r * p.drab_row_stride + j;
    return bi * p.rab_batch_stride + hr * p.rab_head_stride + r * p.rab_row_stride + j;
  }

  // Softmax: the score S[i,j]; HSTU: the pre-activation alpha * (qk + rab).
  double score(const SequenceInfo& s, int64_t bi, int64_t h, int64_t i, int64_t j) const {
    const double x = qk(s, bi, h, i, j);
    if (p.score == ScoreFunction::kHstuSilu) {
      const double rab = p.rab ? load_element(p.rab, p.dtype, rab_offset(bi, h, i + s.sk - s.sq, j, false)) : 0.0;
      return double(p.alpha) * (x + rab);
    }
    const double sc = double(p.scale) * x;
    return p.softcap > 0.0f ? double(p.softcap) * std::tanh(sc / double(p.softcap)) : sc;
  }

  // Row i's weights P[i, 0..sk) (0 where invisible) and, for softmax, its LSE.
  void probs(const SequenceInfo& s, int64_t bi, int64_t h, int64_t i, std::vector<double>& S,
             std::vector<double>& P, double& lse) const {
    S.assign(s.sk, 0.0);
    P.assign(s.sk, 0.0);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < s.sk; ++j) {
      if (!reference_visible(p, bi, s.sq, s.sk, i, j)) continue;
      S[j] = score(s, bi, h, i, j);
      if (p.score == ScoreFunction::kHstuSilu) {
        P[j] = silu(S[j]) * double(p.inv_scaling_seqlen);
      } else if (S[j] > m) {
        m = S[j];
      }
    }
    lse = -std::numeric_limits<double>::infinity();
    if (p.score == ScoreFunction::kHstuSilu || m == -std::numeric_limits<double>::infinity()) return;
    double sum = 0.0;
    for (int64_t j = 0; j < s.sk; ++j)
      if (reference_visible(p, bi, s.sq, s.sk, i, j)) sum += std::exp(S[j] - m);
    lse = m + std::log(sum);
    for (int64_t j = 0; j < s.sk; ++j)
      if (reference_visible(p, bi, s.sq, s.sk, i, j)) P[j] = std::exp(S[j] - lse);
  }

  void forward() const {
    std::vector<double> S, P, o(p.head_dim_v);
    for (int64_t bi = 0; bi < p.batch; ++bi) {
      const SequenceInfo s = SequenceInfo::of(p, bi);
      for (int64_t h = 0; h < p.heads; ++h) {
        for (int64_t i = 0; i < s.sq; ++i) {
          double lse;
          probs(s, bi, h, i, S, P, lse);
          o.assign(p.head_dim_v, 0.0);
          for (int64_t j = 0; j < s.sk; ++j) {
            if (P[j] == 0.0) continue;
            const int64_t vo = s.k_offset(p.v, bi, j, h / group);
            for (int64_t c = 0; c < p.head_dim_v; ++c) o[c] += P[j] * get(p.v, vo + c);
          }
          const int64_t oo = s.q_offset(p.o, bi, i, h);
          for (int64_t c = 0; c < p.head_dim_v; ++c) store_element(p.o.ptr, p.dtype, oo + c, float(o[c]));
          if (p.lse && p.score == ScoreFunction::kSoftmax) p.lse[s.lse_index(p, bi, h, i)] = float(lse);
        }
      }
    }
  }

  // Row of a key-side accumulator (dK, dV): global key row over the whole batch.
  int64_t key_row(const SequenceInfo& s, int64_t bi, int64_t j) const {
    return p.varlen ? s.k_start + j : bi * p.seqlen_k + j;
  }

  void backward() const {
    const int64_t d = p.head_dim, dv = p.head_dim_v;
    const int64_t key_rows = p.varlen ? p.total_k : p.batch * p.seqlen_k;
    std::vector<double> dk(key_rows * p.heads_k * d, 0.0), dvacc(key_rows * p.heads_k * dv, 0.0);
    const bool want_drab = p.score == ScoreFunction::kHstuSilu && p.drab != nullptr;
    const int64_t rab_plane = p.seqlen_k * p.seqlen_k;
    std::vector<double> drab(want_drab ? p.batch * p.rab_heads * rab_plane : 0, 0.0);

    std::vector<double> S, P, dP, dq(d), dout(dv);
    for (int64_t bi = 0; bi < p.batch; ++bi) {
      const SequenceInfo s = SequenceInfo::of(p, bi);
      for (int64_t h = 0; h < p.heads; ++h) {
        const int64_t hk = h / group;
        for (int64_t i = 0; i < s.sq; ++i) {
          double lse;
          probs(s, bi, h, i, S, P, lse);
          const int64_t doo = s.q_offset(p.dout, bi, i, h);
          for (int64_t c = 0; c < dv; ++c) dout[c] = get(p.dout, doo + c);
          dP.assign(s.sk, 0.0);
          double D = 0.0;  // softmax: sum_j P dP (= rowsum(dO * O) for the exact O)
          for (int64_t j = 0; j < s.sk; ++j) {
            if (!reference_visible(p, bi, s.sq, s.sk, i, j)) continue;
            const int64_t vo = s.k_offset(p.v, bi, j, hk);
            for (int64_t c = 0; c < dv; ++c) dP[j] += dout[c] * get(p.v, vo + c);
            D += P[j] * dP[j];
          }
          dq.assign(d, 0.0);
          const int64_t qo = s.q_offset(p.q, bi, i, h);
          for (int64_t j = 0; j < s.sk; ++j) {
            if (!reference_visible(p, bi, s.sq, s.sk, i, j)) continue;
            double dS;  // d loss / d <q_i, k_j>
            if (p.score == ScoreFunction::kHstuSilu) {
              dS = double(p.alpha) * dsilu(S[j]) * dP[j] * double(p.inv_scaling_seqlen);
              if (want_drab) {
                const int64_t hr = p.rab_heads == 1 ? 0 : h;
                drab[((bi * p.rab_heads + hr) * p.seqlen_k + i + s.sk - s.sq) * p.seqlen_k + j] += dS;
              }
            } else {
              double dscore = double(p.scale);
              if (p.softcap > 0.0f) {
                const double t = S[j] / double(p.softcap);
                dscore *= 1.0 - t * t;
              }
              dS = P[j] * (dP[j] - D) * dscore;
            }
            const int64_t row = key_row(s, bi, j);
            const int64_t ko = s.k_offset(p.k, bi, j, hk);
            for (int64_t c = 0; c < d; ++c) {
              dq[c] += dS * get(p.k, ko + c);
              dk[(row * p.heads_k + hk) * d + c] += dS * get(p.q, qo + c);
            }
            for (int64_t c = 0; c < dv; ++c) dvacc[(row * p.heads_k + hk) * dv + c] += P[j] * dout[c];
          }
          const int64_t dqo = s.q_offset(p.dq, bi, i, h);
          for (int64_t c = 0; c < d; ++c) store_element(p.dq.ptr, p.dtype, dqo + c, float(dq[c]));
        }
      }
      for (int64_t j = 0; j < s.sk; ++j) {
        const int64_t row = key_row(s, bi, j);
        for (int64_t hk = 0; hk < p.heads_k; ++hk) {
          const int64_t dko = s.k_offset(p.dk, bi, j, hk), dvo = s.k_offset(p.dv, bi, j, hk);
          for (int64_t c = 0; c < d; ++c)
            store_element(p.dk.ptr, p.dtype, dko + c, float(dk[(row * p.heads_k + hk) * d + c]));
          for (int64_t c = 0; c < dv; ++c)
            store_element(p.dv.ptr, p.dtype, dvo + c, float(dvacc[(row * p.heads_k + hk) * dv + c]));
        }
      }
    }
    if (!want_drab) return;
    for (int64_t bi = 0; bi < p.batch; ++bi)
      for (int64_t hr = 0; hr < p.rab_heads; ++hr)
        for (int64_t r = 0; r < p.seqlen_k; ++r)
          for (int64_t j = 0; j < p.seqlen_k; ++j)
            store_element(p.drab, p.dtype,
                          bi * p.drab_batch_stride + hr * p.drab_head_stride + r * p.drab_row_stride + j,
                          float(drab[((bi * p.rab_heads + hr) * p.seqlen_k + r) * p.seqlen_k + j]));
  }
};

}  // namespace

Status reference_forward(const Params& p) {
  Oracle(p).forward();
  return Status::Ok();
}

Status reference_backward(const Params& p) {
  Oracle(p).backward();
  return Status::Ok();
}

}  // namespace cuteattn::detail::cpu
