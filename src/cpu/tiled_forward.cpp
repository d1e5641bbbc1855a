// CPU tiled forward (FlashAttention-2): each work item is one (sequence, head, query block); it walks the key
// blocks that Mask::key_range allows (minus those inside Mask::key_hole), computes S = Q K^T on float tiles,
// masks only tiles that are not fully visible, and keeps a running max and sum per row (softmax, exp2 with
// log2(e) folded in) or applies SiLU (HSTU).
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

struct ForwardScratch {
  std::vector<float> q, kt, v, s, o, row_max, row_sum, row;

  void allocate(int64_t d, int64_t dv_pad) {
    if (!q.empty()) return;
    q.assign(kBlockM * d, 0.0f);
    kt.assign(d * kBlockN, 0.0f);
    v.assign(kBlockN * dv_pad, 0.0f);
    s.assign(kBlockM * kBlockN, 0.0f);
    o.assign(kBlockM * dv_pad, 0.0f);
    row_max.assign(kBlockM, 0.0f);
    row_sum.assign(kBlockM, 0.0f);
    row.assign(d > dv_pad ? d : dv_pad, 0.0f);
  }
};

// Online softmax of one row of scores (log2 units, -inf where masked; n a multiple of 8) against the running
// max and sum: turns the row into P and rescales the row's output accumulator.
void softmax_update(float* s, int64_t n, float& row_max, float& row_sum, float* o_row, int64_t dv_pad) {
  const float block_max = max_of(s, n);
  const float new_max = block_max > row_max ? block_max : row_max;
  if (new_max == -std::numeric_limits<float>::infinity()) {  // nothing visible in this row yet
    std::fill(s, s + n, 0.0f);
    return;
  }
  exp2_sub_inplace(s, n, new_max);
  if (new_max != row_max) {
    const float correction = exp2_fast(row_max - new_max);
    for (int64_t c = 0; c < dv_pad; ++c) o_row[c] *= correction;
    row_sum *= correction;
  }
  row_sum += sum_of(s, n);
  row_max = new_max;
}

void forward_block(const Params& p, const BlockItem& item, int64_t head, ForwardScratch& w) {
  const int64_t d = p.head_dim, dv = p.head_dim_v, dv_pad = round_up16(dv);
  const int64_t hk = head / (p.heads / p.heads_k);
  const SequenceInfo seq = SequenceInfo::of(p, item.bi);
  const Mask mask = Mask::of(p, seq, item.bi);
  const bool hstu = p.score == ScoreFunction::kHstuSilu;
  const SoftcapScore softcap_score{p.scale, p.softcap};
  const HstuScore hstu_score{p.alpha, p.inv_scaling_seqlen};
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float scale_log2 = p.scale * kLog2e;

  const int64_t i0 = item.block * kBlockM, m = min64(kBlockM, seq.sq - i0);
  load_q_tile(p, p.q, seq, item.bi, head, i0, m, d, w.q.data(), d);
  std::fill(w.o.begin(), w.o.end(), 0.0f);
  std::fill(w.row_max.begin(), w.row_max.end(), neg_inf);
  std::fill(w.row_sum.begin(), w.row_sum.end(), 0.0f);

  const Range keys = mask.key_range(i0, i0 + m), hole = mask.key_hole(i0, i0 + m);
  for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockN) {
    const int64_t n = min64(kBlockN, keys.end - j0), n_pad = round_up16(n);
    if (j0 >= hole.begin && j0 + n <= hole.end) continue;  // no row of the tile sees these keys
    load_k_tile_transposed(p, p.k, seq, item.bi, hk, j0, n, d, w.kt.data(), kBlockN, w.row.data());
    // Copied even for fp32: rows of a (s, h, d) tensor sit 4 KiB apart and alias in the L1 cache.
    load_k_tile(p, p.v, seq, item.bi, hk, j0, n, dv, w.v.data(), dv_pad);
    std::fill(w.s.begin(), w.s.end(), 0.0f);
    gemm_acc(m, n_pad, d, w.q.data(), d, w.kt.data(), kBlockN, w.s.data(), kBlockN);

    const bool full = mask.tile_fully_visible(i0, i0 + m, j0, j0 + n);
    for (int64_t r = 0; r < m; ++r) {
      float* s = w.s.data() + r * kBlockN;
      const int64_t i = i0 + r;
      if (hstu) {
        const int64_t rab_row = i + mask.off;
        const RowMask row_mask(mask, i);
        for (int64_t c = 0; c < n; ++c) {
          if (!full && !row_mask.visible(j0 + c)) {
            s[c] = 0.0f;
            continue;
          }
          const float rab = p.rab ? load_element(p.rab, p.dtype,
                                                 item.bi * p.rab_batch_stride +
                                                     (p.rab_heads == 1 ? 0 : head) * p.rab_head_stride +
                                                     rab_row * p.rab_row_stride + j0 + c)
                                  : 0.0f;
          s[c] = hstu_score.prob(hstu_score.pre(s[c], rab));
        }
      } else {
        if (p.softcap > 0.0f) {
          for (int64_t c = 0; c < n; ++c) s[c] = softcap_score.apply(s[c]) * kLog2e;
        } else {
          for (int64_t c = 0; c < n; ++c) s[c] *= scale_log2;  // SoftcapScore::apply without a cap, in log2 units
        }
        for (int64_t c = n; c < n_pad; ++c) s[c] = neg_inf;
        if (!full) {
          const RowMask row_mask(mask, i);
          for (int64_t c = 0; c < n; ++c)
            if (!row_mask.visible(j0 + c)) s[c] = neg_inf;
        }
        softmax_update(s, n_pad, w.row_max[r], w.row_sum[r], w.o.data() + r * dv_pad, dv_pad);
      }
    }
    gemm_acc(m, dv_pad, n, w.s.data(), kBlockN, w.v.data(), dv_pad, w.o.data(), dv_pad);
  }

  if (!hstu) {
    for (int64_t r = 0; r < m; ++r) {
      const float sum = w.row_sum[r];
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      for (int64_t c = 0; c < dv; ++c) w.o[r * dv_pad + c] *= inv;
      if (p.lse)
        p.lse[seq.lse_index(p, item.bi, head, i0 + r)] =
            sum > 0.0f ? (w.row_max[r] + std::log2(sum)) * kLn2 : neg_inf;
    }
  }
  store_q_tile(p, p.o, seq, item.bi, head, i0, m, dv, w.o.data(), dv_pad);
}

}  // namespace

Status tiled_forward(const Params& p) {
  const std::vector<BlockItem> blocks = block_items(p, /*key_side=*/false, kBlockM);
  const int64_t items = static_cast<int64_t>(blocks.size()) * p.heads;
  const int threads = resolve_threads(p.num_threads, items);
  std::vector<ForwardScratch> scratch(threads);
  parallel_for(items, threads, [&](int64_t item, int worker) {
    ForwardScratch& w = scratch[worker];
    w.allocate(p.head_dim, round_up16(p.head_dim_v));
    // Head-major order: consecutive items reuse one head's K and V from cache.
    forward_block(p, blocks[item % blocks.size()], item / blocks.size(), w);
  });
  return Status::Ok();
}

}  // namespace cuteattn::detail::cpu
