// Mainloop of the sm90 forward kernel for one tile of kBlockM (128 or 192) query rows.
// Producer (one warp): TMA loads of Q (packed GQA: cp.async gathers) and of the K/V blocks into the shared ring,
// K one block ahead of V (HSTU with rab: each block's rab tiles with its K, one per block or one per consumer
// warpgroup; the consumers start S from them).
// Consumers (two or three warpgroups of 64 rows): S = Q K^T (wgmma from smem), softmax or the HSTU score,
// O += P V (P from registers), with the score of block n overlapping P V of block n + 1 within a warpgroup, and
// the wgmmas of the warpgroups taking turns (pingpong) so one warpgroup's score work hides behind the others'
// tensor-core work.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "core/params.h"
#include "sm90/hstu_sm90.cuh"
#include "sm90/kernel_traits_sm90.cuh"
#include "sm90/named_barriers_sm90.cuh"
#include "sm90/softmax_sm90.cuh"
#include "sm90/tile_scheduler_sm90.cuh"

namespace cuteattn::sm90 {

using namespace cute;

// One warpgroup-wide wgmma batch C (+)= A B over all k slices; returns without waiting (the caller picks
// the warpgroup_wait depth). `zero_init` is a run-time flag: wgmma takes scale-d as a predicate.
template <bool kARegisters, class TiledMma, class TensorA, class TensorB, class TensorC>
CUTE_DEVICE void warpgroup_gemm(TiledMma& tiled_mma, TensorA const& tCrA, TensorB const& tCrB, TensorC& tCrC,
                                bool zero_init) {
  if constexpr (kARegisters) warpgroup_fence_operand(const_cast<TensorA&>(tCrA));
  warpgroup_fence_operand(tCrC);
  warpgroup_arrive();
  tiled_mma.accumulate_ = zero_init ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), tCrC);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tCrC);
  if constexpr (kARegisters) warpgroup_fence_operand(const_cast<TensorA&>(tCrA));
}

// The slot, phase and count of the n-th use (from 0) of a ring of kSlots slots: a consumer starts in phase 0, a
// producer in phase 1 (the ring starts empty).
template <class PipelineState, int kSlots, bool kProducer>
CUTE_DEVICE PipelineState ring_position(uint32_t n) {
  return PipelineState(int(n % kSlots), ((n / kSlots) & 1) ^ uint32_t(kProducer), n);
}

// The ring slot (or Q slot) `slot` as a warp-uniform value: redux.sync writes a uniform register, so ptxas derives
// the wgmma descriptors of the slot (start address + k offset) in the uniform datapath. From the per-thread slot
// it built each 64-bit descriptor in regular registers and moved both halves over (R2UR) for every wgmma, 4
// instructions per k slice of K or V; now 2 to 3 (bf16 SASS, key-block loop: d 64 468 -> 461, d 128 527 -> 516).
CUTE_DEVICE int uniform_slot(int slot) { return __reduce_max_sync(0xffffffffu, slot); }

// Score transform before masking: plain scores stay raw (scaled inside exp2); with softcap
// S = softcap * tanh(scale * qk / softcap), then used with scale_log2 = log2(e).
struct ScoreTransform {
  float softcap = 0.0f;         // 0 = off
  float scale_over_cap = 0.0f;  // scale / softcap
  float scale_log2 = 0.0f;      // multiplies the transformed score into log2 units

  template <class Tensor0>
  CUTE_DEVICE void apply(Tensor0& tSrS) const {
    if (softcap > 0.0f) {
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) tSrS(i) = softcap * tanhf(tSrS(i) * scale_over_cap);
    }
  }
};

template <class Traits>
struct ForwardMainloopSm90 {
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  using PipelineKV = typename Traits::PipelineKV;
  using PipelineState = typename PipelineKV::PipelineState;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr bool kHstu = Traits::kHstu;

  // A consumer's read position in the K, V or rab ring. Where registers are short (Traits::kCountedReads: three
  // consumer warpgroups) a count of the blocks read, the slot and phase derived from it where used; otherwise
  // the pipeline state. The consumers' start phase is 0.
  struct ReadPosition {
    std::conditional_t<Traits::kCountedReads, uint32_t, PipelineState> at{};
    CUTE_DEVICE PipelineState state() const {
      if constexpr (Traits::kCountedReads) {
        return ring_position<PipelineState, Traits::kStages, false>(at);
      } else {
        return at;
      }
    }
    CUTE_DEVICE void advance() { ++at; }
  };

