// The sm90 backward main kernel (softmax and HSTU), FlashAttention-3 class: one CTA per (key block, kv head,
// batch entry). Warp 0 (the producer) loads the key block's K and V once by TMA, then streams the Q and dO tiles of
// the query blocks that see it, for every query head of the kv head, through a two-stage TMA ring (softmax: with
// the rows' LSE and D, which its lanes store into the stage). Two consumer warpgroups recompute S = Q K^T and
// dP = dO V^T with wgmma, form P = exp2(S scale_log2 - LSE_log2) and dS = P (dP - D) (softcap: times its
// derivative; the element mask on edge tiles only), store P and dS to shared memory, and issue dV += P^T dO (as
// soon as P is stored: it runs while dS is formed), then dQ = dS K
// (Traits::kdQTurns: by one warpgroup per step, in turns, while the other goes on to the next step) and
// dK += dS^T Q. dQ goes through a shared fp32 staging tile into the workspace, by a writer warp per column half
// (warps 1 and 2), off the consumers' path: a tile's first contribution stores, the others add by TMA reduce-adds
// (sm90/dq_tiles_sm90.cuh).
// d 256 (Traits::kSplitCols): 64-key blocks; warpgroup 0 computes S and P, warpgroup 1 dP and, with P read back
// from shared memory, dS; the warpgroups own column halves of dK and dV for all 64 keys (dV starts once P is
// stored), and dQ goes to the workspace by fp32 vector reductions from the registers.
// dS leaves out the softmax scale: dK gets it in the epilogue, dQ in the conversion kernel.
// HSTU (Traits::kHstu): S^T and dP^T with the keys as M (Traits::kSwapSdP), so dV and dK take P^T and dS^T
// from the registers; the rab tile comes with Q and dO into the dS buffer of the step; the consumers read it
// transposed into the S^T accumulator (K Q^T accumulates onto it), form P = silu(alpha u) / scaling and its
// derivative from u = qk + rab, and dS = dP * dP/du; query blocks that see none of the key block (contextual and
// target masks leave gaps inside the row range) are skipped by producer and consumers alike. dRab: one rab head
// per query head, the dS tile goes out by a TMA store; one rab head shared by several, fp32 reduce-adds of the
// dS tile into the workspace.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "core/params.h"
#include "sm80/backward_utils_sm80.cuh"
#include "sm90/backward_traits_sm90.cuh"
#include "sm90/dq_tiles_sm90.cuh"
#include "sm90/hstu_sm90.cuh"
#include "sm90/mainloop_sm90.cuh"
#include "sm90/softmax_sm90.cuh"
#include "variants/mask.h"
#include "variants/sequence.h"

