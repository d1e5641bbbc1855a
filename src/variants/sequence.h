// Per-sequence lengths and row offsets, for fixed and varlen layouts alike.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/params.h"

namespace cuteattn::detail {

struct SequenceInfo {
  int64_t q_start = 0;  // first global row of this sequence in q / o / lse (varlen) or 0 (fixed)
  int64_t k_start = 0;
  int64_t sq = 0;
  int64_t sk = 0;

  CUTEATTN_HD static SequenceInfo of(const Params& p, int64_t bi) {
    SequenceInfo s;
    if (p.varlen) {
      s.q_start = p.cu_seqlens_q[bi];
      s.k_start = p.cu_seqlens_k[bi];
      s.sq = p.cu_seqlens_q[bi + 1] - s.q_start;
      s.sk = p.cu_seqlens_k[bi + 1] - s.k_start;
    } else {
      s.sq = p.seqlen_q;
      s.sk = p.seqlen_k;
    }
    return s;
  }

  // Element offset of (batch bi, local row, head) in a view.
  CUTEATTN_HD int64_t q_offset(const RowMajorView& t, int64_t bi, int64_t row, int64_t head) const {
    return bi * t.batch_stride + (q_start + row) * t.row_stride + head * t.head_stride;
  }
  CUTEATTN_HD int64_t k_offset(const RowMajorView& t, int64_t bi, int64_t row, int64_t head) const {
    return bi * t.batch_stride + (k_start + row) * t.row_stride + head * t.head_stride;
  }
  // The first row of batch entry bi among all query rows, the entries' rows one after another: q_start (varlen) or
  // bi * seqlen_q (the rows of the backward's dQ workspace).
  CUTEATTN_HD int64_t first_q_row(const Params& p, int64_t bi) const { return p.varlen ? q_start : bi * p.seqlen_q; }
  // Index of LSE(bi, head, local row) in the contiguous LSE buffer.
  CUTEATTN_HD int64_t lse_index(const Params& p, int64_t bi, int64_t head, int64_t row) const {
    return p.varlen ? head * p.total_q + q_start + row : (bi * p.heads + head) * p.seqlen_q + row;
  }
};

}  // namespace cuteattn::detail