  // A consumer warpgroup's read position in the rab ring: the blocks it has read. Its rows of the b-th block are
  // in tile b * kRabTilesPerBlock + rab_tile(wg) (Traits::SmemLayoutRab).
  struct RabReadPosition {
    uint32_t blocks = 0;
    CUTE_DEVICE typename Traits::PipelineRab::PipelineState state(int wg) const {
      return ring_position<typename Traits::PipelineRab::PipelineState, Traits::kRabSlots, false>(
          blocks * Traits::kRabTilesPerBlock + uint32_t(rab_tile(wg)));
    }
    CUTE_DEVICE void advance() { ++blocks; }
  };

  // The rab tile of a block that holds consumer warpgroup wg's rows.
  CUTE_DEVICE static int rab_tile(int wg) { return wg * Traits::kRabTilesPerBlock / Traits::kNumMmaWarpGroups; }

  // Releases a K or V slot after this warp's wgmmas that read it have completed (warpgroup_wait): one lane
  // arrives on the CTA-local empty barrier, which counts consumer warps (forward_sm90.cuh). The pipeline's
  // consumer_release has every consumer thread arrive through the cluster-address form: 32 times the arrivals
  // and an address conversion per block and ring.
  CUTE_DEVICE static void release_slot(typename PipelineKV::SharedStorage& ring, ReadPosition const& read) {
    if (cute::elect_one_sync()) ring.empty_barrier_[read.state().index()].arrive();
  }

  // The storage of Q slot `q_slot`: the slots of ss.q, then (Traits::kSpareQuerySlot) the unused rab ring.
  CUTE_DEVICE static Element* query_slot_data(SharedStorage& ss, int q_slot) {
    if constexpr (Traits::kSpareQuerySlot) {
      return q_slot == 0 ? ss.q.data() : ss.rab.rab.data();
    } else {
      return ss.q.data() + q_slot * cosize_v<typename Traits::SmemLayoutQ>;
    }
  }

