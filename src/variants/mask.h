// The one definition of visibility (SEMANTICS.md sections 1 and 2) and the block ranges derived from it.
// Used by the CPU tiled backend and by every GPU kernel, forward and backward. Row indices `i` are
// 0-based within a sequence; r = i + off is the key position a query row sits at (off = sk - sq).
#pragma once

#include <climits>
#include <cstdint>

#include "core/host_device.h"
#include "core/params.h"
#include "variants/sequence.h"

namespace cuteattn::detail {

struct Range {
  int64_t begin = 0;  // inclusive
  int64_t end = 0;    // exclusive; begin >= end means empty
  CUTEATTN_HD bool empty() const { return begin >= end; }
};

CUTEATTN_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
CUTEATTN_HD int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
// Floor and ceiling of x / d for d > 0, x of either sign.
CUTEATTN_HD int64_t floor_div64(int64_t x, int64_t d) { return x >= 0 ? x / d : -((d - 1 - x) / d); }
CUTEATTN_HD int64_t ceil_div64(int64_t x, int64_t d) { return -floor_div64(-x, d); }

struct Mask {
  int64_t sq = 0, sk = 0, off = 0;
  int64_t left = -1, right = -1;  // window in key positions relative to r; -1 = unbounded
  int64_t n_ctx = 0;              // rows r < n_ctx (and r < hist) see every key j < hist
  int64_t hist = 0;               // sk - num_targets; rows r >= hist are target rows
  int64_t group = 1;              // target group size

  CUTEATTN_HD static Mask of(const Params& p, const SequenceInfo& s, int64_t bi) {
    Mask m;
    m.sq = s.sq;
    m.sk = s.sk;
    m.off = s.sk - s.sq;
    m.left = p.window_left;
    m.right = p.window_right;
    m.n_ctx = p.num_contexts ? p.num_contexts[bi] : 0;
    m.hist = s.sk - (p.num_targets ? p.num_targets[bi] : 0);
    m.group = p.target_group_size;
    return m;
  }

  // Start of the target group holding key position r (r >= hist). Positions inside a sequence fit 32 bits
  // (cu_seqlens are int32), and a 32-bit division is a few instructions where a 64-bit one is a call.
  CUTEATTN_HD int64_t group_start(int64_t r) const {
    const uint32_t g = group > INT32_MAX ? uint32_t(INT32_MAX) : uint32_t(group);
    return hist + int64_t(uint32_t(r - hist) / g * g);
  }

  CUTEATTN_HD bool visible(int64_t i, int64_t j) const {
    if (i < 0 || i >= sq || j < 0 || j >= sk) return false;
    const int64_t r = i + off;
    if (r >= hist) return j < hist || (j >= group_start(r) && j <= r);  // target row
    if (r >= 0 && r < n_ctx) return j < hist;                            // contextual row
    if (right >= 0 && j > r + right) return false;
    if (left >= 0 && j < r - left) return false;
    return true;
  }

  // Keys visible to at least one row of [i0, i1): a superset, exact for window/causal masks.
  CUTEATTN_HD Range key_range(int64_t i0, int64_t i1) const {
    i0 = max64(i0, 0);
    i1 = min64(i1, sq);
    if (i0 >= i1 || sk == 0) return {0, 0};
    const int64_t r0 = i0 + off, r1 = i1 - 1 + off;
    int64_t lo = left >= 0 ? r0 - left : 0;
    int64_t hi = right >= 0 ? r1 + right + 1 : sk;
    if (r1 >= 0 && r0 < n_ctx && r0 < hist) {  // contextual rows see the whole history
      lo = 0;
      hi = max64(hi, hist);
    }
    if (r1 >= hist) lo = 0;                             // target rows see the whole history
    return {max64(lo, 0), min64(hi, sk)};
  }

  // Rows that see at least one key of [j0, j1): a superset, exact for window/causal masks.
  CUTEATTN_HD Range row_range(int64_t j0, int64_t j1) const {
    j0 = max64(j0, 0);
    j1 = min64(j1, sk);
    if (j0 >= j1 || sq == 0) return {0, 0};
    int64_t r_lo = right >= 0 ? j0 - right : off;  // key positions; off is row 0
    int64_t r_hi = left >= 0 ? j1 + left : sk;     // exclusive
    if (n_ctx > 0 && j0 < hist) {  // contextual rows see keys below hist
      r_lo = off;
      r_hi = max64(r_hi, min64(n_ctx, hist));
    }
    if (hist < sk) {
      // Target rows reach every history key; a target key j is seen only by target rows r >= j of its group.
      r_hi = j0 < hist ? sk : max64(min64(r_hi, hist), group_start(j1 - 1) + group);
    }
    return {max64(r_lo - off, 0), min64(r_hi - off, sq)};
  }

