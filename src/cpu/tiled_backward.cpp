// CPU tiled backward (FlashAttention-2 with recomputation). P is rebuilt from the forward LSE, and
// D = rowsum(dO * O) is computed once up front. Two passes keep every output owned by one work item, so the
// gradients are bit-identical for any thread count:
//   pass 1, per (sequence, key block, kv heads): dV += P^T dO, dP = dO V^T, dS, dK += dS^T Q (and dRab);
//   pass 2, per (sequence, head, query block): the same P and dS again, dQ += dS K.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/thread_pool.h"
#include "cpu/tiled_common.h"
#include "variants/mask.h"
#include "variants/score.h"

namespace cuteattn::detail::cpu {
namespace {

struct BackwardScratch {
  std::vector<float> q, dout, kt, vt, k, s, dp, pt, dst, dk, dv, dq, lse2, drow, drab, row;

  void allocate(const Params& p, bool drab_rows) {
    if (!q.empty()) return;
    const int64_t d_pad = round_up16(p.head_dim), dv_pad = round_up16(p.head_dim_v);
    q.assign(kBlockM * d_pad, 0.0f);
    dout.assign(kBlockM * dv_pad, 0.0f);
    kt.assign(p.head_dim * kBlockN, 0.0f);
    vt.assign(p.head_dim_v * kBlockN, 0.0f);
    k.assign(kBlockN * d_pad, 0.0f);
    s.assign(kBlockM * kBlockN, 0.0f);
    dp.assign(kBlockM * kBlockN, 0.0f);
    pt.assign(kBlockN * kBlockM, 0.0f);
    dst.assign(kBlockN * kBlockM, 0.0f);
    dk.assign(kBlockN * d_pad, 0.0f);
    dv.assign(kBlockN * dv_pad, 0.0f);
    dq.assign(kBlockM * d_pad, 0.0f);
    lse2.assign(kBlockM, 0.0f);
    drow.assign(kBlockM, 0.0f);
    if (drab_rows) drab.assign(p.seqlen_k * kBlockN, 0.0f);
    row.assign(std::max(d_pad, dv_pad), 0.0f);
  }
};

struct Backward {
  const Params& p;
  int64_t group, d, dv, d_pad, dv_pad;
  bool hstu, want_drab, drab_sum_heads;
  SoftcapScore softcap_score;
  HstuScore hstu_score;
  std::vector<float> D;  // rowsum(dO * O), indexed like the LSE (softmax only)

  explicit Backward(const Params& params)
      : p(params),
        group(params.heads / params.heads_k),
        d(params.head_dim),
        dv(params.head_dim_v),
        d_pad(round_up16(params.head_dim)),
        dv_pad(round_up16(params.head_dim_v)),
        hstu(params.score == ScoreFunction::kHstuSilu),
        want_drab(hstu && params.drab != nullptr),
        drab_sum_heads(want_drab && params.rab_heads == 1),
        softcap_score{params.scale, params.softcap},
        hstu_score{params.alpha, params.inv_scaling_seqlen} {}

  int64_t rab_head(int64_t head) const { return p.rab_heads == 1 ? 0 : head; }

  // Loads the query-side tiles of rows [i0, i0 + m) of `head`: Q, dO and the per-row LSE (log2 units) and D.
  void load_rows(const SequenceInfo& seq, int64_t bi, int64_t head, int64_t i0, int64_t m, BackwardScratch& w) const {
    load_q_tile(p, p.q, seq, bi, head, i0, m, d, w.q.data(), d_pad);
    load_q_tile(p, p.dout, seq, bi, head, i0, m, dv, w.dout.data(), dv_pad);
    if (hstu) return;
    for (int64_t r = 0; r < m; ++r) {
      const int64_t idx = seq.lse_index(p, bi, head, i0 + r);
      w.lse2[r] = p.lse[idx] * kLog2e;
      w.drow[r] = D[idx];
    }
  }

