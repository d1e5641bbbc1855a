// Mainloop of the sm90 forward kernel for one tile of 128 query rows.
// Producer (one warp): TMA loads of Q and of the K/V blocks into the shared ring, K one block ahead of V.
// Consumers (two warpgroups of 64 rows): S = Q K^T (wgmma from smem), softmax, O += P V (P from registers),
// with softmax of block n overlapping P V of block n + 1 within a warpgroup, and the wgmmas of the two
// warpgroups taking turns (pingpong) so one warpgroup's softmax hides behind the other's tensor-core work.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "core/params.h"
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

  // Global coordinate tensors of one tile: Q (kBlockM, kHeadDim) and K/V (kBlockN, kHeadDim, n_blocks).
  // Rows are offset to the sequence start; TMA zero-fills past the tensor's end, varlen rows past the
  // sequence's end read the next sequence and are masked (K) or never stored (Q).
  template <class KernelParams>
  CUTE_DEVICE static void load(KernelParams const& kp, SharedStorage& ss, PipelineKV& pipeline_k,
                               PipelineKV& pipeline_v, PipelineState& write_k, PipelineState& write_v,
                               TileWork const& w) {
    const detail::Params& p = kp.params;
    const int batch = p.varlen ? 0 : w.coord.batch;
    const int kv_head = int(w.coord.head / (p.heads / p.heads_k));
    cute::Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q);  // (rows_q, d, h, b)
    cute::Tensor mK = kp.tma_k.get_tma_tensor(kp.shape_k);  // (rows_k, d, h_k, b)
    cute::Tensor mV = kp.tma_v.get_tma_tensor(kp.shape_k);  // (rows_k, d, h_k, b)
    cute::Tensor gQ = local_tile(domain_offset(make_coord(int(w.seq.q_start), _0{}), mQ(_, _, w.coord.head, batch)),
                           Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(w.coord.m_block, _0{}));  // (kBlockM, kHeadDim)
    cute::Tensor gK = local_tile(domain_offset(make_coord(int(w.seq.k_start), _0{}), mK(_, _, kv_head, batch)),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (kBlockN, kHeadDim, n)
    cute::Tensor gV = local_tile(domain_offset(make_coord(int(w.seq.k_start), _0{}), mV(_, _, kv_head, batch)),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (kBlockN, kHeadDim, n)
    cute::Tensor sQ = cute::make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim)
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
    auto load_k = [&](int n) {
      pipeline_k.producer_acquire(write_k);
      if (leader)
        copy(kp.tma_k.with(*pipeline_k.producer_get_barrier(write_k), 0), tKgK(_, n), tKsK(_, write_k.index()));
      ++write_k;
    };
    auto load_v = [&](int n) {
      pipeline_v.producer_acquire(write_v);
      if (leader)
        copy(kp.tma_v.with(*pipeline_v.producer_get_barrier(write_v), 0), tVgV(_, n), tVsV(_, write_v.index()));
      ++write_v;
    };

    if (leader) {
      ss.barrier_q.arrive_and_expect_tx(Traits::kTmaBytesQ);
      copy(kp.tma_q.with(reinterpret_cast<uint64_t&>(ss.barrier_q), 0), tQgQ, tQsQ);
    }
    // Blocks run from the last (the masked diagonal under causal) down to the first.
    load_k(w.n_max - 1);
    for (int n = w.n_max - 2; n >= w.n_min; --n) {
      load_k(n);
      load_v(n + 1);
    }
    load_v(w.n_min);
  }

  // One consumer warpgroup's share (64 rows) of a tile: leaves the unnormalised O in tOrO and the row
  // statistics in `softmax`. `tid` is the thread's index among the consumer threads.
  template <class KernelParams, class FragO, class Softmax>
  CUTE_DEVICE static void mma(KernelParams const& kp, SharedStorage& ss, PipelineKV& pipeline_k,
                              PipelineKV& pipeline_v, PipelineState& read_k, PipelineState& read_v,
                              TileWork const& w, int tid, MmaScheduler<Traits::kNumMmaThreads> const& sched,
                              FragO& tOrO, Softmax& softmax) {
    typename Traits::TiledMmaQK tiled_mma_qk;
    typename Traits::TiledMmaPV tiled_mma_pv;
    auto thr_mma_qk = tiled_mma_qk.get_thread_slice(tid);
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(tid);
    cute::Tensor sQ = cute::make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});    // (kBlockM, kHeadDim)
    cute::Tensor sK = cute::make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});    // (kBlockN, kHeadDim, kStages)
    cute::Tensor sVt = cute::make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutVt{});  // (kHeadDim, kBlockN, kStages)
    cute::Tensor tSrQ = thr_mma_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K)
    cute::Tensor tSrK = thr_mma_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, kStages)
    cute::Tensor tOrV = thr_mma_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, kStages)
    cute::Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});  // (kBlockM, kBlockN)
    cute::Tensor tScS = thr_mma_qk.partition_C(cS);                               // (MMA, MMA_M, MMA_N)

    const ScoreTransform& score = kp.score;
    const int64_t m_end = detail::min64(w.m0 + kBlockM, w.seq.sq);
    // Scores -> masked scores of block n. Softmax masks are windows (each row sees one interval of keys), so
    // the fully visible blocks of a tile form one interval [full_lo, full_hi), found once per tile from both
    // ends. Only the other blocks pay for the element mask: one compare per element against the visible key
    // spans of this thread's rows, also found once per tile.
    auto fully_visible = [&](int n) {
      return w.mask.tile_fully_visible(w.m0, m_end, int64_t(n) * kBlockN, int64_t(n + 1) * kBlockN);
    };
    int full_hi = w.n_max;
    while (full_hi > w.n_min && !fully_visible(full_hi - 1)) --full_hi;
    int full_lo = w.n_min;
    while (full_lo < full_hi && !fully_visible(full_lo)) ++full_lo;
    cute::Tensor c_rc = cute::make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (rows, cols)
    constexpr int kMaskRows = decltype(size<0>(c_rc))::value;
    int spans[kMaskRows][4];
    CUTE_UNROLL
    for (int r = 0; r < kMaskRows; ++r) {
      detail::Range first, second;
      detail::visible_spans(w.mask, w.m0 + get<0>(c_rc(r, 0)), &first, &second);
      spans[r][0] = int(first.begin);
      spans[r][1] = int(first.end);
      spans[r][2] = int(second.begin);
      spans[r][3] = int(second.end);
    }
    auto mask_block = [&](auto& tSrS, int n) {
      score.apply(tSrS);
      if (n >= full_lo && n < full_hi) return;
      const int n0 = n * kBlockN;
      cute::Tensor s_rc = cute::make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));  // (rows, cols)
      auto local = [&](int key) { return max(min(key - n0, kBlockN), 0); };
      CUTE_UNROLL
      for (int r = 0; r < kMaskRows; ++r) {
        const int f0 = local(spans[r][0]), f1 = local(spans[r][1]);
        const int s0 = local(spans[r][2]), s1 = local(spans[r][3]);
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s_rc); ++c) {
          const int j = get<1>(c_rc(r, c));
          if (!((j >= f0 && j < f1) || (j >= s0 && j < s1))) s_rc(r, c) = -INFINITY;
        }
      }
    };

    constexpr int kRows = Softmax::kNumRows;
    float rescale[kRows];

    pipeline_k.consumer_wait(read_k);
    cute::Tensor tSrS = partition_fragment_C(tiled_mma_qk, select<0, 1>(typename Traits::TileShapeQK{}));  // (MMA, MMA_M, MMA_N)
    sched.wait_turn();
    warpgroup_gemm<false>(tiled_mma_qk, tSrQ, tSrK(_, _, _, read_k.index()), tSrS, true);
    sched.pass_turn();
    warpgroup_wait<0>();
    pipeline_k.consumer_release(read_k);
    ++read_k;
    mask_block(tSrS, w.n_max - 1);
    {
      cute::Tensor s_rc = cute::make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));  // (rows, cols)
      softmax.update(s_rc, rescale);
    }
    cute::Tensor tOrP = cute::make_tensor<Element>(acc_as_a_operand(tSrS.layout()));  // (MMA, MMA_M, MMA_K)
    convert_fragment(tSrS, tOrP);
    bool first_pv = true;

    for (int n = w.n_max - 2; n >= w.n_min; --n) {
      cute::Tensor tSrS_next = partition_fragment_C(tiled_mma_qk, select<0, 1>(typename Traits::TileShapeQK{}));  // (MMA, MMA_M, MMA_N)
      pipeline_k.consumer_wait(read_k);
      sched.wait_turn();
      warpgroup_gemm<false>(tiled_mma_qk, tSrQ, tSrK(_, _, _, read_k.index()), tSrS_next, true);
      pipeline_v.consumer_wait(read_v);
      warpgroup_gemm<true>(tiled_mma_pv, tOrP, tOrV(_, _, _, read_v.index()), tOrO, first_pv);
      sched.pass_turn();
      first_pv = false;
      warpgroup_wait<1>();  // S of block n is ready; P V of block n + 1 still runs
      pipeline_k.consumer_release(read_k);
      ++read_k;
      mask_block(tSrS_next, n);
      cute::Tensor s_rc = cute::make_tensor(tSrS_next.data(), acc_rowcol(tSrS_next.layout()));  // (rows, cols)
      softmax.update(s_rc, rescale);
      warpgroup_wait<0>();
      pipeline_v.consumer_release(read_v);
      ++read_v;
      cute::Tensor o_rc = cute::make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));  // (rows, cols)
      scale_rows(o_rc, rescale);
      convert_fragment(tSrS_next, tOrP);
    }

    // Every Q K^T of the tile has completed: the producer may load the next tile's Q.
    barrier_arrive(Traits::kNumMmaThreads + 32, FwdBarrier::kQueryEmpty);
    pipeline_v.consumer_wait(read_v);
    warpgroup_gemm<true>(tiled_mma_pv, tOrP, tOrV(_, _, _, read_v.index()), tOrO, first_pv);
    warpgroup_wait<0>();
    pipeline_v.consumer_release(read_v);
    ++read_v;
  }
};

}  // namespace cuteattn::sm90
