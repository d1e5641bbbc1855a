// Shared pieces of the CPU tiled forward and backward: tile sizes, per-sequence work items, and the
// loads/stores that move one tile of a strided fp16/bf16/fp32 tensor to and from a contiguous float tile.
#pragma once

#include <cstdint>
#include <vector>

#include "core/params.h"
#include "cpu/element_cpu.h"
#include "cpu/tile_math.h"
#include "variants/mask.h"
#include "variants/sequence.h"

namespace cuteattn::detail::cpu {

// Query rows per tile: K and V tiles are re-read once per query tile, so larger is cheaper until Q, S and the
// output accumulator leave the L2 cache; a multiple of 6, the GEMM micro-kernel's row step.
constexpr int64_t kBlockM = 192;
constexpr int64_t kBlockN = 64;  // keys per tile (a multiple of 16: the GEMM's column step)

// Query-side rows [row0, row0 + rows) of head `head` -> tile[r * ld + c], c < cols.
inline void load_q_tile(const Params& p, const RowMajorView& t, const SequenceInfo& s, int64_t bi, int64_t head,
                        int64_t row0, int64_t rows, int64_t cols, float* tile, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) load_row(t.ptr, p.dtype, s.q_offset(t, bi, row0 + r, head), cols, tile + r * ld);
}
inline void load_k_tile(const Params& p, const RowMajorView& t, const SequenceInfo& s, int64_t bi, int64_t head,
                        int64_t row0, int64_t rows, int64_t cols, float* tile, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) load_row(t.ptr, p.dtype, s.k_offset(t, bi, row0 + r, head), cols, tile + r * ld);
}
// Key-side rows loaded transposed: tile[c * ld + r]. fp32 rows are read in place; others via row_scratch.
inline void load_k_tile_transposed(const Params& p, const RowMajorView& t, const SequenceInfo& s, int64_t bi,
                                   int64_t head, int64_t row0, int64_t rows, int64_t cols, float* tile, int64_t ld,
                                   float* row_scratch) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t offset = s.k_offset(t, bi, row0 + r, head);
    const float* src = static_cast<const float*>(t.ptr) + offset;
    if (p.dtype != DType::kFloat32) {
      load_row(t.ptr, p.dtype, offset, cols, row_scratch);
      src = row_scratch;
    }
    for (int64_t c = 0; c < cols; ++c) tile[c * ld + r] = src[c];
  }
}
inline void store_q_tile(const Params& p, const RowMajorView& t, const SequenceInfo& s, int64_t bi, int64_t head,
                         int64_t row0, int64_t rows, int64_t cols, const float* tile, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) store_row(t.ptr, p.dtype, s.q_offset(t, bi, row0 + r, head), cols, tile + r * ld);
}
inline void store_k_tile(const Params& p, const RowMajorView& t, const SequenceInfo& s, int64_t bi, int64_t head,
                         int64_t row0, int64_t rows, int64_t cols, const float* tile, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) store_row(t.ptr, p.dtype, s.k_offset(t, bi, row0 + r, head), cols, tile + r * ld);
}

// Visibility of one query row as its (at most two) visible key intervals: a cheap per-element test for the
// edge tiles, equivalent to Mask::visible(i, j).
struct RowMask {
  Range first, second;
  RowMask(const Mask& mask, int64_t i) { visible_spans(mask, i, &first, &second); }
  bool visible(int64_t j) const {
    return (j >= first.begin && j < first.end) | (j >= second.begin && j < second.end);
  }
};

// One (sequence, block) pair; sequences of a varlen batch have their own block counts.
struct BlockItem {
  int64_t bi;
  int64_t block;
};

// Every (sequence, block of `block` rows) pair, for row counts taken from each sequence.
inline std::vector<BlockItem> block_items(const Params& p, bool key_side, int64_t block) {
  std::vector<BlockItem> items;
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    const SequenceInfo s = SequenceInfo::of(p, bi);
    const int64_t n = key_side ? s.sk : s.sq;
    for (int64_t b = 0; b * block < n; ++b) items.push_back({bi, b});
  }
  return items;
}

}  // namespace cuteattn::detail::cpu