  // From loaded Q, dO (rows [i0, i0 + m)) and K^T, V^T (keys [j0, j0 + n)): w.s = P and w.dp = dS, the
  // gradient with respect to <q, k> (zero where invisible).
  void p_and_ds(const Mask& mask, int64_t bi, int64_t head, int64_t i0, int64_t m,
                int64_t j0, int64_t n, BackwardScratch& w) const {
    const int64_t n_pad = round_up16(n);
    std::fill(w.s.begin(), w.s.end(), 0.0f);
    std::fill(w.dp.begin(), w.dp.end(), 0.0f);
    gemm_acc(m, n_pad, d, w.q.data(), d_pad, w.kt.data(), kBlockN, w.s.data(), kBlockN);
    gemm_acc(m, n_pad, dv, w.dout.data(), dv_pad, w.vt.data(), kBlockN, w.dp.data(), kBlockN);
    const bool full = mask.tile_fully_visible(i0, i0 + m, j0, j0 + n);
    const float scale_log2 = p.scale * kLog2e;
    for (int64_t r = 0; r < m; ++r) {
      float* s = w.s.data() + r * kBlockN;
      float* ds = w.dp.data() + r * kBlockN;
      const int64_t i = i0 + r;
      const RowMask row_mask(mask, i);
      if (hstu) {
        const int64_t rab_row = i + mask.off;
        for (int64_t c = 0; c < n; ++c) {
          if (!full && !row_mask.visible(j0 + c)) {
            s[c] = ds[c] = 0.0f;
            continue;
          }
          const float rab = p.rab ? load_element(p.rab, p.dtype,
                                                 bi * p.rab_batch_stride + rab_head(head) * p.rab_head_stride +
                                                     rab_row * p.rab_row_stride + j0 + c)
                                  : 0.0f;
          const float pre = hstu_score.pre(s[c], rab);
          s[c] = hstu_score.prob(pre);
          ds[c] *= hstu_score.dprob(pre);
        }
      } else {
        const float drow = w.drow[r];
        if (p.softcap > 0.0f) {
          for (int64_t c = 0; c < n; ++c) {
            const float score = softcap_score.apply(s[c]);
            s[c] = score * kLog2e;
            ds[c] = (ds[c] - drow) * softcap_score.derivative_from_score(score);
          }
        } else {  // SoftcapScore without a cap: score = scale * qk, derivative scale
          for (int64_t c = 0; c < n_pad; ++c) {
            s[c] *= scale_log2;
            ds[c] = (ds[c] - drow) * p.scale;
          }
        }
        exp2_sub_inplace(s, n_pad, w.lse2[r]);
        for (int64_t c = 0; c < n_pad; ++c) ds[c] *= s[c];
        if (!full)
          for (int64_t c = 0; c < n; ++c)
            if (!row_mask.visible(j0 + c)) s[c] = ds[c] = 0.0f;
      }
    }
  }