  // Keys inside key_range(i0, i1) that no row of [i0, i1) sees: target keys below the first target group the
  // rows reach (a tile of target rows sees the history and its own groups only). Empty for all other masks.
  // A subset of the hidden keys, so a kernel may skip every key block that lies inside it.
  CUTEATTN_HD Range key_hole(int64_t i0, int64_t i1) const {
    i0 = max64(i0, 0);
    i1 = min64(i1, sq);
    if (i0 >= i1 || hist >= sk) return {0, 0};
    const int64_t r0 = i0 + off, r1 = i1 - 1 + off;
    const int64_t ta = max64(r0, hist);  // first target row
    if (ta > r1) return {0, 0};
    int64_t begin = hist;
    if (r0 < hist) {  // rows below hist see at most up to the window's right edge of the last of them
      const int64_t last = min64(r1, hist - 1);
      begin = max64(begin, right >= 0 ? last + right + 1 : sk);
    }
    return {begin, group_start(ta)};
  }

  // True when every (i, j) in [i0, i1) x [j0, j1) is visible, so the tile needs no element mask.
  // Conservative: may answer false for a fully visible tile, never true for a partial one.
  CUTEATTN_HD bool tile_fully_visible(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    if (i0 < 0 || i1 > sq || j0 < 0 || j1 > sk || i0 >= i1 || j0 >= j1) return false;
    const int64_t r0 = i0 + off, r1 = i1 - 1 + off;
    // Contextual rows [max(r0, 0), min(r1, n_ctx - 1, hist - 1)] see exactly [0, hist).
    if (max64(r0, 0) <= min64(min64(r1, n_ctx - 1), hist - 1) && j1 > hist) return false;
    // Plain rows are [r0, r1] outside the contextual rows [0, n_ctx) and the target rows [hist, sk); they
    // follow the window, so the first (a) and last (b) of them decide.
    const int64_t plain_hi = min64(r1, hist - 1);
    const int64_t a = (r0 < 0 || n_ctx <= 0) ? r0 : max64(r0, n_ctx);
    const int64_t b = (n_ctx <= 0 || plain_hi >= n_ctx) ? plain_hi : min64(plain_hi, -1);
    if (a <= b) {
      if (right >= 0 && a + right < j1 - 1) return false;
      if (left >= 0 && b - left > j0) return false;
    }
    // Target rows [ta, r1] see [0, hist) and [group_start(r), r].
    const int64_t ta = max64(r0, hist);
    if (ta <= r1 && j1 > hist) {
      const int64_t g = group_start(r1);
      if (j1 - 1 > ta) return false;
      if (g != hist && j0 < g) return false;
    }
    return true;
  }
};

// Key blocks [k * block, (k + 1) * block) that lie wholly inside `hole` (for skipping Mask::key_hole).
CUTEATTN_HD Range blocks_inside(Range hole, int64_t block) {
  if (hole.empty()) return {0, 0};
  return {(max64(hole.begin, 0) + block - 1) / block, hole.end / block};
}

// The key blocks k (keys [k * block, (k + 1) * block)) for which m.tile_fully_visible(i0, i1, ...) holds, as
// two ranges of block indices: `first` below hist, `second` from hist's block up (target keys; empty without
// targets). A kernel tests each block against four bounds found once per tile instead of asking the mask per
// block. For every k >= 0: tile_fully_visible(i0, i1, k * block, (k + 1) * block) == (k in first || k in second).
CUTEATTN_HD void fully_visible_blocks(const Mask& m, int64_t i0, int64_t i1, int64_t block, Range* first,
                                      Range* second) {
  *first = {0, 0};
  *second = {0, 0};
  if (i0 < 0 || i1 > m.sq || i0 >= i1) return;
  const int64_t r0 = i0 + m.off, r1 = i1 - 1 + m.off;
  // Blocks inside [0, sk) that every plain (window-following) row of the tile sees whole.
  Range all = {0, floor_div64(m.sk, block)};
  const int64_t plain_hi = min64(r1, m.hist - 1);
  const int64_t a = (r0 < 0 || m.n_ctx <= 0) ? r0 : max64(r0, m.n_ctx);
  const int64_t b = (m.n_ctx <= 0 || plain_hi >= m.n_ctx) ? plain_hi : min64(plain_hi, -1);
  if (a <= b) {
    if (m.right >= 0) all.end = min64(all.end, floor_div64(a + m.right + 1, block));
    if (m.left >= 0) all.begin = max64(all.begin, ceil_div64(b - m.left, block));
  }
  const int64_t hist_block = floor_div64(m.hist, block);  // blocks from here on hold keys >= hist
  *first = {all.begin, min64(all.end, hist_block)};
  // Contextual rows see no key >= hist.
  if (max64(r0, 0) <= min64(min64(r1, m.n_ctx - 1), m.hist - 1)) return;
  Range above = {max64(all.begin, hist_block), all.end};
  const int64_t ta = max64(r0, m.hist);  // target rows [ta, r1] see [group_start(r), r] above hist
  if (ta <= r1) {
    above.end = min64(above.end, floor_div64(ta + 1, block));
    const int64_t g = m.group_start(r1);
    if (g != m.hist) above.begin = max64(above.begin, ceil_div64(g, block));
  }
  *second = above;
}

// The query blocks q (rows [q * bm, (q + 1) * bm)) whose tile with keys [j0, j0 + bn) tile_fully_visible accepts,
// as one range of block indices (empty where begin >= end): exact for window masks; a subset with contextual or
// target rows, leaving out tiles that hold contextual rows, and tiles that hold target rows where the keys reach
// past hist (a kernel masks those per element). The plain rows follow the window: the first row of a tile bounds
// its right edge, the last row its left edge (for target rows inside the tile, which see all of [j0, j0 + bn)
// when it lies below hist, the last-row bound only narrows the range).
CUTEATTN_HD Range fully_visible_query_blocks(const Mask& m, int64_t j0, int64_t bm, int64_t bn) {
  const int64_t j1 = j0 + bn;
  if (j0 < 0 || j1 > m.sk) return {0, 0};
  int64_t lo = 0, hi = m.sq / bm;  // whole blocks inside the rows
  // right: q bm + off + right >= j1 - 1; left: q bm + bm - 1 + off - left <= j0.
  if (m.right >= 0) lo = max64(lo, ceil_div64(j1 - 1 - m.off - m.right, bm));
  if (m.left >= 0) hi = min64(hi, floor_div64(j0 + m.left + 1 - m.off - bm, bm) + 1);
  // Contextual rows are [0, min(n_ctx, hist)): the first row past them.
  const int64_t ctx_end = min64(m.n_ctx, m.hist);
  if (ctx_end > 0) lo = max64(lo, ceil_div64(ctx_end - m.off, bm));
  // Keys past hist: the last row below hist.
  if (j1 > m.hist) hi = min64(hi, floor_div64(m.hist - m.off - bm, bm) + 1);
  return {lo, max64(hi, lo)};
}

// The keys visible to row i as the union of two ranges (`second` is empty except for target rows), so a
// kernel masks a tile row with interval tests instead of calling visible() per element.
// For every j: visible(i, j) == (j in first || j in second).
CUTEATTN_HD void visible_spans(const Mask& m, int64_t i, Range* first, Range* second) {
  *first = {0, 0};
  *second = {0, 0};
  if (i < 0 || i >= m.sq) return;
  const int64_t r = i + m.off;
  const int64_t hist = max64(min64(m.hist, m.sk), 0);
  if (r >= m.hist) {  // target row
    *first = {0, hist};
    *second = {max64(m.group_start(r), 0), min64(r + 1, m.sk)};
    return;
  }
  if (r >= 0 && r < m.n_ctx) {  // contextual row
    *first = {0, hist};
    return;
  }
  const int64_t lo = m.left >= 0 ? r - m.left : 0;
  const int64_t hi = m.right >= 0 ? r + m.right + 1 : m.sk;
  *first = {max64(lo, 0), min64(hi, m.sk)};
}

// Masks that are windows only (softmax: no contextual or target rows, so n_ctx = 0 and hist = sk): the same
// answers as fully_visible_blocks and visible_spans without their contextual and target cases, which the sm90
// forward's per-tile mask setup paid for in 64 bits (H100, softmax d 64 s 512 causal: ~170 of ~1800
// instructions per warp and tile went to mask.h).

// A window mask of one sequence in 32 bits, for per-tile plans of kernels whose rows and keys lie below 2^31
// (the sm90 forward: ~150 of its per-tile instructions went to the same answers in 64 bits). The bounds are
// normalised by bound(): a window side that reaches past every key of every row is unbounded (-1), so a bounded
// left < sk and right < sq, and no sum below leaves int32.
struct Window32 {
  int sq = 0, sk = 0;
  int left = -1, right = -1;

