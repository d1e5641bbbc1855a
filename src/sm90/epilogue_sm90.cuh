// Epilogue of the sm90 forward kernel: writes one consumer warpgroup's O rows, predicated on the sequence's
// rows (varlen tiles end inside the next sequence); softmax normalises them first and writes LSE, HSTU writes
// O as accumulated. Also the O = 0 / LSE = -inf tile for rows that see no key.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "core/params.h"
#include "sm90/kernel_traits_sm90.cuh"
#include "sm90/softmax_sm90.cuh"
#include "sm90/tile_scheduler_sm90.cuh"

namespace cuteattn::sm90 {

using namespace cute;

template <class Traits>
struct ForwardEpilogueSm90 {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kRowsPerWG = kBlockM / Traits::kNumMmaWarpGroups;
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks
  static constexpr int kChunksPerThread = kRowsPerWG * kChunksPerRow / 128;
  static_assert(kRowsPerWG * kChunksPerRow % 128 == 0);

  // `tid`: index among the consumer threads (warpgroup tid / 128 owns rows [64 wg, 64 wg + 64) of the tile).
  // Each thread writes its accumulator's column pairs straight from registers: a quad covers 16 contiguous
  // bytes of a row. (Staging through swizzled smem made ptxas hoist 32 smem addresses per thread out of the
  // persistent loop and spill them; the direct stores cost a few percent of one tile's time at most.)
  // Softmax: O / row sum, and LSE.
  template <class FragO, int kRows>
  CUTE_DEVICE static void store(const detail::Params& p, TileWork const& w, int tid, FragO& tOrO,
                                float const (&inv_sum)[kRows], float const (&lse)[kRows]) {
    cute::Tensor tOrO_rc = cute::make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));  // (rows, cols)
    scale_rows(tOrO_rc, inv_sum);
    store(p, w, tid, tOrO);
    if (p.lse == nullptr || tid % 4 != 0) return;
    cute::Tensor tOcO_rc = row_col_coords(tid);  // (rows, cols)
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = w.m0 + get<0>(tOcO_rc(r, 0));
      if (row < w.seq.sq) p.lse[w.seq.lse_index(p, w.coord.batch, w.coord.head, row)] = lse[r];
    }
  }

  // O as accumulated (HSTU; softmax after normalising).
  template <class FragO>
  CUTE_DEVICE static void store(const detail::Params& p, TileWork const& w, int tid, FragO& tOrO) {
    cute::Tensor tOcO_rc = row_col_coords(tid);  // (rows, cols)
    cute::Tensor tOrOut = cute::make_tensor<Element>(tOrO.layout());  // (MMA, MMA_M, MMA_N)
    convert_fragment(tOrO, tOrOut);
    cute::Tensor tOrOut_rc = cute::make_tensor(tOrOut.data(), acc_rowcol(tOrOut.layout()));  // (rows, cols)

    const int head = w.coord.head, batch = w.coord.batch;
    Element* o = static_cast<Element*>(p.o.ptr);
    CUTE_UNROLL
    for (int r = 0; r < size<0>(tOrOut_rc); ++r) {
      const int64_t row = w.m0 + get<0>(tOcO_rc(r, 0));
      if (row >= w.seq.sq) continue;
      Element* o_row = o + w.seq.q_offset(p.o, batch, row, head);
      // Column pairs (c, c + 1) sit in consecutive values of one row.
      CUTE_UNROLL
      for (int c = 0; c < size<1>(tOrOut_rc); c += 2) {
        const int col = get<1>(tOcO_rc(r, c));
        if (col < p.head_dim_v)
          *reinterpret_cast<uint32_t*>(o_row + col) = pack2(tOrOut_rc(r, c), tOrOut_rc(r, c + 1));
      }
    }
  }

  // Rows that see no key: O = 0, LSE = -inf (SEMANTICS.md section 1).
  CUTE_DEVICE static void store_empty(const detail::Params& p, TileWork const& w, int tid) {
    const int wg = tid / 128, t = tid % 128;
    const int head = w.coord.head, batch = w.coord.batch;
    Element* o = static_cast<Element*>(p.o.ptr);
    CUTE_UNROLL
    for (int k = 0; k < kChunksPerThread; ++k) {
      const int idx = t + k * 128;
      const int64_t grow = w.m0 + wg * kRowsPerWG + idx / kChunksPerRow;
      const int col = idx % kChunksPerRow * 8;
      if (grow < w.seq.sq && col < p.head_dim_v)
        *reinterpret_cast<uint128_t*>(o + w.seq.q_offset(p.o, batch, grow, head) + col) = uint128_t{0, 0};
    }
    const int64_t row = w.m0 + wg * kRowsPerWG + t;
    if (p.lse != nullptr && t < kRowsPerWG && row < w.seq.sq)
      p.lse[w.seq.lse_index(p, batch, head, row)] = -INFINITY;
  }

 private:
  // Tile coordinates (row, column) of this thread's O accumulator values, as (rows, cols).
  CUTE_DEVICE static auto row_col_coords(int tid) {
    typename Traits::TiledMmaPV tiled_mma_pv;
    cute::Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (kBlockM, kHeadDim)
    cute::Tensor tOcO = tiled_mma_pv.get_thread_slice(tid).partition_C(cO);        // (MMA, MMA_M, MMA_N)
    return cute::make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));              // (rows, cols)
  }

  CUTE_DEVICE static uint32_t pack2(Element a, Element b) {
    return uint32_t(reinterpret_cast<uint16_t const&>(a)) | (uint32_t(reinterpret_cast<uint16_t const&>(b)) << 16);
  }
};

}  // namespace cuteattn::sm90