  void compute_d(const BlockItem& item, int64_t head, BackwardScratch& w);
  void key_block(const BlockItem& item, int64_t hk0, int64_t hk1, BackwardScratch& w) const;
  void query_block(const BlockItem& item, int64_t head, BackwardScratch& w) const;
};

void Backward::compute_d(const BlockItem& item, int64_t head, BackwardScratch& w) {
  const SequenceInfo seq = SequenceInfo::of(p, item.bi);
  const int64_t i0 = item.block * kBlockM, m = min64(kBlockM, seq.sq - i0);
  load_q_tile(p, p.dout, seq, item.bi, head, i0, m, dv, w.dout.data(), dv_pad);
  for (int64_t r = 0; r < m; ++r) {
    load_row(p.o.ptr, p.dtype, seq.q_offset(p.o, item.bi, i0 + r, head), dv, w.row.data());
    float sum = 0.0f;
    for (int64_t c = 0; c < dv; ++c) sum += w.row[c] * w.dout[r * dv_pad + c];
    D[seq.lse_index(p, item.bi, head, i0 + r)] = sum;
  }
}

void Backward::key_block(const BlockItem& item, int64_t hk0, int64_t hk1, BackwardScratch& w) const {
  const SequenceInfo seq = SequenceInfo::of(p, item.bi);
  const Mask mask = Mask::of(p, seq, item.bi);
  const int64_t j0 = item.block * kBlockN, n = min64(kBlockN, seq.sk - j0);
  const Range rows = mask.row_range(j0, j0 + n);
  if (drab_sum_heads) std::fill(w.drab.begin(), w.drab.end(), 0.0f);

  for (int64_t hk = hk0; hk < hk1; ++hk) {
    load_k_tile_transposed(p, p.k, seq, item.bi, hk, j0, n, d, w.kt.data(), kBlockN, w.row.data());
    load_k_tile_transposed(p, p.v, seq, item.bi, hk, j0, n, dv, w.vt.data(), kBlockN, w.row.data());
    std::fill(w.dk.begin(), w.dk.end(), 0.0f);
    std::fill(w.dv.begin(), w.dv.end(), 0.0f);
    for (int64_t head = hk * group; head < (hk + 1) * group; ++head) {
      for (int64_t i0 = rows.begin; i0 < rows.end; i0 += kBlockM) {
        const int64_t m = min64(kBlockM, rows.end - i0);
        load_rows(seq, item.bi, head, i0, m, w);
        p_and_ds(mask, item.bi, head, i0, m, j0, n, w);
        transpose(m, n, w.s.data(), kBlockN, w.pt.data(), kBlockM);
        transpose(m, n, w.dp.data(), kBlockN, w.dst.data(), kBlockM);
        gemm_acc(n, dv_pad, m, w.pt.data(), kBlockM, w.dout.data(), dv_pad, w.dv.data(), dv_pad);
        gemm_acc(n, d_pad, m, w.dst.data(), kBlockM, w.q.data(), d_pad, w.dk.data(), d_pad);
        if (!want_drab) continue;
        for (int64_t r = 0; r < m; ++r) {
          const int64_t rab_row = i0 + r + mask.off;
          const float* ds = w.dp.data() + r * kBlockN;
          if (drab_sum_heads) {
            float* acc = w.drab.data() + rab_row * kBlockN;
            for (int64_t c = 0; c < n; ++c) acc[c] += ds[c];
          } else {
            store_row(p.drab, p.dtype,
                      item.bi * p.drab_batch_stride + head * p.drab_head_stride + rab_row * p.drab_row_stride + j0,
                      n, ds);
          }
        }
      }
    }
    store_k_tile(p, p.dk, seq, item.bi, hk, j0, n, d, w.dk.data(), d_pad);
    store_k_tile(p, p.dv, seq, item.bi, hk, j0, n, dv, w.dv.data(), dv_pad);
  }
  if (!drab_sum_heads) return;
  for (int64_t r = rows.begin + mask.off; r < rows.end + mask.off; ++r)
    store_row(p.drab, p.dtype, item.bi * p.drab_batch_stride + r * p.drab_row_stride + j0, n,
              w.drab.data() + r * kBlockN);
}

void Backward::query_block(const BlockItem& item, int64_t head, BackwardScratch& w) const {
  const SequenceInfo seq = SequenceInfo::of(p, item.bi);
  const Mask mask = Mask::of(p, seq, item.bi);
  const int64_t hk = head / group;
  const int64_t i0 = item.block * kBlockM, m = min64(kBlockM, seq.sq - i0);
  load_rows(seq, item.bi, head, i0, m, w);
  std::fill(w.dq.begin(), w.dq.end(), 0.0f);
  const Range keys = mask.key_range(i0, i0 + m), hole = mask.key_hole(i0, i0 + m);
  for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockN) {
    const int64_t n = min64(kBlockN, keys.end - j0);
    if (j0 >= hole.begin && j0 + n <= hole.end) continue;  // no row of the tile sees these keys
    load_k_tile_transposed(p, p.k, seq, item.bi, hk, j0, n, d, w.kt.data(), kBlockN, w.row.data());
    load_k_tile_transposed(p, p.v, seq, item.bi, hk, j0, n, dv, w.vt.data(), kBlockN, w.row.data());
    load_k_tile(p, p.k, seq, item.bi, hk, j0, n, d, w.k.data(), d_pad);
    p_and_ds(mask, item.bi, head, i0, m, j0, n, w);
    gemm_acc(m, d_pad, n, w.dp.data(), kBlockN, w.k.data(), d_pad, w.dq.data(), d_pad);
  }
  store_q_tile(p, p.dq, seq, item.bi, head, i0, m, d, w.dq.data(), d_pad);
}

// Zeroes every dRab entry; pass 1 then overwrites the entries that rows of some sequence reach.
void zero_drab(const Params& p, int threads) {
  const std::vector<float> zeros(p.seqlen_k, 0.0f);
  parallel_for(p.batch * p.rab_heads, resolve_threads(threads, p.batch * p.rab_heads), [&](int64_t plane, int) {
    const int64_t base = (plane / p.rab_heads) * p.drab_batch_stride + (plane % p.rab_heads) * p.drab_head_stride;
    for (int64_t r = 0; r < p.seqlen_k; ++r) store_row(p.drab, p.dtype, base + r * p.drab_row_stride, p.seqlen_k, zeros.data());
  });
}

}  // namespace