  // Row positions r lie in [sk - sq, sk): left >= sk never cuts a key j >= 0 (r - left < 0), right >= sq never
  // cuts a key j < sk (r + right >= sk). `limit` may be an upper bound of the sequences' sk (or sq).
  static int bound(int64_t side, int64_t limit) { return side < 0 || side >= limit ? -1 : int(side); }

  // The keys rows [i0, i1) see, 0 <= i0 < i1 <= sq: [*begin, *end), empty where begin >= end. Exact, where
  // Mask::key_range may answer wider (rows before the first key, sq > sk, take its contextual-row case).
  CUTEATTN_HD void key_range(int i0, int i1, int* begin, int* end) const {
    const int off = sk - sq;
    const int r0 = i0 + off, r1 = i1 - 1 + off;
    *begin = left >= 0 && r0 - left > 0 ? r0 - left : 0;
    *end = right >= 0 && right < sk - 1 - r1 ? r1 + right + 1 : sk;
  }

  // fully_visible_blocks of rows [i0, i1), 0 <= i0 < i1 <= sq, for blocks of `block` keys: blocks
  // [*begin, *end) are visible whole to every row (a window has no `second` range).
  CUTEATTN_HD void full_blocks(int i0, int i1, int block, int* begin, int* end) const {
    const int off = sk - sq;
    *end = sk / block;
    if (right >= 0 && right < sk - (i0 + off)) {  // the first row's span ends first, inside the keys
      const int e = i0 + off + right + 1;
      *end = e >= 0 ? min(*end, e / block) : -1;
    }
    *begin = 0;
    if (left >= 0) {  // the last row's span starts last
      const int b = i1 - 1 + off - left;
      *begin = b > 0 ? int((uint32_t(b) + uint32_t(block) - 1) / uint32_t(block)) : 0;
    }
  }