  // Global coordinate tensors of one tile: Q (kBlockM, kHeadDim) and K/V (kBlockN, kHeadDim, n_blocks).
  // Rows are offset to the sequence start; TMA zero-fills past the tensor's end, varlen rows past the
  // sequence's end read the next sequence and are masked (K) or never stored (Q). The rab tile of block n
  // is rows [m0 + off, m0 + off + kBlockM) (key positions of the tile's query rows) x the block's keys of
  // rab[batch, head or 0]; past max_seqlen_k TMA zero-fills, past the sequence the entries are masked.
  // `loaded`: K/V blocks the producer loaded before this tile; returns the count after it. K, V and rab (when
  // present) advance their rings together, one slot per block, so the write position of every load follows
  // from one running block count: the producer keeps no pipeline states (its warp runs on 24 registers). Q goes
  // to slot `q_slot` of the Q ring once `acquire_q_slot()` returns (the slot's previous tile is done with it).
  template <class KernelParams, class AcquireQSlot>
  CUTE_DEVICE static uint32_t load(KernelParams const& kp, SharedStorage& ss, PipelineKV& pipeline_k,
                               PipelineKV& pipeline_v, typename Traits::PipelineRab& pipeline_rab, uint32_t loaded,
                               int q_slot, AcquireQSlot const& acquire_q_slot, TileWork const& w) {
    const detail::Params& p = kp.params;
    // The write position of the i-th block of the launch.
    auto write_slot = [](uint32_t i) { return ring_position<PipelineState, Traits::kStages, true>(i); };
    const int batch = p.varlen ? 0 : w.coord.batch;
    const int kv_head = Traits::kPackGqa ? w.coord.head : w.coord.head / kp.heads_per_kv;
    cute::Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q);  // (rows_q, d, h, b)
    cute::Tensor mK = kp.tma_k.get_tma_tensor(kp.shape_k);  // (rows_k, d, h_k, b)
    cute::Tensor mV = kp.tma_v.get_tma_tensor(kp.shape_k);  // (rows_k, d, h_k, b)
    cute::Tensor gQ = local_tile(domain_offset(make_coord(int(w.seq.q_start), _0{}), mQ(_, _, w.coord.head, batch)),
                           Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(w.coord.m_block, _0{}));  // (kBlockM, kHeadDim)
    cute::Tensor gK = local_tile(domain_offset(make_coord(int(w.seq.k_start), _0{}), mK(_, _, kv_head, batch)),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (kBlockN, kHeadDim, n)
    cute::Tensor gV = local_tile(domain_offset(make_coord(int(w.seq.k_start), _0{}), mV(_, _, kv_head, batch)),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (kBlockN, kHeadDim, n)
    cute::Tensor sQ = cute::make_tensor(make_smem_ptr(query_slot_data(ss, q_slot)),
                                       typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim)
    cute::Tensor sK = cute::make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});  // (kBlockN, kHeadDim, kStages)
    cute::Tensor sV = cute::make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});  // (kBlockN, kHeadDim, kStages)
    auto q_part = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto k_part = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto v_part = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    cute::Tensor tQgQ = get<0>(q_part);  // (TMA)
    cute::Tensor tQsQ = get<1>(q_part);  // (TMA)
    cute::Tensor tKgK = get<0>(k_part);  // (TMA, n)
    cute::Tensor tKsK = get<1>(k_part);  // (TMA, kStages)
    cute::Tensor tVgV = get<0>(v_part);  // (TMA, n)
    cute::Tensor tVsV = get<1>(v_part);  // (TMA, kStages)

    const bool leader = cute::elect_one_sync();
    // L2 eviction priorities of the softmax kernels' TMA loads: a tile reads its Q once, while K and V blocks are
    // read again by the other tiles of their head. H100 bf16, same run, against no hints: d 256 causal s 512 / 1k
    // +2.3%, d 128 s 8k / 16k +1%, short d 64 / 128 cells +0-1%; K / V evict-last alone changed nothing. The HSTU
    // kernels keep the default (their rab tiles share the L2; with the hints, jagged max 1k and 8k measured 3% slower).
    constexpr auto kQCacheHint = Traits::kHstu ? TMA::CacheHintSm90::EVICT_NORMAL : TMA::CacheHintSm90::EVICT_FIRST;
    constexpr auto kKvCacheHint = Traits::kHstu ? TMA::CacheHintSm90::EVICT_NORMAL : TMA::CacheHintSm90::EVICT_LAST;
    auto load_k = [&](uint32_t i, int n) {
      PipelineState write = write_slot(i);
      pipeline_k.producer_acquire(write);
      if (leader)
        copy(kp.tma_k.with(*pipeline_k.producer_get_barrier(write), 0, kKvCacheHint), tKgK(_, n), tKsK(_, write.index()));
    };
    auto load_v = [&](uint32_t i, int n) {
      PipelineState write = write_slot(i);
      pipeline_v.producer_acquire(write);
      if (leader)
        copy(kp.tma_v.with(*pipeline_v.producer_get_barrier(write), 0, kKvCacheHint), tVgV(_, n), tVsV(_, write.index()));
    };

    auto load_q = [&]() {
      acquire_q_slot();
      if constexpr (Traits::kPackGqa) {
        load_q_packed(kp, ss, q_slot, w);
      } else if (leader) {
        ss.barrier_q[q_slot].arrive_and_expect_tx(Traits::kTmaBytesQ);
        copy(kp.tma_q.with(reinterpret_cast<uint64_t&>(ss.barrier_q[q_slot]), 0, kQCacheHint), tQgQ, tQsQ);
      }
    };
    // The rab tiles of block n (Traits::kRabTilesPerBlock), the i-th block's slots.
    auto load_rab = [&](uint32_t i, int n) {
      if constexpr (Traits::kHasRabRing) {
        if (p.rab == nullptr) return;
        constexpr int kTiles = Traits::kRabTilesPerBlock;
        constexpr int kRows = Traits::kRabTileRows;
        const int rab_head = p.rab_heads == 1 ? 0 : w.coord.head;
        cute::Tensor mRab = kp.tma_rab.get_tma_tensor(kp.shape_rab);  // (max_sk, max_sk, h_rab, b)
        cute::Tensor gRab = local_tile(
            domain_offset(make_coord(int(w.seq.sk - w.seq.sq), _0{}), mRab(_, _, rab_head, w.coord.batch)),
            Shape<Int<kRows>, Int<kBlockN>>{}, make_coord(_, _));  // (kRows, kBlockN, row tiles, n)
        cute::Tensor sRab = cute::make_tensor(make_smem_ptr(ss.rab.rab.data()), typename Traits::SmemLayoutRab{});  // (kRows, kBlockN, kRabSlots)
        auto rab_part = tma_partition(kp.tma_rab, _0{}, Layout<_1>{}, group_modes<0, 2>(sRab), group_modes<0, 2>(gRab));
        cute::Tensor tRgRab = get<0>(rab_part);  // (TMA, row tiles, n)
        cute::Tensor tRsRab = get<1>(rab_part);  // (TMA, kRabSlots)
        CUTE_UNROLL
        for (int t = 0; t < kTiles; ++t) {
          const auto write =
              ring_position<typename Traits::PipelineRab::PipelineState, Traits::kRabSlots, true>(i * kTiles + t);
          pipeline_rab.producer_acquire(write);
          if (leader)
            copy(kp.tma_rab.with(*pipeline_rab.producer_get_barrier(write), 0),
                 tRgRab(_, w.coord.m_block * kTiles + t, n), tRsRab(_, write.index()));
        }
      }
    };

    // Blocks in TileWork::next_block order; V of a block follows K of the next one. `i`: the running count of
    // the block n.
    uint32_t i = loaded;
    int n = w.n_max - 1;
    if constexpr (Traits::kQueryStages == 1) {
      // One Q slot frees only when the consumers have issued the previous tile's last Q K^T: the tile's first
      // K (and rab) block goes first, so its load overlaps that wait instead of following it.
      load_k(i, n);
      load_rab(i, n);
      load_q();
    } else {
      load_q();
      load_k(i, n);
      load_rab(i, n);
    }
    // A one-block rab ring (kRabDepth 1) frees as the consumers read block n's tiles: V of block n goes before
    // the next block's rab tiles, whose wait for those reads would otherwise hold it back.
    for (int next = w.next_block(n); next >= w.n_min; n = next, next = w.next_block(n), ++i) {
      load_k(i + 1, next);
      if constexpr (Traits::kRabDepth > 1) load_rab(i + 1, next);
      load_v(i, n);
      if constexpr (Traits::kRabDepth == 1) load_rab(i + 1, next);
    }
    load_v(i, n);
    return i + 1;
  }

  // Packed GQA: the whole producer warp gathers the tile's Q rows (unpack_row) with 16-byte cp.async into the
  // swizzled Q slot, zero-filling rows past the sequence and columns past d; each lane's arrive (no increment,
  // barrier_q counts 32 in this kernel) fires when its copies have landed. The consumers fence the async
  // proxy before their wgmmas read the slot (forward_sm90.cuh).
  template <class KernelParams>
  CUTE_DEVICE static void load_q_packed(KernelParams const& kp, SharedStorage& ss, int q_slot, TileWork const& w) {
    constexpr int kChunksPerRow = kHeadDim / 8;
    static_assert((kBlockM * kChunksPerRow) % 32 == 0);
    const detail::Params& p = kp.params;
    const int g = kp.heads_per_kv;
    cute::Tensor sQ = cute::make_tensor(make_smem_ptr(query_slot_data(ss, q_slot)),
                                       typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim)
    Element const* q = static_cast<Element const*>(p.q.ptr);
    const int lane = int(threadIdx.x % 32);
    // Not unrolled: the warp has 40 registers, and unrolled ptxas kept the addresses of many chunks live (spilled).
#pragma unroll 1
    for (int k = 0; k < kBlockM * kChunksPerRow / 32; ++k) {
      const int idx = lane + 32 * k;
      const int i = idx / kChunksPerRow, col = idx % kChunksPerRow * 8;
      const PackedRow pr = unpack_row(w.coord.m_block * kBlockM + i, g);
      const bool valid = pr.row < w.seq.sq && col < p.head_dim;
      Element const* src =
          valid ? q + w.seq.q_offset(p.q, w.coord.batch, pr.row, w.coord.head * g + pr.head_in_group) + col : q;
      const uint32_t dst = cute::cast_smem_ptr_to_uint(&sQ(i, col));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
    }
    cutlass::arch::cpasync_barrier_arrive_noinc(reinterpret_cast<uint64_t const*>(&ss.barrier_q[q_slot]));
  }

  // One consumer warpgroup's share (64 rows) of a tile: leaves O in tOrO, for softmax unnormalised with the
  // row statistics in `score` (an OnlineSoftmax), for HSTU final (`score` is the HstuPointwise).
  // `tid` is the thread's index among the consumer threads.
  template <class KernelParams, class FragO, class Score>
  CUTE_DEVICE static void mma(KernelParams const& kp, SharedStorage& ss, PipelineKV& pipeline_k,
                              PipelineKV& pipeline_v, typename Traits::PipelineRab& pipeline_rab,
                              ReadPosition& read_k, ReadPosition& read_v, RabReadPosition& read_rab,
                              TileWork const& w, int q_slot, int tid,
                              MmaScheduler<Traits::kNumMmaWarpGroups> const& sched, FragO& tOrO, Score& score) {
    typename Traits::TiledMmaQK tiled_mma_qk;
    typename Traits::TiledMmaPV tiled_mma_pv;
    auto thr_mma_qk = tiled_mma_qk.get_thread_slice(tid);
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(tid);
    cute::Tensor sQ = cute::make_tensor(
        make_smem_ptr(query_slot_data(ss, uniform_slot(q_slot))),
        typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim)
    cute::Tensor sK = cute::make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});    // (kBlockN, kHeadDim, kStages)
    cute::Tensor sVt = cute::make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutVt{});  // (kHeadDim, kBlockN, kStages)
    cute::Tensor tSrQ = thr_mma_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K)
    cute::Tensor tSrK = thr_mma_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, kStages)
    cute::Tensor tOrV = thr_mma_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, kStages)
    cute::Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});  // (kBlockM, kBlockN)
    cute::Tensor tScS = thr_mma_qk.partition_C(cS);                               // (MMA, MMA_M, MMA_N)

    // Scores -> masked scores of block n. The blocks every row of the tile sees whole need no mask: at most two
    // ranges (the second only above the history of an HSTU target mask), found once per tile. Only the other
    // blocks pay for the element mask: one compare per element against the visible key spans of this
    // thread's rows, also found once per tile. Softmax finds both in 32 bits (its mask is a window).
    // The long-row kernel runs without a sliding window (Sm90Forward::long_rows): its rows see keys from 0 and its
    // tiles end at block 0, which the compiler then knows (the first ends of the spans and of the fully visible
    // range, and the last block, are constants instead of registers).
    detail::Window32 window = w.window;
    if constexpr (Traits::kLongRows) window.left = -1;
    const int n_min = Traits::kLongRows ? 0 : w.n_min;
    int full_lo, full_hi, full2_lo = 0, full2_hi = 0;
    cute::Tensor c_rc = cute::make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (rows, cols)
    constexpr int kMaskRows = decltype(size<0>(c_rc))::value;
    // A softmax row sees one span: its mask is a window (TileWork::plan), whose second span is always empty.
    constexpr int kSpans = kHstu ? 4 : 2;
    int spans[kMaskRows][kSpans];
    if constexpr (kHstu) {
      const int64_t m_end = detail::min64(w.m0 + kBlockM, w.seq.sq);
      detail::Range full_first, full_second;
      detail::fully_visible_blocks(w.mask, w.m0, m_end, kBlockN, &full_first, &full_second);
      full_lo = int(full_first.begin);
      full_hi = int(full_first.end);
      full2_lo = int(full_second.begin);
      full2_hi = int(full_second.end);
      CUTE_UNROLL
      for (int r = 0; r < kMaskRows; ++r) {
        detail::Range first, second;
        detail::visible_spans(w.mask, w.m0 + get<0>(c_rc(r, 0)), &first, &second);
        spans[r][0] = int(first.begin);
        spans[r][1] = int(first.end);
        spans[r][2] = int(second.begin);
        spans[r][3] = int(second.end);
      }
    } else {
      // Packed GQA: the query row of tile row i (masks go by the query row); w.m0 is the tile's first one.
      auto query_row = [&](int i) -> int {
        if constexpr (Traits::kPackGqa) {
          return unpack_row(w.coord.m_block * kBlockM + i, kp.heads_per_kv).row;
        } else {
          return int(w.m0) + i;
        }
      };
      const int m0 = int(w.m0);
      const int span = Traits::kPackGqa ? query_row(kBlockM - 1) + 1 - m0 : kBlockM;
      const int m_end = window.sq - m0 > span ? m0 + span : window.sq;  // as TileWork::plan
      window.full_blocks(m0, m_end, kBlockN, &full_lo, &full_hi);
      // The rows' spans from the tile's first row (mask.h's WindowSpans).
      const detail::WindowSpans row_spans = detail::WindowSpans::of(window, m0);
      CUTE_UNROLL
      for (int r = 0; r < kMaskRows; ++r) {
        const int t = query_row(get<0>(c_rc(r, 0))) - m0;
        spans[r][0] = row_spans.lo(t);
        spans[r][1] = row_spans.hi(t);
      }
    }
    // Sets the entries of block n no row sees to `masked`. Softmax compares each column's offset from the
    // thread's first column (a constant per register) with the row's span moved by that first column, and tests
    // the span's start only under a left window: two instructions per entry instead of three or four. A row with
    // no left window (causal) turns its span's end into a word of column bits instead (mask_suffixes): H100 bf16,
    // same run, causal d 64 s 512 / 1k +1.4 / +1.7%, d 128 s 1k +1.2%, s 4k-16k and d 128 s 512 within noise.
    const int col0 = get<1>(c_rc(0, 0));
    auto mask_block = [&](auto& tSrS, int n, float masked) {
      if (n >= full_lo && n < full_hi) return;
      if constexpr (kHstu) {
        if (n >= full2_lo && n < full2_hi) return;
      }
      const int n0 = n * kBlockN;
      cute::Tensor s_rc = cute::make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));  // (rows, cols)
      if constexpr (kHstu) {
        auto local = [&](int key) { return max(min(key - n0, kBlockN), 0); };
        CUTE_UNROLL
        for (int r = 0; r < kMaskRows; ++r) {
          const int f0 = local(spans[r][0]), f1 = local(spans[r][1]);
          const int s0 = local(spans[r][2]), s1 = local(spans[r][3]);
          CUTE_UNROLL
          for (int c = 0; c < size<1>(s_rc); ++c) {
            const int j = get<1>(c_rc(r, c));
            if (!((j >= f0 && j < f1) || (j >= s0 && j < s1))) s_rc(r, c) = masked;
          }
        }
      } else {
        const int base = n0 + col0;
        auto mask_rows = [&](auto two_sided) {
          CUTE_UNROLL
          for (int r = 0; r < kMaskRows; ++r) {
            const int lo = spans[r][0] - base, hi = spans[r][1] - base;
            CUTE_UNROLL
            for (int c = 0; c < size<1>(s_rc); ++c) {
              const int dj = get<1>(c_rc(r, c)) - col0;
              if (dj >= hi || (decltype(two_sided)::value && dj < lo)) s_rc(r, c) = masked;
            }
          }
        };
        // A right-bounded row (causal, no left window) masks a suffix of the thread's columns, which are
        // 2 adjacent keys every 8 (acc_rowcol): column c is masked from c = 2 (hi / 8) + min(hi % 8, 2) on. As
        // bits of a word the tests become predicates seven at a time (R2P) instead of one compare per entry.
        constexpr int kCols = decltype(size<1>(s_rc))::value;
        auto mask_suffixes = [&]() {
          CUTE_UNROLL
          for (int r = 0; r < kMaskRows; ++r) {
            const int hi = min(max(spans[r][1] - base, 0), 8 * (kCols / 2));
            const int first = 2 * (hi >> 3) + min(hi & 7, 2);
            const uint32_t masked_cols = first < 32 ? ~0u << first : 0u;
            CUTE_UNROLL
            for (int c = 0; c < kCols; ++c) {
              if ((masked_cols >> c) & 1u) s_rc(r, c) = masked;
            }
          }
        };
        if (window.left >= 0) {
          mask_rows(cute::true_type{});
        } else if constexpr (kCols <= 32) {
          mask_suffixes();
        } else {
          mask_rows(cute::false_type{});
        }
      }
    };

    // Waits for K, then issues S = Q K^T at this warpgroup's turn. HSTU with rab: S starts as the block's rab
    // tile and Q K^T accumulates onto it (read before the warpgroup waits for its turn at the tensor cores,
    // it costs no add in the score phase). Each branch passes a literal zero_init, so the compiler knows S's
    // old registers are dead without rab (with a run-time flag it zeroed them before every Q K^T).
    const bool has_rab = Traits::kHasRabRing && kp.params.rab != nullptr;
    auto issue_qk = [&](auto& tSrS) {
      auto issue = [&](bool zero_init) {
        pipeline_k.consumer_wait(read_k.state());
        sched.wait_turn();
        warpgroup_gemm<false>(tiled_mma_qk, tSrQ, tSrK(_, _, _, uniform_slot(read_k.state().index())), tSrS,
                              zero_init);
      };
      if constexpr (Traits::kHasRabRing) {
        if (has_rab) {
          constexpr int kRows = Traits::kRabTileRows;
          const RabReader<Element, kRows, kBlockN> rab(ss.rab.rab.data(), get<0>(tScS(0)) - rab_tile(sched.wg) * kRows,
                                                       get<1>(tScS(0)));
          const auto read = read_rab.state(sched.wg);
          pipeline_rab.consumer_wait(read);
          rab.load(tSrS, read.index());
          pipeline_rab.consumer_release(read);
          read_rab.advance();
          issue(false);
          return;
        }
      }
      issue(true);
    };
    // S of block n -> P (still fp32) in place; for softmax `rescale` gets the factors O's rows need.
    float rescale[kMaskRows];
    auto score_block = [&](auto& tSrS, int n) {
      if constexpr (kHstu) {
        score.apply(tSrS);
        mask_block(tSrS, n, 0.0f);
      } else {
        kp.score.apply(tSrS);
        mask_block(tSrS, n, -INFINITY);
        cute::Tensor s_rc = cute::make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));  // (rows, cols)
        score.update(s_rc, rescale);
      }
    };

    cute::Tensor tSrS = partition_fragment_C(tiled_mma_qk, select<0, 1>(typename Traits::TileShapeQK{}));  // (MMA, MMA_M, MMA_N)
    issue_qk(tSrS);
    sched.pass_turn();
    warpgroup_wait<0>();
    release_slot(ss.pipeline_k, read_k);
    read_k.advance();
    score_block(tSrS, w.n_max - 1);
    cute::Tensor tOrP = cute::make_tensor<Element>(acc_as_a_operand(tSrS.layout()));  // (MMA, MMA_M, MMA_K)
    convert_fragment(tSrS, tOrP);
    bool first_pv = true;

    for (int n = w.next_block(w.n_max - 1); n >= n_min; n = w.next_block(n)) {
      cute::Tensor tSrS_next = partition_fragment_C(tiled_mma_qk, select<0, 1>(typename Traits::TileShapeQK{}));  // (MMA, MMA_M, MMA_N)
      // V's uniform slot before the S GEMM: derived between the V wait and the P V wgmma, it delayed that wgmma.
      const int v_slot = uniform_slot(read_v.state().index());
      issue_qk(tSrS_next);
      pipeline_v.consumer_wait(read_v.state());
      warpgroup_gemm<true>(tiled_mma_pv, tOrP, tOrV(_, _, _, v_slot), tOrO, first_pv);
      sched.pass_turn();
      first_pv = false;
      warpgroup_wait<1>();  // S of block n is ready; P V of the block before it still runs
      release_slot(ss.pipeline_k, read_k);
      read_k.advance();
      score_block(tSrS_next, n);
      warpgroup_wait<0>();
      release_slot(ss.pipeline_v, read_v);
      read_v.advance();
      if constexpr (!kHstu) {
        cute::Tensor o_rc = cute::make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));  // (rows, cols)
        scale_rows(o_rc, rescale);
      }
      convert_fragment(tSrS_next, tOrP);
    }

    // Every Q K^T of the tile has completed: the producer may load another tile's Q into its slot.
    barrier_arrive(Traits::kNumMmaThreads + 32, offset(FwdBarrier::kQueryEmpty0, q_slot));
    pipeline_v.consumer_wait(read_v.state());
    warpgroup_gemm<true>(tiled_mma_pv, tOrP, tOrV(_, _, _, uniform_slot(read_v.state().index())), tOrO, first_pv);
    warpgroup_wait<0>();
    release_slot(ss.pipeline_v, read_v);
    read_v.advance();
  }
};

}  // namespace cuteattn::sm90