Status tiled_backward(const Params& p) {
  Backward bwd(p);
  const std::vector<BlockItem> q_blocks = block_items(p, /*key_side=*/false, kBlockM);
  const std::vector<BlockItem> k_blocks = block_items(p, /*key_side=*/true, kBlockN);
  const int64_t q_items = static_cast<int64_t>(q_blocks.size()) * p.heads;
  // With a dRab shared by all heads, one work item owns a key block for every head so that it alone sums them.
  const int64_t head_groups = bwd.drab_sum_heads ? 1 : p.heads_k;
  const int64_t k_items = static_cast<int64_t>(k_blocks.size()) * head_groups;
  const int threads = resolve_threads(p.num_threads, std::max(q_items, k_items));
  std::vector<BackwardScratch> scratch(threads);
  auto worker_scratch = [&](int worker) -> BackwardScratch& {
    scratch[worker].allocate(p, bwd.drab_sum_heads);
    return scratch[worker];
  };

  if (!bwd.hstu) {
    bwd.D.assign(p.heads * (p.varlen ? p.total_q : p.batch * p.seqlen_q), 0.0f);
    parallel_for(q_items, resolve_threads(threads, q_items), [&](int64_t item, int worker) {
      bwd.compute_d(q_blocks[item % q_blocks.size()], item / q_blocks.size(), worker_scratch(worker));
    });
  }
  if (bwd.want_drab) zero_drab(p, threads);
  // Items are head-major everywhere so that consecutive items share one head's tensors in cache.
  parallel_for(k_items, resolve_threads(threads, k_items), [&](int64_t item, int worker) {
    const int64_t g = item / k_blocks.size();
    const int64_t hk0 = bwd.drab_sum_heads ? 0 : g, hk1 = bwd.drab_sum_heads ? p.heads_k : g + 1;
    bwd.key_block(k_blocks[item % k_blocks.size()], hk0, hk1, worker_scratch(worker));
  });
  parallel_for(q_items, resolve_threads(threads, q_items), [&](int64_t item, int worker) {
    bwd.query_block(q_blocks[item % q_blocks.size()], item / q_blocks.size(), worker_scratch(worker));
  });
  return Status::Ok();
}

}  // namespace cuteattn::detail::cpu
