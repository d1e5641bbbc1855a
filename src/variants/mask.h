// The one definition of visibility (SEMANTICS.md sections 1 and 2) and the block ranges derived from it.
// Used by the CPU tiled backend and by every GPU kernel, forward and backward. Row indices `i` are
// 0-based within a sequence; r = i + off is the key position a query row sits at (off = sk - sq).
#pragma once

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

  // Start of the target group holding key position r (r >= hist).
  CUTEATTN_HD int64_t group_start(int64_t r) const { return hist + (r - hist) / group * group; }

  CUTEATTN_HD bool visible(int64_t i, int64_t j) const {
    if (i < 0 || i >= sq || j < 0 || j >= sk) return false;
    const int64_t r = i + off;
    if (r >= hist) return j < hist || (j >= group_start(r) && j <= r);  // target row
    if (r < n_ctx) return j < hist;                                      // contextual row
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
    if (r0 < n_ctx && r0 < hist) hi = max64(hi, hist);  // contextual rows see the whole history
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
    if (n_ctx > 0 && j0 < hist) r_lo = off;         // contextual rows see keys below hist
    if (hist < sk) r_hi = sk;                      // target rows reach every history key
    return {max64(r_lo - off, 0), min64(r_hi - off, sq)};
  }

  // True when every (i, j) in [i0, i1) x [j0, j1) is visible, so the tile needs no element mask.
  // Conservative: may answer false for a fully visible tile, never true for a partial one.
  CUTEATTN_HD bool tile_fully_visible(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    if (i0 < 0 || i1 > sq || j0 < 0 || j1 > sk || i0 >= i1 || j0 >= j1) return false;
    const int64_t r0 = i0 + off, r1 = i1 - 1 + off;
    // Contextual rows [r0, min(r1, n_ctx - 1, hist - 1)] see exactly [0, hist).
    if (r0 < n_ctx && r0 < hist && j1 > hist) return false;
    // Plain rows [a, b] follow the window.
    const int64_t a = max64(r0, n_ctx), b = min64(r1, hist - 1);
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

}  // namespace cuteattn::detail