 private:
  CUTEATTN_HD static int min(int a, int b) { return a < b ? a : b; }
};

// visible_spans of rows i0 + t of a window mask, in 32 bits: row i0 + t (inside the sequence) sees keys
// [lo(t), hi(t)) for 0 <= t < 2^30 with sk + t < 2^31. The ends are clamped to [-2^30, sk] once, so each row
// costs an add and a min or max.
struct WindowSpans {
  int lo0 = 0, hi0 = 0, sk = 0;

  CUTEATTN_HD static WindowSpans of(const Mask& m, int64_t i0) {
    constexpr int64_t kFar = int64_t(1) << 30;
    const int64_t r0 = i0 + m.off;
    const int64_t lo = m.left >= 0 ? r0 - m.left : -kFar;
    const int64_t hi = m.right >= 0 ? r0 + m.right + 1 : m.sk;
    return {int(min64(max64(lo, -kFar), m.sk)), int(min64(max64(hi, -kFar), m.sk)), int(m.sk)};
  }
  // The same from a Window32, without 64-bit math.
  CUTEATTN_HD static WindowSpans of(const Window32& w, int i0) {
    constexpr int kFar = 1 << 30;
    const int r0 = i0 + (w.sk - w.sq);
    const int lo = w.left >= 0 && r0 - w.left > -kFar ? r0 - w.left : -kFar;
    int hi = w.right >= 0 && w.right < w.sk - r0 ? r0 + w.right + 1 : w.sk;
    hi = hi > -kFar ? hi : -kFar;
    return {lo, hi, w.sk};
  }
  CUTEATTN_HD int lo(int t) const { return lo0 + t > 0 ? lo0 + t : 0; }
  CUTEATTN_HD int hi(int t) const { return hi0 + t < sk ? hi0 + t : sk; }
};

}  // namespace cuteattn::detail
