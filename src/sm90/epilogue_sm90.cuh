// Epilogue of the sm90 forward kernel: writes one consumer warpgroup's O rows; softmax normalises them first and
// writes LSE (direct stores), HSTU writes O as accumulated. Where the traits have room (kStoreOWithTma), O goes
// through a shared-memory staging tile, and from there by a TMA store where the warpgroup's 64 rows lie inside
// the sequence, by 16-byte copies predicated on the sequence's rows where they do not (varlen tiles ending
// inside the next sequence); otherwise (large head dims, packed GQA tiles whose rows are (query row, head) pairs,
// split-KV partials) straight from registers. Also the O = 0 /
// LSE = -inf tile for rows that see no key. Split-KV tiles write fp32 partials into the workspace instead.
#pragma once

#include <cmath>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>

#include "core/params.h"
#include "sm90/kernel_traits_sm90.cuh"
#include "sm90/named_barriers_sm90.cuh"
#include "sm90/softmax_sm90.cuh"
#include "sm90/tile_scheduler_sm90.cuh"

namespace cuteattn::sm90 {

using namespace cute;

template <class Traits>
struct ForwardEpilogueSm90 {
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kRowsPerWG = Traits::kRowsPerWarpGroup;
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks
  static constexpr int kChunksPerThread = kRowsPerWG * kChunksPerRow / 128;
  static_assert(kRowsPerWG * kChunksPerRow % 128 == 0);