namespace cuteattn::sm90 {

template <class Traits>
struct BackwardKernelParams {
  typename Traits::TmaQ tma_q;
  typename Traits::TmaQ tma_do;
  typename Traits::TmaK tma_k;
  typename Traits::TmaK tma_v;
  typename Traits::TmadQ tma_dq;
  typename Traits::TmadQStore tma_dq_store;  // the first contribution to a tile (sm90/dq_tiles_sm90.cuh)
  typename Traits::ShapedQ shape_dq;   // (total_q, kHeadDim, h)
  typename Traits::ShapeRows shape_q;  // (rows_q, d, h, b)
  typename Traits::ShapeRows shape_k;  // (rows_k, d, h_k, b)
  detail::Params params;
  const float* dsum;   // D = rowsum(dO * O), indexed like LSE
  int heads_per_kv;    // h / h_k
  float scale_log2;    // softcap off: scale * log2(e); on: softcap * log2(e) (the score is softcap * tanh(...))
  float scale_over_cap;  // softcap on: scale / softcap
  typename Traits::TmaRab tma_rab;       // HSTU with rab only
  typename Traits::TmadRab tma_drab;     // HSTU with dRab: dRab itself (h_rab == h) or per-head staged tiles
  typename Traits::ShapeRows shape_rab;  // (max_sk, max_sk, h_rab, b)
  typename Traits::ShapeRows shape_drab;  // (max_sk, max_sk, h_rab, b), or (max_sk, max_sk, h, b) staged
  float* drab_accum;                     // HSTU, one rab head shared by several heads: (b, max_sk, drab_ld) fp32
  int64_t drab_ld;
  float* dq_accum;                       // the fp32 dQ workspace (total_q, h, kHeadDim)
  uint32_t* dq_states;                   // its tiles' DqTileStates words (not Traits::kdQAtomic)
};

// The query blocks that see key block n0 of a sequence: [m_begin, m_end).
template <int kBlockM, int kBlockN>
CUTE_DEVICE void query_blocks(detail::Mask const& mask, int64_t n0, int& m_begin, int& m_end) {
  const detail::Range rows = mask.row_range(n0, n0 + kBlockN);
  m_begin = rows.empty() ? 0 : int(rows.begin / kBlockM);
  m_end = rows.empty() ? 0 : int((rows.end + kBlockM - 1) / kBlockM);
}

// The (query head, query block) of each step, head-major, as the producer, the dQ writers and the consumers walk
// the steps, by a cursor (a division and a remainder per step were a visible part of the step head). Softmax
// walks every query head of the kv head; HSTU has one (h_k == h, hstu_tma_refusal), so its step is the query
// block alone (the two-level cursor spilled in the HSTU d 128 consumers). kRotated (softmax d 128): each head's
// query blocks from `first` on, wrapping around, so that where the dQ tiles are tracked without a right-bounded
// mask key block n can start at its diagonal block and the key blocks' first contributions to a tile do not meet
// (sm90/dq_tiles_sm90.cuh); first = m_begin elsewhere.
template <bool kRotated>
struct HeadsStepWalk {
  int head, m, m_begin, m_end, head_end;
  CUTE_DEVICE HeadsStepWalk(int head0, int heads, int m_begin_, int m_end_, int)
      : head(head0), m(m_begin_), m_begin(m_begin_), m_end(m_end_),
        head_end(m_begin_ < m_end_ ? head0 + heads : head0) {}
  CUTE_DEVICE bool more() const { return head < head_end; }
  CUTE_DEVICE void next() {
    if (++m == m_end) {
      m = m_begin;
      ++head;
    }
  }
};
template <>
struct HeadsStepWalk<true> {
  int head, m, m_begin, m_end, left, head_end;
  CUTE_DEVICE HeadsStepWalk(int head0, int heads, int m_begin_, int m_end_, int first)
      : head(head0), m(first), m_begin(m_begin_), m_end(m_end_), left(m_end_ - m_begin_),
        head_end(m_begin_ < m_end_ ? head0 + heads : head0) {}
  CUTE_DEVICE bool more() const { return head < head_end; }
  CUTE_DEVICE void next() {
    if (++m == m_end) m = m_begin;
    if (--left == 0) {
      left = m_end - m_begin;  // a whole turn: m is `first` again
      ++head;
    }
  }
};
struct OneHeadStepWalk {
  int head, m, m_end;
  CUTE_DEVICE OneHeadStepWalk(int head0, int m_begin, int m_end_) : head(head0), m(m_begin), m_end(m_end_) {}
  CUTE_DEVICE bool more() const { return m < m_end; }
  CUTE_DEVICE void next() { ++m; }
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    backward_kernel_sm90(CUTE_GRID_CONSTANT BackwardKernelParams<Traits> const kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  using PipelineQdO = typename Traits::PipelineQdO;
  using PipelineState = typename PipelineQdO::PipelineState;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kNumMmaThreads = Traits::kNumMmaThreads;
  constexpr float kLog2e = 1.4426950408889634f;

  const detail::Params& p = kp.params;
  const int n_block = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int bi = blockIdx.z;
  const detail::SequenceInfo seq = detail::SequenceInfo::of(p, bi);
  const int64_t n0 = int64_t(n_block) * kBlockN;
  if (n0 >= seq.sk) return;
  detail::Mask mask = detail::Mask::of(p, seq, bi);
  if constexpr (!Traits::kHstu) {
    mask.n_ctx = 0;  // softmax masks are windows only: the contextual and target paths drop out
    mask.hist = seq.sk;
    mask.group = 1;
  }
  // HSTU's sequence and mask again from the parameters at every step (L1 hits): kept live across the step loops,
  // they spilled (the producer runs on 24 registers, the d 128 consumers are full). Softmax keeps its own.
  auto step_seq = [&]() {
    if constexpr (Traits::kHstu) {
      return detail::SequenceInfo::of(p, bi);
    } else {
      return seq;
    }
  };
  auto step_mask = [&]() {
    if constexpr (Traits::kHstu) {
      return detail::Mask::of(p, step_seq(), bi);
    } else {
      return mask;
    }
  };
  int m_begin, m_end;
  query_blocks<kBlockM, kBlockN>(mask, n0, m_begin, m_end);
  const int head0 = kv_head * kp.heads_per_kv;  // the first query head of the kv head
  auto walk_steps = [&]() {
    if constexpr (Traits::kHstu) {
      return OneHeadStepWalk(head0, m_begin, m_end);
    } else {
      // Tracked dQ tiles without a right-bounded mask (sm90/dq_tiles_sm90.cuh): from the key block's diagonal.
      const bool rotate = Traits::kRotatedSteps && kp.dq_states != nullptr && p.window_right < 0 && m_end > m_begin;
      const int first = rotate ? m_begin + n_block * (kBlockN / kBlockM) % (m_end - m_begin) : m_begin;
      return HeadsStepWalk<Traits::kRotatedSteps>(head0, kp.heads_per_kv, m_begin, m_end, first);
    }
  };
  // Whether query block m sees the key block under `mk` (this sequence's mask). The row range is exact for
  // windows (always true there); HSTU's contextual and target masks leave blocks inside it that see nothing
  // (key_range, key_hole).
  auto block_visible = [n0](detail::Mask const& mk, int m) {
    if constexpr (Traits::kHstu) {
      const int64_t i0 = int64_t(m) * kBlockM, i1 = i0 + kBlockM;
      const int64_t n1 = detail::min64(n0 + kBlockN, mk.sk);
      const detail::Range keys = mk.key_range(i0, i1);
      if (keys.begin >= n1 || keys.end <= n0) return false;
      const detail::Range hole = mk.key_hole(i0, i1);
      return !(hole.begin <= n0 && n1 <= hole.end);
    } else {
      return true;
    }
  };
  const bool has_rab = Traits::kHstu && p.rab != nullptr;
  static_assert(kStages == 2, "the P/dS buffer of a step is its Q/dO stage");

  extern __shared__ char smem[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  const int warp_group = cutlass::canonical_warp_group_idx();
  const int warp_idx = cutlass::canonical_warp_idx_sync();

  if (warp_idx == 0 && cute::elect_one_sync()) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    if constexpr (!Traits::kdQAtomic) cute::prefetch_tma_descriptor(kp.tma_dq.get_tma_descriptor());
    if (has_rab) cute::prefetch_tma_descriptor(kp.tma_rab.get_tma_descriptor());
    if (Traits::kHstu && p.drab != nullptr && kp.drab_accum == nullptr)
      cute::prefetch_tma_descriptor(kp.tma_drab.get_tma_descriptor());
    ss.barrier_kv.init(1);
  }
  typename PipelineQdO::Params pipeline_params;
  pipeline_params.transaction_bytes = Traits::kTmaBytesQdO + (has_rab ? Traits::kTmaBytesRab : 0u);
  pipeline_params.role = warp_group == 0 ? PipelineQdO::ThreadCategory::Producer : PipelineQdO::ThreadCategory::Consumer;
  pipeline_params.is_leader = threadIdx.x == 0;
  // Softmax: the leader's expect-tx arrival, then every producer lane arrives after its own stores of the stage's
  // row statistics, so a consumer that sees the stage full sees them.
  pipeline_params.num_producers = Traits::kHstu ? 1 : 1 + 32;
  pipeline_params.num_consumers = kNumMmaThreads;
  PipelineQdO pipeline(ss.pipeline_qdo, pipeline_params, Shape<_1, _1, _1>{});
  __syncthreads();

  const int batch = p.varlen ? 0 : bi;
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if constexpr (!Traits::kdQAtomic) {
      if (warp_idx == 1 || warp_idx == 2) {
        // dQ writer of staging half w: for every step the consumers visit, hand the half over (free) to the
        // warpgroup that writes it (warpgroup w; dQ by turns the one whose turn it is), wait until it holds the
        // step's dQ columns, add them into the workspace and wait until TMA has read them. As many hand-overs as
        // the consumers wait for, so no barrier is left half met; by turns, a barrier's uses stay in step order.
        const int w = warp_idx - 1;
        const auto empty = static_cast<uint32_t>(w == 0 ? BwdBarrier::kdQEmpty0 : BwdBarrier::kdQEmpty1);
        const auto full = static_cast<uint32_t>(w == 0 ? BwdBarrier::kdQFull0 : BwdBarrier::kdQFull1);
        cute::Tensor sdQ = cute::make_tensor(make_smem_ptr(ss.staging.dq.data()), typename Traits::SmemLayoutdQ{});  // (kBlockM, kdQCols, halves)
        // kp.dq_states null: the accumulator is zero-filled and every contribution adds (sm90/dq_tiles_sm90.cuh).
        const bool tracked = kp.dq_states != nullptr;
        for (auto walk = walk_steps(); walk.more(); walk.next()) {
          const int head = walk.head, m = walk.m;
          if (!block_visible(step_mask(), m)) continue;
          const detail::SequenceInfo sinfo = step_seq();
          const int64_t row_base = sinfo.first_q_row(p, bi);
          uint32_t* state =
              tracked ? kp.dq_states + DqTileStates::index<kBlockM>(row_base, bi, m, head, p.heads, w) : nullptr;
          // The tile's state read before the hand-over (the load's latency hides behind the wait).
          const uint32_t seen = tracked ? load_relaxed_gpu(state) : DqTileStates::kWritten;
          cutlass::arch::NamedBarrier::arrive(Traits::kdQWriterThreads, empty);
          cutlass::arch::NamedBarrier::sync(Traits::kdQWriterThreads, full);
          const int row0 = int(row_base) + m * kBlockM;
          const bool first = tracked && claim_first_dq(state, seen);
          if (cutlass::canonical_lane_idx() == 0) {
            auto dq_view = [&](auto const& tma) {
              cute::Tensor gdQ = local_tile(domain_offset(make_coord(row0, _0{}), tma.get_tma_tensor(kp.shape_dq)(_, _, head)),
                                            Shape<Int<kBlockM>, Int<Traits::kdQCols>>{}, make_coord(0, w));  // (kBlockM, kdQCols)
              return tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(sdQ), group_modes<0, 2>(gdQ));
            };
            if (first) {
              auto dq_part = dq_view(kp.tma_dq_store);
              copy(kp.tma_dq_store, get<1>(dq_part)(_, w), get<0>(dq_part));
              tma_store_arrive();
              publish_stored_dq(state);
            } else {
              auto dq_part = dq_view(kp.tma_dq);
              copy(kp.tma_dq, get<1>(dq_part)(_, w), get<0>(dq_part));
              tma_store_arrive();
              tma_store_wait<0>();
            }
          }
          __syncwarp();
        }
        return;
      }
    }
    if (warp_idx != 0) return;
    cute::Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q);    // (rows_q, d, h, b)
    cute::Tensor mdO = kp.tma_do.get_tma_tensor(kp.shape_q);  // (rows_q, d, h, b)
    cute::Tensor mK = kp.tma_k.get_tma_tensor(kp.shape_k);    // (rows_k, d, h_k, b)
    cute::Tensor mV = kp.tma_v.get_tma_tensor(kp.shape_k);    // (rows_k, d, h_k, b)
    cute::Tensor sQ = cute::make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});      // (kBlockM, kHeadDim, kStages)
    cute::Tensor sdO = cute::make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutdO{});  // (kBlockM, kHeadDim, kStages)
    cute::Tensor sK = cute::make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});       // (kBlockN, kHeadDim)
    cute::Tensor sV = cute::make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});       // (kBlockN, kHeadDim)
    cute::Tensor gK = local_tile(domain_offset(make_coord(int(seq.k_start), _0{}), mK(_, _, kv_head, batch)),
                                 Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, _0{}));  // (kBlockN, kHeadDim)
    cute::Tensor gV = local_tile(domain_offset(make_coord(int(seq.k_start), _0{}), mV(_, _, kv_head, batch)),
                                 Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, _0{}));  // (kBlockN, kHeadDim)
    auto k_part = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto v_part = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    const bool leader = cute::elect_one_sync();
    if (leader) {
      ss.barrier_kv.arrive_and_expect_tx(Traits::kTmaBytesKV);
      copy(kp.tma_k.with(reinterpret_cast<uint64_t&>(ss.barrier_kv), 0), get<0>(k_part), get<1>(k_part));
      copy(kp.tma_v.with(reinterpret_cast<uint64_t&>(ss.barrier_kv), 0), get<0>(v_part), get<1>(v_part));
    }
    uint32_t issued = 0;
    for (auto walk = walk_steps(); walk.more(); walk.next()) {
      const int head = walk.head, m = walk.m;
      const detail::SequenceInfo sinfo = step_seq();
      if (!block_visible(step_mask(), m)) continue;
      cute::Tensor gQ = local_tile(domain_offset(make_coord(int(sinfo.q_start), _0{}), mQ(_, _, head, batch)),
                                   Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m, _0{}));  // (kBlockM, kHeadDim)
      cute::Tensor gdO = local_tile(domain_offset(make_coord(int(sinfo.q_start), _0{}), mdO(_, _, head, batch)),
                                    Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m, _0{}));  // (kBlockM, kHeadDim)
      auto q_part = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto do_part = tma_partition(kp.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
      // The write position of the issued-th visited step.
      const PipelineState write = ring_position<PipelineState, kStages, true>(issued);
      ++issued;
      pipeline.producer_acquire(write);
      if (leader) {
        copy(kp.tma_q.with(*pipeline.producer_get_barrier(write), 0), get<0>(q_part), get<1>(q_part)(_, write.index()));
        copy(kp.tma_do.with(*pipeline.producer_get_barrier(write), 0), get<0>(do_part),
             get<1>(do_part)(_, write.index()));
      }
      if constexpr (!Traits::kHstu) {
        // The step's row statistics, one row per lane and turn; LSE is -inf where a row sees no key.
        const int64_t i0 = int64_t(m) * kBlockM;
        const int64_t base = seq.lse_index(p, bi, head, i0);  // rows of a head are contiguous in LSE and D
        CUTE_UNROLL
        for (int turn = 0; turn < kBlockM / 32; ++turn) {
          const int row = turn * 32 + cutlass::canonical_lane_idx();
          float2 stats = make_float2(INFINITY, 0.0f);
          if (i0 + row < seq.sq) {
            const float lse = p.lse[base + row];
            stats = make_float2(lse == -INFINITY ? INFINITY : lse * kLog2e, kp.dsum[base + row]);
          }
          ss.row_stats.lse2_dsum[write.index()][row] = stats;
        }
        cutlass::arch::ClusterBarrier::arrive(pipeline.producer_get_barrier(write));
      } else {
        // rab rows are the key positions m0 + off ... of the tile's query rows; past max_sk TMA zero-fills.
        if (has_rab) {
          cute::Tensor mRab = kp.tma_rab.get_tma_tensor(kp.shape_rab);  // (max_sk, max_sk, h_rab, b)
          cute::Tensor gRab = local_tile(domain_offset(make_coord(int(sinfo.sk - sinfo.sq), _0{}),
                                                       mRab(_, _, p.rab_heads == 1 ? 0 : head, bi)),
                                         Shape<Int<kBlockM>, Int<kBlockN>>{}, make_coord(m, n_block));  // (kBlockM, kBlockN)
          cute::Tensor sRab = cute::make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutdS{});  // (kBlockM, kBlockN, 2)
          auto rab_part = tma_partition(kp.tma_rab, _0{}, Layout<_1>{}, group_modes<0, 2>(sRab), group_modes<0, 2>(gRab));
          if (leader)
            copy(kp.tma_rab.with(*pipeline.producer_get_barrier(write), 0), get<0>(rab_part),
                 get<1>(rab_part)(_, write.index()));
        }
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    const int tid = int(threadIdx.x) - 128;
    typename Traits::TiledMmaSdP tiled_mma_sdp;
    typename Traits::TiledMmadKV tiled_mma_dkv;
    typename Traits::TiledMmadQ tiled_mma_dq;
    // d 256: S and dP are one-warpgroup GEMMs (warpgroup 0: S, 1: dP), partitioned by the thread's warpgroup rank.
    const int sdp_tid = Traits::kSplitCols ? tid % 128 : tid;
    auto thr_mma_sdp = tiled_mma_sdp.get_thread_slice(sdp_tid);
    auto thr_mma_dkv = tiled_mma_dkv.get_thread_slice(tid);
    // dQ by turns: a one-warpgroup GEMM, partitioned by the thread's warpgroup rank.
    auto thr_mma_dq = tiled_mma_dq.get_thread_slice(Traits::kdQTurns ? tid % 128 : tid);

    cute::Tensor sQ = cute::make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});       // (kBlockM, kHeadDim, kStages)
    cute::Tensor sQt = cute::make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQt{});     // (kHeadDim, kBlockM, kStages)
    cute::Tensor sdO = cute::make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutdO{});  // (kBlockM, kHeadDim, kStages)
    cute::Tensor sdOt = cute::make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQt{}); // (kHeadDim, kBlockM, kStages)
    cute::Tensor sK = cute::make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});       // (kBlockN, kHeadDim)
    cute::Tensor sKt = cute::make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});     // (kHeadDim, kBlockN)
    cute::Tensor sV = cute::make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});       // (kBlockN, kHeadDim)
    // Softmax: the P tile(s) in shared memory (stmatrix's destination, P^T the A operand of dV) and dS^T as the A
    // operand of dK from shared memory. HSTU (kSwapSdP) takes P^T and dS^T from the registers: none of these (0).
    auto sP = [&] {
      if constexpr (!Traits::kSwapSdP) {
        return cute::make_tensor(make_smem_ptr(ss.ptile.p.data()), typename Traits::SmemLayoutP{});  // (kBlockM, kBlockN, kPBuffers)
      } else {
        return 0;
      }
    }();
    cute::Tensor sdS = cute::make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutdS{});    // (kBlockM, kBlockN, 2)
    cute::Tensor sdSt = cute::make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutdSt{});  // (kBlockN, kBlockM, 2)

    // The S and dP GEMMs take Q and dO as A, K and V as B; where kSwapSdP (S^T, dP^T) the other way round.
    auto query_operand = [&](auto const& sX) {
      if constexpr (Traits::kSwapSdP) {
        return thr_mma_sdp.partition_fragment_B(sX);
      } else {
        return thr_mma_sdp.partition_fragment_A(sX);
      }
    };
    auto key_operand = [&](auto const& sX) {
      if constexpr (Traits::kSwapSdP) {
        return thr_mma_sdp.partition_fragment_A(sX);
      } else {
        return thr_mma_sdp.partition_fragment_B(sX);
      }
    };
    cute::Tensor tSrQ = query_operand(sQ);    // (MMA, MMA_M, MMA_K, kStages), kSwapSdP (MMA, MMA_N, MMA_K, kStages)
    cute::Tensor tSrK = key_operand(sK);      // (MMA, MMA_N, MMA_K), kSwapSdP (MMA, MMA_M, MMA_K)
    cute::Tensor tdPrdO = query_operand(sdO);  // like tSrQ
    cute::Tensor tdPrV = key_operand(sV);      // like tSrK
    auto tdVrPt = [&] {
      if constexpr (!Traits::kSwapSdP) {
        cute::Tensor sPt = cute::make_tensor(make_smem_ptr(ss.ptile.p.data()), typename Traits::SmemLayoutPt{});  // (kBlockN, kBlockM, kPBuffers)
        return thr_mma_dkv.partition_fragment_A(sPt);  // (MMA, MMA_M, MMA_K, kPBuffers)
      } else {
        return 0;
      }
    }();
    cute::Tensor tdVrdOt = thr_mma_dkv.partition_fragment_B(sdOt); // (MMA, MMA_N, MMA_K, kStages)
    auto tdKrdSt = [&] {
      if constexpr (!Traits::kSwapSdP) {
        return thr_mma_dkv.partition_fragment_A(sdSt);  // (MMA, MMA_M, MMA_K, 2)
      } else {
        return 0;
      }
    }();
    cute::Tensor tdKrQt = thr_mma_dkv.partition_fragment_B(sQt);   // (MMA, MMA_N, MMA_K, kStages)
    cute::Tensor tdQrdS = thr_mma_dq.partition_fragment_A(sdS);    // (MMA, MMA_M, MMA_K, 2)
    // K^T as dQ's B operand: this warpgroup's column half; dQ by turns both halves, (MMA, MMA_N, MMA_K, half).
    cute::Tensor tdQrKt = [&] {
      if constexpr (!Traits::kdQTurns) {
        return thr_mma_dq.partition_fragment_B(sKt);  // (MMA, MMA_N, MMA_K)
      } else {
        return thr_mma_dq.partition_fragment_B(
            local_tile(sKt, Shape<Int<Traits::kdQCols>, Int<kBlockN>>{}, make_coord(_, _0{})));  // (MMA, MMA_N, MMA_K, 2)
      }
    }();

    typename Traits::SmemCopyPdS smem_copy_pds;
    auto thr_copy_pds = smem_copy_pds.get_thread_slice(sdp_tid);
    auto tPsP = [&] {
      if constexpr (!Traits::kSwapSdP) {
        return thr_copy_pds.partition_D(sP);  // (CPY, CPY_M, CPY_N, kPBuffers)
      } else {
        return 0;
      }
    }();
    // dS into its buffer (kSwapSdP: from dS^T, through the tile's (keys, rows) view).
    cute::Tensor tdSsdS = [&] {
      if constexpr (Traits::kSwapSdP) {
        return thr_copy_pds.partition_D(sdSt);  // (CPY, CPY_N, CPY_M, 2)
      } else {
        return thr_copy_pds.partition_D(sdS);  // (CPY, CPY_M, CPY_N, 2)
      }
    }();
    // HSTU: P^T and dS^T of a step in the A operand layout of dV and dK. Those wgmmas read them until the step's
    // last wait, so they are declared per step, at the step's scope.
    auto a_operand_tile = [&] {
      if constexpr (Traits::kSwapSdP) {
        using AccLayout = decltype(partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{}).layout());
        return cute::make_tensor<Element>(acc_as_a_operand(AccLayout{}));  // (MMA, MMA_M, MMA_K)
      } else {
        return 0;
      }
    };

    // The (query row, key) coordinates of the S accumulator, (key, query row) where kSwapSdP.
    cute::Tensor cS = make_identity_tensor(
        std::conditional_t<Traits::kSwapSdP, Shape<Int<kBlockN>, Int<kBlockM>>, Shape<Int<kBlockM>, Int<kBlockN>>>{});
    cute::Tensor tScS = thr_mma_sdp.partition_C(cS);                                 // (MMA, MMA_M, MMA_N)
    cute::Tensor c_rc = cute::make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (rows, cols)
    constexpr int kRows = decltype(size<0>(c_rc))::value;
    constexpr int kCols = decltype(size<1>(c_rc))::value;
    using Visibility = std::conditional_t<(kRows * kCols > 32), uint64_t, uint32_t>;
    cute::Tensor cKV = make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{});  // (kBlockN, kHeadDim)

    const int wg = tid / 128;
    const BwdBarrier wg_barrier = wg == 0 ? BwdBarrier::kWarpGroup0 : BwdBarrier::kWarpGroup1;

    cute::Tensor tdVrdV = partition_fragment_C(tiled_mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_N)
    cute::Tensor tdKrdK = partition_fragment_C(tiled_mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_N)
    clear(tdVrdV);
    clear(tdKrdK);

    const int d = int(p.head_dim);
    const bool softcap = p.softcap > 0.0f;
    const int dq_row_base = int(seq.first_q_row(p, bi));

    // d <= 128: the query blocks whose tile needs no element mask, found once (at d 256 the range kept live
    // across the loop spilled; it asks the mask per step there). Exact for softmax windows; for HSTU a subset
    // (fully_visible_query_blocks), whose steps skip the per-step mask entirely.
    constexpr bool kFullRange = kHeadDim <= 128;
    int full_begin = 0, full_end = 0;
    if constexpr (kFullRange) {
      const detail::Range full = detail::fully_visible_query_blocks(mask, n0, kBlockM, kBlockN);
      full_begin = int(full.begin);
      full_end = int(full.end);
    }

    // dQ columns of one warpgroup's share (a one-warpgroup dQ fragment) into staging half h: written once the
    // half's writer warp hands it over (its previous reduce-add has read it), then handed back to it for this
    // step's reduce-add. Rows past the sequence and columns past d hold exact zeros (P and K are zero there), so
    // the whole tile is added. The half partitioned like the fragment from a thread index read again here: derived
    // once, the swizzled addresses stayed live across the loop and spilled. The staging storage comes as an
    // argument: the d 256 kernel has none, and a generic body is compiled only where it is called.
    auto stage_dq_half = [&](auto const& tdQrdQ, int h, auto& staging) {
      cute::Tensor sdQ = cute::make_tensor(make_smem_ptr(staging.dq.data()), typename Traits::SmemLayoutdQ{});  // (kBlockM, kdQCols, halves)
      const int t = consumer_thread_index<true>();
      cutlass::arch::NamedBarrier::sync(
          Traits::kdQWriterThreads, static_cast<uint32_t>(h == 0 ? BwdBarrier::kdQEmpty0 : BwdBarrier::kdQEmpty1));
      typename Traits::TiledMmadQWarpGroup tiled_mma_dq_wg;
      // The half's columns in dQWorkspaceColumns order (the swizzle comes with the data pointer).
      cute::Tensor sdQ_half = cute::make_tensor(sdQ(_, _, h).data(),
                                                composition(sdQ(_, _, h).layout(), typename Traits::dQStagingColumns{}));  // (kBlockM, kdQCols)
      cute::Tensor tdQsdQ = tiled_mma_dq_wg.get_thread_slice(t % 128).partition_C(sdQ_half);  // (MMA, MMA_M, MMA_N)
      // Column pairs (c, c + 1), c even, share a 16-byte chunk of the swizzled tile: one 8-byte store each.
      CUTE_UNROLL
      for (int e = 0; e < size(tdQrdQ); e += 2) {
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(cast_smem_ptr_to_uint(&tdQsdQ(e))), "f"(tdQrdQ(e)),
                     "f"(tdQrdQ(e + 1))
                     : "memory");
      }
      tma_store_fence();
      cutlass::arch::NamedBarrier::arrive(
          Traits::kdQWriterThreads, static_cast<uint32_t>(h == 0 ? BwdBarrier::kdQFull0 : BwdBarrier::kdQFull1));
    };

    // HSTU, one rab head for several query heads (kp.drab_accum): the step's dS tile as it is in shared memory
    // (rounded as for dQ, like each head's tile where the heads' dRab is staged or per head) added into the fp32
    // (b, max_sk, drab_ld) sums, 4 keys per 16-byte reduction, rows inside the sequence's queries and 4-key chunks
    // starting inside its keys (drab_ld is a multiple of 4; masked keys add dS = 0). From the registers, a
    // reduction per value (adjacent values of a thread are query rows) spilled their addresses.
    auto add_drab = [&](int64_t m0, int buf) {
      const detail::SequenceInfo sinfo = detail::SequenceInfo::of(p, bi);
      float* accum = kp.drab_accum + (int64_t(bi) * p.seqlen_k + m0 + sinfo.sk - sinfo.sq) * kp.drab_ld + n0;
      const int rows = int(detail::min64(sinfo.sq - m0, kBlockM)), cols = int(detail::min64(sinfo.sk - n0, kBlockN));
      constexpr int kChunksPerRow = kBlockN / 4;
      CUTE_UNROLL
      for (int q = consumer_thread_index<true>(); q < kBlockM * kChunksPerRow; q += kNumMmaThreads) {
        const int i = q / kChunksPerRow, j = q % kChunksPerRow * 4;
        if (i >= rows || j >= cols) continue;
        uint32_t bits[2];
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];"
                     : "=r"(bits[0]), "=r"(bits[1])
                     : "r"(cast_smem_ptr_to_uint(&sdS(i, j, buf))));
        const auto v = reinterpret_cast<cutlass::Array<Element, 4> const&>(bits);
        detail::sm80_bwd::red_add_f32x4(accum + i * kp.drab_ld + j, float(v[0]), float(v[1]), float(v[2]), float(v[3]));
      }
    };
    const HstuPointwise hstu(p);
    const bool drab_store = Traits::kHstu && p.drab != nullptr && kp.drab_accum == nullptr;

    ss.barrier_kv.wait(0);
    PipelineState read;
    for (auto walk = walk_steps(); walk.more(); walk.next()) {
      const int head = walk.head, m = walk.m;
      const int64_t m0 = int64_t(m) * kBlockM;
      bool full_tile = kFullRange && m >= full_begin && m < full_end;
      Visibility visible = ~Visibility(0);  // HSTU: bit r * kCols + c set where value (r, c) of the thread is visible
      if (!full_tile) {
        // Softmax with the range: a window edge tile. Otherwise ask the mask (HSTU: whether the block is seen at
        // all, and which of the thread's values are).
        const detail::Mask mk = step_mask();
        if (!block_visible(mk, m)) continue;
        if constexpr (Traits::kHstu || !kFullRange) full_tile = mk.tile_fully_visible(m0, m0 + kBlockM, n0, n0 + kBlockN);
        if constexpr (Traits::kHstu) {
          static_assert(kRows * kCols <= 8 * sizeof(Visibility), "one visibility bit per accumulator value");
          static_assert(Traits::kSwapSdP, "HSTU accumulators hold (key, query row) values");
          if (!full_tile) {
            // A thread's values cover kCols query rows (accumulator columns), 16 at d 128. Each lane asks the mask
            // for the key spans of query rows 2 lane and 2 lane + 1 instead, packed as bytes (a.begin, a.end,
            // b.begin, b.end relative to n0, clamped to [0, kBlockN]), and every thread takes its rows' spans
            // from the lanes by shuffles. Column c = 2 k + e of lane l's accumulator is query row 8 k + 2 (l % 4) + e
            // (the wgmma accumulator layout), whose spans lane 4 k + l % 4 found (as source lanes taken from the
            // coordinates, hoisted out of the step loop, they spilled).
            static_assert(kBlockM == 64 && kBlockN < 256, "two query rows per lane, spans in bytes");
            const int lane = cutlass::canonical_lane_idx();
            uint32_t spans[2];
            CUTE_UNROLL
            for (int e = 0; e < 2; ++e) {
              detail::Range a, b;
              detail::visible_spans(mk, m0 + 2 * lane + e, &a, &b);
              auto rel = [n0](int64_t x) { return uint32_t(detail::min64(detail::max64(x - n0, 0), kBlockN)); };
              spans[e] = rel(a.begin) | rel(a.end) << 8 | rel(b.begin) << 16 | rel(b.end) << 24;
            }
            visible = 0;
            CUTE_UNROLL
            for (int c = 0; c < kCols; c += 2) {
              const int from = (lane & 3) + 2 * c;
              const uint32_t pair[2] = {__shfl_sync(0xffffffffu, spans[0], from),
                                        __shfl_sync(0xffffffffu, spans[1], from)};
              CUTE_UNROLL
              for (int e = 0; e < 2; ++e) {
                const int a_lo = int(pair[e] & 0xffu), a_hi = int(pair[e] >> 8 & 0xffu);
                const int b_lo = int(pair[e] >> 16 & 0xffu), b_hi = int(pair[e] >> 24);
                CUTE_UNROLL
                for (int r = 0; r < kRows; ++r) {
                  const int j = get<0>(c_rc(r, c + e));
                  if ((j >= a_lo && j < a_hi) || (j >= b_lo && j < b_hi))
                    visible |= Visibility(1) << (r * kCols + c + e);
                }
              }
            }
          }
        }
      }
      const int stage = read.index();
      const int buf = stage;
      const int pbuf = Traits::kPBuffers == 1 ? 0 : buf;
      [[maybe_unused]] auto rPt = a_operand_tile();
      [[maybe_unused]] auto rdSt = a_operand_tile();

      pipeline.consumer_wait(read);
      // Softmax: P = exp2(score * scale_log2 - LSE_log2) in place in the S accumulator, masked on tiles not every
      // row sees whole. Softcap maps the scores in place first: a select per element kept the raw and the capped
      // tile live at once (spills with 128-row steps). `stats`: the step's row statistics, (LSE in log2 units, D)
      // per row of the tile (BackwardRowStats; passed in where softmax code is compiled: HSTU has none).
      auto softmax_probs = [&](auto& tS, auto const& stats) {
        cute::Tensor s_rc = cute::make_tensor(tS.data(), acc_rowcol(tS.layout()));  // (rows, cols)
        if (softcap) {
          CUTE_UNROLL
          for (int e = 0; e < size(tS); ++e) tS(e) = tanhf(tS(e) * kp.scale_over_cap);
        }
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const float lse2 = stats[get<0>(c_rc(r, 0))].x;
          CUTE_UNROLL
          for (int c = 0; c < kCols; ++c) s_rc(r, c) = exp2f(s_rc(r, c) * kp.scale_log2 - lse2);
        }
        if (!full_tile) {
          // A softmax mask is a window: the rows' key spans in 32 bits from the tile's first row (64-bit row
          // positions, hoisted out of the step loop, spilled at fp16 d 64).
          const detail::WindowSpans window = detail::WindowSpans::of(mask, m0);
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) {
            const int t = get<0>(c_rc(r, 0));
            const int lo = cute::max(window.lo(t) - int(n0), 0), hi = cute::min(window.hi(t) - int(n0), kBlockN);
            CUTE_UNROLL
            for (int c = 0; c < kCols; ++c) {
              const int j = get<1>(c_rc(r, c));
              if (j < lo || j >= hi) s_rc(r, c) = 0.0f;
            }
          }
        }
      };
      // Softmax: dS = P (dP - D) in place in the dP accumulator, with P as rounded for dV (0 where masked);
      // softcap: times 1 - t^2, t = tanh(...) recovered from P.
      auto softmax_dscores = [&](auto& tdP, auto const& rP, auto const& stats) {
        cute::Tensor dp_rc = cute::make_tensor(tdP.data(), acc_rowcol(tdP.layout()));  // (rows, cols)
        cute::Tensor p_rc = cute::make_tensor(rP.data(), acc_rowcol(rP.layout()));    // (rows, cols)
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const float dsum = stats[get<0>(c_rc(r, 0))].y;
          CUTE_UNROLL
          for (int c = 0; c < kCols; ++c) dp_rc(r, c) = static_cast<float>(p_rc(r, c)) * (dp_rc(r, c) - dsum);
        }
        if (softcap) {
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) {
            const float lse2 = stats[get<0>(c_rc(r, 0))].x;
            CUTE_UNROLL
            for (int c = 0; c < kCols; ++c) {
              const float prob = static_cast<float>(p_rc(r, c));
              const float t = (log2f(prob) + lse2) / kp.scale_log2;
              dp_rc(r, c) = prob > 0.0f ? dp_rc(r, c) * (1.0f - t * t) : 0.0f;
            }
          }
        }
      };
      if constexpr (Traits::kSplitCols) {
        // Warpgroup 0: S -> P (stored); warpgroup 1: dP, then dS from P read back; both: dV once P is stored.
        cute::Tensor tAcc = partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
        if (wg == 0) {
          warpgroup_gemm<false>(tiled_mma_sdp, tSrQ(_, _, _, stage), tSrK, tAcc, true);
        } else {
          warpgroup_gemm<false>(tiled_mma_sdp, tdPrdO(_, _, _, stage), tdPrV, tAcc, true);
        }
        warpgroup_wait<0>();
        cute::Tensor rP = cute::make_tensor<Element>(tAcc.layout());                      // (MMA, MMA_M, MMA_N)
        if (wg == 0) {
          softmax_probs(tAcc, ss.row_stats.lse2_dsum[stage]);
          convert_fragment(tAcc, rP);
          copy(smem_copy_pds, thr_copy_pds.retile_S(rP), tPsP(_, _, _, pbuf));
        }
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::NamedBarrier::sync(kNumMmaThreads, static_cast<uint32_t>(BwdBarrier::kPWritten));
        warpgroup_gemm<false>(tiled_mma_dkv, tdVrPt(_, _, _, pbuf), tdVrdOt(_, _, _, stage), tdVrdV, false);
        if (wg == 1) {
          // dS = P (dP - D) with P as stored (rounded, 0 where masked); softcap: times 1 - t^2 as below.
          typename Traits::SmemLoadP smem_load_p;
          auto thr_load_p = smem_load_p.get_thread_slice(sdp_tid);
          cute::Tensor tLsP = thr_load_p.partition_S(sP);  // (CPY, CPY_M, CPY_N, kPBuffers)
          cute::Tensor tLrP = thr_load_p.retile_D(rP);     // (CPY, CPY_M, CPY_N)
          copy(smem_load_p, tLsP(_, _, _, pbuf), tLrP);
          softmax_dscores(tAcc, rP, ss.row_stats.lse2_dsum[stage]);
          cute::Tensor rdS = cute::make_tensor<Element>(tAcc.layout());  // (MMA, MMA_M, MMA_N)
          convert_fragment(tAcc, rdS);
          copy(smem_copy_pds, thr_copy_pds.retile_S(rdS), tdSsdS(_, _, _, buf));
        }
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::NamedBarrier::sync(kNumMmaThreads, static_cast<uint32_t>(BwdBarrier::kPdSWritten));
      } else if constexpr (Traits::kSwapSdP) {
        // HSTU: S^T = K Q^T and dP^T = V dO^T, this warpgroup's 64 keys as M; (rows, cols) of the accumulators
        // are (keys, query rows).
        cute::Tensor tSrS = partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});   // (MMA, MMA_M, MMA_N)
        cute::Tensor tdPrdP = partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});  // (MMA, MMA_M, MMA_N)
        if (has_rab) {
          // rab^T of this warpgroup's keys out of the step's (rows, keys) rab tile by ldmatrix.trans, into the
          // S^T accumulator (K Q^T accumulates onto it). The thread's slice from a thread index read again here.
          typename Traits::SmemLoadRabT smem_load_rab;
          auto thr_load_rab = smem_load_rab.get_thread_slice(consumer_thread_index<true>());
          cute::Tensor rRab = cute::make_tensor<Element>(tSrS.layout());  // (MMA, MMA_M, MMA_N)
          copy(smem_load_rab, thr_load_rab.partition_S(sdSt)(_, _, _, buf), thr_load_rab.retile_D(rRab));
          convert_fragment(rRab, tSrS);
        }
        warpgroup_gemm<false>(tiled_mma_sdp, tSrK, tSrQ(_, _, _, stage), tSrS, !has_rab);
        warpgroup_gemm<false>(tiled_mma_sdp, tdPrV, tdPrdO(_, _, _, stage), tdPrdP, true);
        warpgroup_wait<1>();

        // u = qk + rab: P = silu(alpha u) / scaling into rPt and dP/du = alpha dsilu(alpha u) / scaling into rDp
        // (HstuPointwise::prob_and_slope, one MUFU operation per element), both 0 where masked; dS = dP dP/du
        // below. dP/du is rounded to the input dtype like P (an fp32 copy next to the dK, dV and dP accumulators
        // spilled at d 128).
        cute::Tensor s_rc = cute::make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));  // (keys, rows)
        cute::Tensor rDp = cute::make_tensor<Element>(tSrS.layout());                    // (MMA, MMA_M, MMA_N)
        cute::Tensor p_rc = cute::make_tensor(rPt.data(), acc_rowcol(tSrS.layout()));     // (keys, rows)
        cute::Tensor dp_du_rc = cute::make_tensor(rDp.data(), acc_rowcol(rDp.layout()));  // (keys, rows)
        // Column pairs (c, c + 1) are adjacent values of a fragment: one packed conversion each.
        using Pair = cutlass::Array<Element, 2>;
        cutlass::NumericArrayConverter<Element, float, 2> convert_pair;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          CUTE_UNROLL
          for (int c = 0; c < kCols; c += 2) {
            cutlass::Array<float, 2> prob, dp_du;
            CUTE_UNROLL
            for (int e = 0; e < 2; ++e) prob[e] = hstu.prob_and_slope(s_rc(r, c + e), dp_du[e]);
            *reinterpret_cast<Pair*>(&p_rc(r, c)) = convert_pair(prob);
            *reinterpret_cast<Pair*>(&dp_du_rc(r, c)) = convert_pair(dp_du);
          }
        }
        if (!full_tile) {
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) {
            CUTE_UNROLL
            for (int c = 0; c < kCols; ++c) {
              if (!((visible >> (r * kCols + c)) & 1u)) {
                p_rc(r, c) = static_cast<Element>(0.0f);
                dp_du_rc(r, c) = static_cast<Element>(0.0f);
              }
            }
          }
        }
        // dV of this warpgroup's keys from P^T in the registers: no store, no barrier.
        warpgroup_gemm<true>(tiled_mma_dkv, rPt, tdVrdOt(_, _, _, stage), tdVrdV, false);

        warpgroup_wait<1>();
        // dS = dP dP/du (0 where masked).
        CUTE_UNROLL
        for (int e = 0; e < size(tdPrdP); ++e) tdPrdP(e) *= static_cast<float>(rDp(e));
        convert_fragment(tdPrdP, rdSt);
        cute::Tensor rdSt_acc = cute::make_tensor(rdSt.data(), tdPrdP.layout());  // (MMA, MMA_M, MMA_N)
        copy(smem_copy_pds, thr_copy_pds.retile_S(rdSt_acc), tdSsdS(_, _, _, buf));
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::NamedBarrier::sync(kNumMmaThreads, static_cast<uint32_t>(BwdBarrier::kPdSWritten));
      } else {
        cute::Tensor tSrS = partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});   // (MMA, MMA_M, MMA_N)
        cute::Tensor tdPrdP = partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
        warpgroup_gemm<false>(tiled_mma_sdp, tSrQ(_, _, _, stage), tSrK, tSrS, true);
        warpgroup_gemm<false>(tiled_mma_sdp, tdPrdO(_, _, _, stage), tdPrV, tdPrdP, true);
        warpgroup_wait<1>();

        cute::Tensor rP = cute::make_tensor<Element>(tSrS.layout());  // (MMA, MMA_M, MMA_N)
        softmax_probs(tSrS, ss.row_stats.lse2_dsum[stage]);
        convert_fragment(tSrS, rP);
        copy(smem_copy_pds, thr_copy_pds.retile_S(rP), tPsP(_, _, _, pbuf));
        // dV of this warpgroup's keys reads only the P columns it wrote: it starts once they are visible to wgmma.
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::NamedBarrier::sync(128, static_cast<uint32_t>(wg_barrier));
        warpgroup_gemm<false>(tiled_mma_dkv, tdVrPt(_, _, _, pbuf), tdVrdOt(_, _, _, stage), tdVrdV, false);

        warpgroup_wait<1>();
        softmax_dscores(tdPrdP, rP, ss.row_stats.lse2_dsum[stage]);
        cute::Tensor rdS = cute::make_tensor<Element>(tdPrdP.layout());  // (MMA, MMA_M, MMA_N)
        convert_fragment(tdPrdP, rdS);
        copy(smem_copy_pds, thr_copy_pds.retile_S(rdS), tdSsdS(_, _, _, buf));
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::NamedBarrier::sync(kNumMmaThreads, static_cast<uint32_t>(BwdBarrier::kPdSWritten));
      }
      if constexpr (Traits::kHstu) {
        // dRab of this (head, query block, key block), visited once: the 16-bit dS tile as it is. Rows and
        // columns past the sequence hold zeros (masked), the ones past max_sk are clipped by TMA.
        if (drab_store && tid == 0) {
          cute::Tensor mdRab = kp.tma_drab.get_tma_tensor(kp.shape_drab);  // (max_sk, max_sk, 1 or h, b)
          const detail::SequenceInfo sinfo = detail::SequenceInfo::of(p, bi);
          cute::Tensor gdRab = local_tile(domain_offset(make_coord(int(sinfo.sk - sinfo.sq), _0{}),
                                                        mdRab(_, _, get<2>(kp.shape_drab) == 1 ? 0 : head, bi)),
                                          Shape<Int<kBlockM>, Int<kBlockN>>{}, make_coord(m, n_block));  // (kBlockM, kBlockN)
          auto drab_part =
              tma_partition(kp.tma_drab, _0{}, Layout<_1>{}, group_modes<0, 2>(sdS), group_modes<0, 2>(gdRab));
          copy(kp.tma_drab, get<1>(drab_part)(_, buf), get<0>(drab_part));
          tma_store_arrive();
        }
        if (kp.drab_accum != nullptr) add_drab(m0, buf);
      }

      if constexpr (Traits::kdQTurns) {
        // dQ by turns (Traits::kdQTurns): the warpgroups take turns by visited step (its ring stage), and the one
        // whose turn it is computes both column halves into the staging tile, one after the other; the other
        // issues only its dK and goes on to the next step, so its S and dP GEMMs and softmax overlap this step's
        // dQ and its staging. Each branch issues and waits for its own wgmmas (a dQ wgmma under one condition
        // and its wait under another serialized every wgmma of the kernel: ptxas C7514). The warpgroup from a
        // thread index read again here (kept live across the loop, a value of the softmax spilled).
        if (stage == consumer_thread_index<true>() / 128) {
          cute::Tensor tdQrdQ = partition_fragment_C(tiled_mma_dq, Shape<Int<kBlockM>, Int<Traits::kdQCols>>{});  // (MMA, MMA_M, MMA_N)
          warpgroup_gemm<false>(tiled_mma_dq, tdQrdS(_, _, _, buf), tdQrKt(_, _, _, 0), tdQrdQ, true);
          warpgroup_gemm<false>(tiled_mma_dkv, tdKrdSt(_, _, _, buf), tdKrQt(_, _, _, stage), tdKrdK, false);
          warpgroup_wait<1>();
          stage_dq_half(tdQrdQ, 0, ss.staging);
          warpgroup_gemm<false>(tiled_mma_dq, tdQrdS(_, _, _, buf), tdQrKt(_, _, _, 1), tdQrdQ, true);
          warpgroup_wait<0>();
          stage_dq_half(tdQrdQ, 1, ss.staging);
        } else {
          warpgroup_gemm<false>(tiled_mma_dkv, tdKrdSt(_, _, _, buf), tdKrQt(_, _, _, stage), tdKrdK, false);
          warpgroup_wait<0>();
        }
      } else {
        cute::Tensor tdQrdQ = partition_fragment_C(tiled_mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_N)
        warpgroup_gemm<false>(tiled_mma_dq, tdQrdS(_, _, _, buf), tdQrKt, tdQrdQ, true);
        if constexpr (Traits::kSwapSdP) {
          warpgroup_gemm<true>(tiled_mma_dkv, rdSt, tdKrQt(_, _, _, stage), tdKrdK, false);
        } else {
          warpgroup_gemm<false>(tiled_mma_dkv, tdKrdSt(_, _, _, buf), tdKrQt(_, _, _, stage), tdKrdK, false);
        }
        warpgroup_wait<1>();
        if constexpr (Traits::kdQAtomic) {
          // dQ of the tile's rows inside the sequence and columns below d: column pairs (c, c + 1) of the
          // fragment as one 8-byte reduction each. Coordinates from a thread index read again here.
          const int t = consumer_thread_index<true>();
          cute::Tensor cdQ = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (kBlockM, kHeadDim)
          cute::Tensor tdQcdQ = tiled_mma_dq.get_thread_slice(t).partition_C(cdQ);       // (MMA, MMA_M, MMA_N)
          const int64_t row_stride = int64_t(kp.params.heads) * kHeadDim;
          float* dq_tile = kp.dq_accum + (int64_t(dq_row_base) + m0) * row_stride + int64_t(head) * kHeadDim;
          const int rows = int(detail::min64(seq.sq - m0, kBlockM));
          CUTE_UNROLL
          for (int e = 0; e < size(tdQrdQ); e += 2) {
            const int r = get<0>(tdQcdQ(e)), c = get<1>(tdQcdQ(e));
            if (r < rows && c < d) detail::sm80_bwd::red_add_f32x2(dq_tile + r * row_stride + c, tdQrdQ(e), tdQrdQ(e + 1));
          }
        } else {
          stage_dq_half(tdQrdQ, consumer_thread_index<true>() / 128, ss.staging);
        }
        warpgroup_wait<0>();
      }
      // The stage's dS buffer takes the next rab tile: the dRab store must have read it first.
      if (drab_store && tid == 0) tma_store_wait<0>();
      pipeline.consumer_release(read);
      ++read;
    }

    // dK (softmax: times the scale) and dV in the input dtype, through shared memory: stmatrix into two swizzled
    // (kBlockN, kHeadDim) tiles in the Q and dO stage buffers (every step has consumed them), then 16-byte row pieces
    // to global memory (column pairs stored straight from the accumulators wrote 4 bytes of a 32-byte sector each).
    // The sequence read again from the parameters: kept across the step loop, it spilled with 128-row steps.
    const float dk_scale = Traits::kHstu ? 1.0f : p.scale;
    {
      cute::Tensor rdK = cute::make_tensor<Element>(tdKrdK.layout());  // (MMA, MMA_M, MMA_N)
      CUTE_UNROLL
      for (int e = 0; e < size(tdKrdK); ++e) rdK(e) = static_cast<Element>(tdKrdK(e) * dk_scale);
      cute::Tensor rdV = cute::make_tensor<Element>(tdVrdV.layout());  // (MMA, MMA_M, MMA_N)
      convert_fragment(tdVrdV, rdV);
      static_assert(cosize_v<typename Traits::SmemLayoutdKV> <= cosize_v<typename Traits::SmemLayoutQ>,
                    "a dK / dV tile fits a Q / dO ring");
      cute::Tensor sdK = cute::make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutdKV{});     // (kBlockN, kHeadDim)
      cute::Tensor sdV = cute::make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutdKV{});  // (kBlockN, kHeadDim)
      typename Traits::SmemCopydKV smem_copy_dkv;
      auto thr_copy_dkv = smem_copy_dkv.get_thread_slice(tid);
      // Both warpgroups' last dK / dV wgmmas read all of Q^T and dO^T: none may still run when the tiles go there.
      cutlass::arch::NamedBarrier::sync(kNumMmaThreads, static_cast<uint32_t>(BwdBarrier::kPdSWritten));
      copy(smem_copy_dkv, thr_copy_dkv.retile_S(rdK), thr_copy_dkv.partition_D(sdK));
      copy(smem_copy_dkv, thr_copy_dkv.retile_S(rdV), thr_copy_dkv.partition_D(sdV));
    }
    cutlass::arch::NamedBarrier::sync(kNumMmaThreads, static_cast<uint32_t>(BwdBarrier::kPdSWritten));
    const detail::SequenceInfo kseq = detail::SequenceInfo::of(p, bi);
    const int t = consumer_thread_index<true>();
    typename Traits::GmemCopydKV gmem_copy_dkv;
    auto thr_store = gmem_copy_dkv.get_thread_slice(t);
    cute::Tensor tKVcKV = thr_store.partition_D(cKV);  // (CPY, CPY_N, CPY_D)
    const int rows = int(detail::min64(kseq.sk - n0, kBlockN));
    auto store = [&](Element* smem, detail::RowMajorView const& view, int cols) {
      cute::Tensor sX = cute::make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutdKV{});  // (kBlockN, kHeadDim)
      Element* block = static_cast<Element*>(view.ptr) + kseq.k_offset(view, bi, n0, kv_head);
      cute::Tensor gX = cute::make_tensor(make_gmem_ptr(block), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                                          make_stride(view.row_stride, _1{}));  // (kBlockN, kHeadDim)
      cute::Tensor tXsX = thr_store.partition_S(sX);  // (CPY, CPY_N, CPY_D)
      cute::Tensor tXgX = thr_store.partition_D(gX);  // (CPY, CPY_N, CPY_D)
      CUTE_UNROLL
      for (int r = 0; r < size<1>(tXgX); ++r) {
        if (get<0>(tKVcKV(0, r, 0)) >= rows) continue;
        CUTE_UNROLL
        for (int c = 0; c < size<2>(tXgX); ++c) {
          if (get<1>(tKVcKV(0, r, c)) < cols) copy(gmem_copy_dkv, tXsX(_, r, c), tXgX(_, r, c));
        }
      }
    };
    store(ss.q.data(), p.dk, d);
    store(ss.dout.data(), p.dv, int(p.head_dim_v));
  }
#else
  __trap();  // built for an architecture without wgmma/TMA: never launched (supports() needs sm_90a)
#endif
}

}  // namespace cuteattn::sm90