  // `tid`: index among the consumer threads (warpgroup tid / 128 owns rows [64 wg, 64 wg + 64) of the tile).
  // Softmax: O / row sum, and LSE.
  template <class KernelParams, class FragO, int kRows>
  CUTE_DEVICE static void store(KernelParams const& kp, SharedStorage& ss, TileWork const& w, int tid, FragO& tOrO,
                                float const (&inv_sum)[kRows], float const (&lse)[kRows]) {
    const detail::Params& p = kp.params;
    cute::Tensor tOrO_rc = cute::make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));  // (rows, cols)
    scale_rows(tOrO_rc, inv_sum);
    if constexpr (Traits::kSplitKv) {
      store_partial(kp, w, tid, tOrO, lse);
      return;
    }
    store(kp, ss, w, tid, tOrO);
    if (p.lse == nullptr || tid % 4 != 0) return;
    cute::Tensor tOcO_rc = row_col_coords(tid);  // (rows, cols)
    if constexpr (Traits::kPackGqa) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const RowHead rh = row_head(kp, w, 0, get<0>(tOcO_rc(r, 0)));
        if (rh.row < w.seq.sq) p.lse[w.seq.lse_index(p, w.coord.batch, rh.head, rh.row)] = lse[r];
      }
    } else {
      // A head's LSE rows are contiguous: one 64-bit index for the tile, 32-bit row offsets from it.
      float* lse_tile = p.lse + w.seq.lse_index(p, w.coord.batch, w.coord.head, w.m0);
      const int rows = rows_in_sequence(w);
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int i = get<0>(tOcO_rc(r, 0));
        if (i < rows) lse_tile[i] = lse[r];
      }
    }
  }

  // O as accumulated (HSTU; softmax after normalising).
  template <class KernelParams, class FragO>
  CUTE_DEVICE static void store(KernelParams const& kp, SharedStorage& ss, TileWork const& w, int tid, FragO& tOrO) {
    cute::Tensor tOrOut = cute::make_tensor<Element>(tOrO.layout());  // (MMA, MMA_M, MMA_N)
    convert_fragment(tOrO, tOrOut);
    if constexpr (Traits::kStoreOWithTma) {
      store_through_smem(kp, ss, w, tid, tOrOut);
    } else {
      store_from_registers(kp, w, tid, tOrOut);
    }
  }

  // After a consumer thread's last tile: its warpgroup's last TMA store has read the staging tile (the shared
  // memory must outlive the store).
  CUTE_DEVICE static void drain(int tid) {
    if constexpr (Traits::kStoreOWithTma) {
      if (tid % 128 == 0) tma_store_wait<0>();
    }
  }

  // Rows that see no key: O = 0, LSE = -inf (SEMANTICS.md section 1).
  template <class KernelParams>
  CUTE_DEVICE static void store_empty(KernelParams const& kp, TileWork const& w, int tid) {
    const detail::Params& p = kp.params;
    const int wg = tid / 128, t = tid % 128;
    const int batch = w.coord.batch;
    if constexpr (Traits::kSplitKv) {
      // A split without keys: LSE = -inf, which the combine weighs 0 (its partial O is never read).
      const RowHead rh = row_head(kp, w, wg * kRowsPerWG, t);
      if (t < kRowsPerWG && rh.row < w.seq.sq)
        kp.lse_partial[w.split * kp.partial_rows + w.seq.lse_index(p, batch, rh.head, rh.row)] = -INFINITY;
      return;
    }
    Element* o = static_cast<Element*>(p.o.ptr);
    // Not unrolled: unrolled, ptxas computed every chunk's (row, column) once before the persistent loop and
    // kept them for this rare path, which spilled.
#pragma unroll 1
    for (int k = 0; k < kChunksPerThread; ++k) {
      const int idx = t + k * 128;
      const RowHead rh = row_head(kp, w, wg * kRowsPerWG, idx / kChunksPerRow);
      const int col = idx % kChunksPerRow * 8;
      if (rh.row < w.seq.sq && col < p.head_dim_v)
        *reinterpret_cast<uint128_t*>(o + w.seq.q_offset(p.o, batch, rh.row, rh.head) + col) = uint128_t{0, 0};
    }
    const RowHead rh = row_head(kp, w, wg * kRowsPerWG, t);
    if (p.lse != nullptr && t < kRowsPerWG && rh.row < w.seq.sq)
      p.lse[w.seq.lse_index(p, batch, rh.head, rh.row)] = -INFINITY;
  }

 private:
  // Registers -> staging tile (stmatrix) -> one TMA store of the warpgroup's 64 rows, issued by its first thread
  // and left in flight: the next tile's epilogue waits only until the store has read the staging tile. A varlen
  // box past the sequence's last row would overwrite the next sequence's rows (fixed lengths: TMA clips at the
  // tensor's end): such a warpgroup's threads copy the rows inside the sequence out of the staging tile, 16
  // bytes at a time; the next epilogue's first barrier waits for their reads.
  template <class KernelParams, class FragOut>
  CUTE_DEVICE static void store_through_smem(KernelParams const& kp, SharedStorage& ss, TileWork const& w, int tid,
                                             FragOut const& tOrOut) {
    if constexpr (Traits::kStoreOWithTma) {
      const int wg = tid / 128, t = tid % 128;
      const FwdBarrier staging = offset(FwdBarrier::kEpilogueWG0, wg);
      if (t == 0) tma_store_wait<0>();
      barrier_sync(128, staging);
      cute::Tensor sO = cute::make_tensor(make_smem_ptr(ss.o.o.data()), typename Traits::SmemLayoutO{});  // (64, kHeadDim, warpgroups)
      typename Traits::SmemCopyO smem_copy_o;
      auto thr_copy_o = smem_copy_o.get_thread_slice(t);
      cute::Tensor tOrO_copy = thr_copy_o.retile_S(tOrOut);  // (CPY, CPY_M, CPY_N)
      cute::Tensor tOsO = thr_copy_o.partition_D(sO);        // (CPY, CPY_M, CPY_N, warpgroups)
      cute::copy(smem_copy_o, tOrO_copy, tOsO(_, _, _, wg));
      tma_store_fence();  // the generic-proxy writes above, visible to the TMA unit
      barrier_sync(128, staging);
      const int first_row = wg * kRowsPerWG;
      if (kp.params.varlen && w.m0 + first_row + kRowsPerWG > w.seq.sq) {
        copy_rows_from_smem(kp, w, t, first_row, sO);
        return;
      }
      if (t == 0) {
        const int batch = kp.params.varlen ? 0 : w.coord.batch;
        cute::Tensor mO = kp.tma_o.get_tma_tensor(kp.shape_q);  // (rows_q, d, h, b)
        cute::Tensor gO =
            local_tile(domain_offset(make_coord(int(w.seq.q_start), _0{}), mO(_, _, w.coord.head, batch)),
                       Shape<Int<kRowsPerWG>, Int<kHeadDim>>{},
                       make_coord(w.coord.m_block * Traits::kNumMmaWarpGroups + wg, _0{}));  // (64, kHeadDim)
        auto o_part = tma_partition(kp.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO), group_modes<0, 2>(gO));
        cute::Tensor tOgO = get<0>(o_part);      // (TMA)
        cute::Tensor tOsO_tma = get<1>(o_part);  // (TMA, warpgroups)
        copy(kp.tma_o, tOsO_tma(_, wg), tOgO);
        tma_store_arrive();
      }
    }
  }

  // The rows of warpgroup rows [first_row, first_row + 64) inside the sequence, from the staging tile sO
  // (64, kHeadDim, warpgroups): thread t copies the 16-byte chunks t, t + 128, ... (8 columns each).
  template <class KernelParams, class TensorO>
  CUTE_DEVICE static void copy_rows_from_smem(KernelParams const& kp, TileWork const& w, int t, int first_row,
                                              TensorO const& sO) {
    const detail::Params& p = kp.params;
    const int rows = rows_in_sequence(w) - first_row;
    const int wg = first_row / kRowsPerWG;
    Element* o_tile = static_cast<Element*>(p.o.ptr) + w.seq.q_offset(p.o, w.coord.batch, w.m0 + first_row,
                                                                       w.coord.head);
    CUTE_UNROLL
    for (int k = 0; k < kChunksPerThread; ++k) {
      const int idx = t + k * 128;
      const int i = idx / kChunksPerRow, col = idx % kChunksPerRow * 8;
      if (i < rows && col < p.head_dim_v) {
        *reinterpret_cast<uint128_t*>(o_tile + int64_t(i) * p.o.row_stride + col) =
            *reinterpret_cast<uint128_t const*>(&sO(i, col, wg));
      }
    }
  }

  // Straight from registers. A thread holds two columns of each 8-column block of its rows, a quad (lanes 4g to
  // 4g + 3) the whole block: a 4 x 4 transpose within the quad (quad_transpose) gives each of its threads a whole
  // block of every four, stored as 16 bytes. H100 bf16, softmax d 256: the 4-byte column-pair stores (a warp's
  // store touching 8 rows for 128 bytes) cost 16-24% of the forward time at s 512-1k (time without them, same
  // process: s 512 421 -> 547 TFLOP/s, causal 247 -> 326, s 1k 570 -> 678).
  template <class KernelParams, class FragOut>
  CUTE_DEVICE static void store_from_registers(KernelParams const& kp, TileWork const& w, int tid,
                                               FragOut const& tOrOut) {
    const detail::Params& p = kp.params;
    cute::Tensor tOcO_rc = row_col_coords(tid);  // (rows, cols)
    cute::Tensor tOrOut_rc = cute::make_tensor(tOrOut.data(), acc_rowcol(tOrOut.layout()));  // (rows, cols)
    constexpr int kCols = decltype(size<1>(tOrOut_rc))::value;  // 2 per 8-column block
    static_assert(kCols % 8 == 0, "blocks of 8 columns in fours");
    const int q = tid % 4;
    const int batch = w.coord.batch;
    Element* o = static_cast<Element*>(p.o.ptr);
    // Unpacked, the tile's rows are one head's: one 64-bit offset for the tile, rows from it.
    Element* o_tile = Traits::kPackGqa ? o : o + w.seq.q_offset(p.o, batch, w.m0, w.coord.head);
    const int rows = rows_in_sequence(w);
    CUTE_UNROLL
    for (int r = 0; r < size<0>(tOrOut_rc); ++r) {
      // The whole quad shuffles; only rows inside the sequence store.
      Element* o_row;
      bool inside;
      if constexpr (Traits::kPackGqa) {
        const RowHead rh = row_head(kp, w, 0, get<0>(tOcO_rc(r, 0)));
        inside = rh.row < w.seq.sq;
        o_row = o + w.seq.q_offset(p.o, batch, inside ? rh.row : 0, rh.head);
      } else {
        const int i = get<0>(tOcO_rc(r, 0));
        inside = i < rows;
        o_row = o_tile + int64_t(i) * p.o.row_stride;
      }
      CUTE_UNROLL
      for (int c = 0; c < kCols; c += 8) {
        // Pieces k = 0..3: this thread's column pair of block c / 2 + k.
        uint32_t piece[4];
        CUTE_UNROLL
        for (int k = 0; k < 4; ++k) piece[k] = pack2(tOrOut_rc(r, c + 2 * k), tOrOut_rc(r, c + 2 * k + 1));
        quad_transpose(piece, q);
        // This thread's pair of the first block starts at column 8 * (c / 2) + 2q; its block now is c / 2 + q.
        const int col = get<1>(tOcO_rc(r, c)) + 6 * q;
        if (inside && col < p.head_dim_v)
          *reinterpret_cast<uint4*>(o_row + col) = make_uint4(piece[0], piece[1], piece[2], piece[3]);
      }
    }
  }

  // Quad lane q holds piece[k] = its part of block k (k = 0..3) and ends with piece[k] = lane k's part of block q:
  // an exchange with lane q ^ 1, then one with lane q ^ 2, of the pieces k and k ^ m that differ in bit m: the lane
  // with bit m set gives its piece k (bit m clear) for the partner's piece k ^ m, the other the reverse.
  CUTE_DEVICE static void quad_transpose(uint32_t (&piece)[4], int q) {
    CUTE_UNROLL
    for (int m = 1; m <= 2; m *= 2) {
      const bool upper = q & m;
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) {
        if (k & m) continue;
        const uint32_t got = __shfl_xor_sync(0xffffffffu, upper ? piece[k] : piece[k + m], m);
        if (upper) {
          piece[k] = got;
        } else {
          piece[k + m] = got;
        }
      }
    }
  }

  // Split-KV: the normalised O of this split (fp32) and its LSE into the workspace partials, at row
  // split * partial_rows + lse_index(batch, head, row) of (rows, d) and (rows) (Sm90Forward::workspace_bytes).
  template <class KernelParams, class FragO, int kRows>
  CUTE_DEVICE static void store_partial(KernelParams const& kp, TileWork const& w, int tid, FragO const& tOrO,
                                        float const (&lse)[kRows]) {
    const detail::Params& p = kp.params;
    cute::Tensor tOcO_rc = row_col_coords(tid);                                          // (rows, cols)
    cute::Tensor tOrO_rc = cute::make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));  // (rows, cols)
    static_assert(decltype(size<0>(tOrO_rc))::value == kRows);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const RowHead rh = row_head(kp, w, 0, get<0>(tOcO_rc(r, 0)));
      if (rh.row >= w.seq.sq) continue;
      const int64_t idx = w.split * kp.partial_rows + w.seq.lse_index(p, w.coord.batch, rh.head, rh.row);
      float* o_row = kp.o_partial + idx * p.head_dim_v;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(tOrO_rc); c += 2) {
        const int col = get<1>(tOcO_rc(r, c));
        if (col < p.head_dim_v) *reinterpret_cast<float2*>(o_row + col) = make_float2(tOrO_rc(r, c), tOrO_rc(r, c + 1));
      }
      if (tid % 4 == 0) kp.lse_partial[idx] = lse[r];
    }
  }

  // Query row (within the sequence) and query head of tile row first + i (packed GQA: unpack_row); unpacked
  // the row is (m0 + first) + i in 64 bits.
  struct RowHead {
    int64_t row;
    int head;
  };
  template <class KernelParams>
  CUTE_DEVICE static RowHead row_head(KernelParams const& kp, TileWork const& w, int first, int i) {
    if constexpr (Traits::kPackGqa) {
      const PackedRow pr = unpack_row(w.coord.m_block * kBlockM + first + i, kp.heads_per_kv);
      return {pr.row, w.coord.head * kp.heads_per_kv + pr.head_in_group};
    } else {
      return {w.m0 + first + i, w.coord.head};
    }
  }

  // The tile's rows inside its sequence (unpacked tiles: from m0), capped at kBlockM; 32 bits.
  CUTE_DEVICE static int rows_in_sequence(TileWork const& w) {
    return w.seq.sq - w.m0 < kBlockM ? int(w.seq.sq - w.m0) : kBlockM;
  }

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
