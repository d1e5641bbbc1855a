// sm90 (Hopper) forward kernel, FlashAttention-3 class: the kernel (warp-specialised: one TMA producer warp,
// two or three consumer warpgroups with setmaxnreg, persistent over tiles) and its host side: what it supports,
// the TMA descriptors and the launch. One kernel for both score functions: softmax (online softmax, LSE) and
// HSTU (rab tile through TMA, SiLU, no normalisation), a compile-time branch on the traits' kHstu; softmax GQA
// with few query rows packs a kv head's query heads into one tile (kPackGqa, Sm90Forward::pack_gqa); softmax
// tiles too few to fill the GPU split their key range over several CTAs and a combine kernel merges the partials
// (kSplitKv, Sm90Forward::num_splits).
// Instantiated by tools/generate_instances.py for sm_90a only.
#pragma once

// The wgmma shapes with N = 80, 112 and 176 (key-block widths of kernel_traits_sm90.cuh) are CuTe's "extended"
// ones, enabled before the first CuTe header of the TU (generated instances include this header first).
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "core/device_properties.h"
#include "core/params.h"
#include "cuteattn/attention.h"
#include "sm90/epilogue_sm90.cuh"
#include "sm90/hstu_sm90.cuh"
#include "sm90/kernel_traits_sm90.cuh"
#include "sm90/mainloop_sm90.cuh"
#include "sm90/named_barriers_sm90.cuh"
#include "sm90/softmax_sm90.cuh"
#include "sm90/tile_scheduler_sm90.cuh"
#include "cuda/split_kv_combine.cuh"

namespace cuteattn::sm90 {

template <class Traits>
struct ForwardKernelParams {
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::TmaO tma_o;  // epilogue stores (shape_q), where kStoreOWithTma
  typename Traits::ShapeRows shape_q;  // (rows_q, d, h, b)
  typename Traits::ShapeRows shape_k;  // (rows_k, d, h_k, b)
  detail::Params params;
  TileScheduler scheduler;
  int* tile_counter;  // dynamic scheduling (masks or jagged lengths make tile costs vary); null = static
  int heads_per_kv;   // h / h_k
  // Softmax: the window of params as detail::Window32 bounds (unbounded where it reaches past every key).
  int window_left, window_right;
  ScoreTransform score;
  typename Traits::TmaRab tma_rab;       // HSTU with rab only
  typename Traits::ShapeRows shape_rab;  // (max_sk, max_sk, h_rab, b)
  // Split-KV only (Traits::kSplitKv): tile t is key chunk t % num_splits of scheduler tile t / num_splits; its
  // partials go to the workspace, split s at rows [s * partial_rows, (s + 1) * partial_rows).
  int num_splits;
  int64_t partial_rows;  // h * total_q
  float* o_partial;      // (num_splits * partial_rows, d)
  float* lse_partial;    // (num_splits * partial_rows)
};

// The work of `tile`, planned alike by the producer and the consumers.
template <class Traits>
CUTE_DEVICE TileWork plan_tile(ForwardKernelParams<Traits> const& kp, int tile) {
  if constexpr (Traits::kSplitKv) {
    const int base = tile / kp.num_splits;
    TileWork w = TileWork::plan<Traits::kBlockM, Traits::kBlockN, false, Traits::kPackGqa>(
        kp.params, kp.scheduler.decode(base), kp.heads_per_kv, kp.window_left, kp.window_right);
    w.keep_split<Traits::kBlockN>(tile - base * kp.num_splits, kp.num_splits);
    return w;
  } else {
    return TileWork::plan<Traits::kBlockM, Traits::kBlockN, Traits::kHstu, Traits::kPackGqa>(
        kp.params, kp.scheduler.decode(tile), kp.heads_per_kv, kp.window_left, kp.window_right);
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    forward_kernel_sm90(CUTE_GRID_CONSTANT ForwardKernelParams<Traits> const kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Mainloop = ForwardMainloopSm90<Traits>;
  using Epilogue = ForwardEpilogueSm90<Traits>;
  using PipelineKV = typename Traits::PipelineKV;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kNumMmaThreads = Traits::kNumMmaThreads;

  extern __shared__ char smem[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  const int warp_group = cutlass::canonical_warp_group_idx();
  const int warp_idx = cutlass::canonical_warp_idx_sync();

  if (warp_idx == 0 && cute::elect_one_sync()) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    if (Traits::kStoreOWithTma) cute::prefetch_tma_descriptor(kp.tma_o.get_tma_descriptor());
    if (Traits::kHasRabRing && kp.params.rab != nullptr) cute::prefetch_tma_descriptor(kp.tma_rab.get_tma_descriptor());
    for (int s = 0; s < Traits::kMaxQuerySlots; ++s) ss.barrier_q[s].init(Traits::kPackGqa ? 32 : 1);
    TileHandoff<kNumMmaThreads>::init(ss.handoff);
  }
  typename PipelineKV::Params pipeline_params;
  pipeline_params.transaction_bytes = Traits::kTmaBytesKV;
  pipeline_params.role = warp_group == 0 ? PipelineKV::ThreadCategory::Producer : PipelineKV::ThreadCategory::Consumer;
  pipeline_params.is_leader = threadIdx.x == 0;
  // K and V slots are released once per consumer warp (ForwardMainloopSm90::release_slot), rab slots by every
  // consumer thread that reads the slot (their shared-memory reads are the threads' own loads).
  pipeline_params.num_consumers = kNumMmaThreads / 32;
  PipelineKV pipeline_k(ss.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
  PipelineKV pipeline_v(ss.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
  typename Traits::PipelineRab::Params rab_params;
  rab_params.transaction_bytes = Traits::kTmaBytesRab;
  rab_params.role = warp_group == 0 ? Traits::PipelineRab::ThreadCategory::Producer
                                    : Traits::PipelineRab::ThreadCategory::Consumer;
  rab_params.is_leader = threadIdx.x == 0;
  rab_params.num_consumers = Traits::kRabSlotReaders;
  typename Traits::PipelineRab pipeline_rab(ss.pipeline_rab, rab_params, Shape<_1, _1, _1>{});
  __syncthreads();

  // The Q slots of this launch and the slot and phase of the queries-th Q tile (tiles with work): HSTU without
  // rab gets a second slot in a one-slot kernel (Traits::kSpareQuerySlot).
  auto query_slots = [&]() -> uint32_t {
    return Traits::kSpareQuerySlot && kp.params.rab == nullptr ? 2u : uint32_t(Traits::kQueryStages);
  };
  auto query_slot = [&](uint32_t queries) {
    return Traits::kSpareQuerySlot ? int(queries & (query_slots() - 1)) : int(queries % Traits::kQueryStages);
  };
  auto query_phase = [&](uint32_t queries) {
    return Traits::kSpareQuerySlot ? (queries >> (query_slots() - 1)) & 1 : (queries / Traits::kQueryStages) & 1;
  };
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (warp_idx != 0) return;
    // The counters live across the tile loop, in as few registers as the warp's 24 allow (softmax d 256 spilled
    // two of them): `progress` holds the K/V blocks loaded so far above bit 0, the parity of the tiles handed
    // over in bit 0; `queries` the Q tiles loaded so far (tiles with work), slot query_slot(queries). With one
    // Q slot only whether a Q was loaded before matters, which the block count says (a tile with work loads
    // blocks), and `queries` stays 0 (a kernel with a spare slot counts them: its launches without rab use two).
    uint32_t progress = 0;
    uint32_t queries = 0;
    // The next tile is claimed before this one's loads (the atomic's latency hides behind them), but with one
    // rab head shared by the query heads once they are issued, a block or two before the consumers finish the
    // tile: CTAs then claim tiles about when they start them, so consecutive tiles (the heads of one batch entry
    // at one m block) run at the same time and share the rab tiles in L2. Claimed before the loads, a tile
    // started up to a whole tile later than its neighbours, and the HSTU forward read the shared rab tiles 2.9
    // times from DRAM (ncu, H100, jagged max 8k, h 4). H100 bf16, jagged d 128 h 4 with one rab head, same
    // process: max 4k / 8k 441-447 / 464-468 -> 451-458 / 492-495 TFLOP/s; without rab the late claim cost 1-3%.
    const bool claim_late = Traits::kHasRabRing && kp.params.rab != nullptr && kp.params.rab_heads < kp.params.heads;
    for (int tile = blockIdx.x; tile < kp.scheduler.num_tiles;) {
      int claimed = 0;
      if (!claim_late) claimed = TileHandoff<kNumMmaThreads>::producer_claim(kp.tile_counter, tile);
      const TileWork w = plan_tile(kp, tile);
      if (w.has_rows() && w.has_keys()) {
        const uint32_t loaded = progress >> 1;
        // A Q slot holds its last tile's Q until every consumer warpgroup finished that tile's last Q K^T.
        const int q_slot = query_slot(queries);
        const bool q_slot_used = Traits::kSpareQuerySlot  ? queries >= query_slots()
                                 : Traits::kQueryStages == 1 ? loaded > 0
                                                             : queries >= uint32_t(Traits::kQueryStages);
        // One Q slot: the wait goes inside `load`, after the tile's first K block is issued. With two, it stays
        // here: inside `load` it cost the softmax d 128 kernels a 4-byte spill (the producer's 24 registers).
        auto wait_q_slot = [&]() {
          if (q_slot_used) barrier_sync(kNumMmaThreads + 32, offset(FwdBarrier::kQueryEmpty0, q_slot));
        };
        if constexpr (Traits::kQueryStages > 1) wait_q_slot();
        auto acquire_q_slot = [&]() {
          if constexpr (Traits::kQueryStages == 1) wait_q_slot();
        };
        const uint32_t now_loaded =
            Mainloop::load(kp, ss, pipeline_k, pipeline_v, pipeline_rab, loaded, q_slot, acquire_q_slot, w);
        progress = now_loaded << 1 | (progress & 1);
        if constexpr (Traits::kQueryStages > 1 || Traits::kSpareQuerySlot) ++queries;
      }
      if (claim_late) claimed = TileHandoff<kNumMmaThreads>::producer_claim(kp.tile_counter, tile);
      tile = TileHandoff<kNumMmaThreads>::producer_publish(kp.tile_counter, ss.handoff, kp.scheduler.num_tiles,
                                                           claimed, progress & 1);
      progress ^= 1;
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    const MmaScheduler<Traits::kNumMmaWarpGroups> sched{warp_group - 1};  // warp-uniform: a uniform register, not a spill
    sched.init();
    typename Mainloop::ReadPosition read_k, read_v;
    typename Mainloop::RabReadPosition read_rab;
    uint32_t queries = 0;  // tiles with work so far, as the producer counts them
    TileHandoff<kNumMmaThreads> handoff;
    for (int tile = blockIdx.x; tile < kp.scheduler.num_tiles;
         tile = handoff.consumer_next(kp.tile_counter, ss.handoff, tile)) {
      const TileWork w = plan_tile(kp, tile);
      if (!w.has_rows()) continue;
      // The thread's index read again for the tile and again for its epilogue: derived once, its row coordinates
      // stayed live across every tile and spilled (softmax d 256, HSTU d 96).
      const int tid = consumer_thread_index<Traits::kOpaqueThreadIndex>();
      if (!w.has_keys()) {
        Epilogue::store_empty(kp, w, tid);
        continue;
      }
      const int q_slot = query_slot(queries);
      ss.barrier_q[q_slot].wait(query_phase(queries));
      // Packed GQA: the cp.async writes of Q (generic proxy), visible to this thread's wgmmas (async proxy).
      if constexpr (Traits::kPackGqa) cutlass::arch::fence_view_async_shared();
      ++queries;
      // The epilogue's view of the tile: planned again from the tile index where registers are short
      // (Traits::kReplanEpilogue), so the sequence and coordinates are not kept live across the mainloop.
      auto epilogue_work = [&]() {
        if constexpr (Traits::kReplanEpilogue) {
          return plan_tile(kp, opaque_copy(tile));
        } else {
          return w;
        }
      };
      typename Traits::TiledMmaPV tiled_mma_pv;
      cute::Tensor tOrO = partition_fragment_C(tiled_mma_pv, select<0, 1>(typename Traits::TileShapePV{}));  // (MMA, MMA_M, MMA_N)
      if constexpr (Traits::kHstu) {
        HstuPointwise hstu(kp.params);
        Mainloop::mma(kp, ss, pipeline_k, pipeline_v, pipeline_rab, read_k, read_v, read_rab, w, q_slot, tid, sched,
                      tOrO, hstu);
        Epilogue::store(kp, ss, epilogue_work(), consumer_thread_index<Traits::kOpaqueThreadIndex>(), tOrO);
      } else {
        OnlineSoftmax<2> softmax(kp.score.scale_log2);
        Mainloop::mma(kp, ss, pipeline_k, pipeline_v, pipeline_rab, read_k, read_v, read_rab, w, q_slot, tid, sched,
                      tOrO, softmax);
        float inv_sum[2], lse[2];
        softmax.finalize(inv_sum, lse);
        Epilogue::store(kp, ss, epilogue_work(), consumer_thread_index<Traits::kOpaqueThreadIndex>(), tOrO, inv_sum,
                        lse);
      }
    }
    Epilogue::drain(consumer_thread_index<Traits::kOpaqueThreadIndex>());
  }
#else
  __trap();  // built for an architecture without wgmma/TMA: never launched (supports() needs sm_90a)
#endif
}

}  // namespace cuteattn::sm90

namespace cuteattn::detail {

template <ScoreFunction kScore, DType kDType, int kHeadDim>
struct Sm90Forward {
  static constexpr bool kHstu = kScore == ScoreFunction::kHstuSilu;
  using Traits = sm90::ForwardTraitsSm90<kDType, kHeadDim, kHstu>;
  using Element = typename Traits::Element;

  static Status supports(const Params& p) {
    static_assert(kScore == ScoreFunction::kSoftmax || kScore == ScoreFunction::kHstuSilu);
    // Dispatch asks on every call: the message is built only for a refusal.
    auto refuse = [](const char* why) {
      return Status::NotSupported(std::string("sm90 forward (") + (kHstu ? "hstu" : "softmax") + ", head dim " +
                                  std::to_string(kHeadDim) + "): " + why);
    };
    if (p.score != kScore) return refuse("score function mismatch");
    if (p.dtype != kDType) return refuse("dtype mismatch");
    // d != d_v: both within the bucket; the columns past either are zero-filled by TMA and never stored.
    if (p.head_dim > kHeadDim || p.head_dim % 8 != 0) return refuse("needs d <= bucket and d % 8 == 0");
    if (p.head_dim_v > kHeadDim || p.head_dim_v % 8 != 0) return refuse("needs d_v <= bucket and d_v % 8 == 0");
    if (kHstu) {
      if (const char* why = sm90::hstu_tma_refusal<Element>(p)) return refuse(why);
    } else {
      if (!(p.scale > 0.0f)) return refuse("needs softmax_scale > 0");
      if (p.num_contexts != nullptr || p.num_targets != nullptr)
        return refuse("contextual/target masks are HSTU only");
    }
    const int64_t rows_q = p.varlen ? p.total_q : p.seqlen_q;
    const int64_t rows_k = p.varlen ? p.total_k : p.seqlen_k;
    const int64_t m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
    if (rows_q >= (int64_t(1) << 31) || rows_k >= (int64_t(1) << 31) || p.heads >= (int64_t(1) << 31) ||
        m_blocks * p.heads * p.batch >= (int64_t(1) << 31))
      return refuse("sizes beyond 32-bit TMA coordinates / tile counts");
    // TMA: 16-byte aligned base and 16-byte multiple strides (the epilogue's 16-byte stores need the same).
    auto aligned = [](const RowMajorView& t) {
      constexpr int64_t kVec = 16 / sizeof(Element);
      return reinterpret_cast<uintptr_t>(t.ptr) % 16 == 0 && t.row_stride % kVec == 0 &&
             t.head_stride % kVec == 0 && t.batch_stride % kVec == 0;
    };
    if (!aligned(p.q) || !aligned(p.k) || !aligned(p.v) || !aligned(p.o))
      return refuse("needs 16-byte aligned pointers and strides");
    return Status::Ok();
  }

  // Masks and jagged lengths make the work vary per tile: tiles are then scheduled dynamically
  // (tile_scheduler_sm90.cuh) from a counter, the workspace's first int. launch zeroes it on the stream (a
  // caller's workspace may hold anything); the kernel leaves it zero.
  static bool dynamic_schedule(const Params& p) { return p.window_right >= 0 || p.window_left >= 0 || p.varlen; }
  // Split-KV adds the partials after the counter's 256 bytes: LSE (num_splits * h * total_q floats, rounded up to
  // 256 bytes), then O (d floats per row).
  static constexpr size_t kPartialsOffset = 256;
  static size_t partial_lse_bytes(const Params& p, int splits) {
    return (size_t(splits) * size_t(p.heads * p.total_q) * sizeof(float) + 255) / 256 * 256;
  }
  struct SplitPartials {
    float* lse;
    float* o;
  };
  static SplitPartials split_partials(const Params& p, void* workspace, int splits) {
    char* base = static_cast<char*>(workspace) + kPartialsOffset;
    return {reinterpret_cast<float*>(base), reinterpret_cast<float*>(base + partial_lse_bytes(p, splits))};
  }
  static size_t workspace_bytes(const Params& p) {
    const int splits = num_splits(p);
    if (splits == 1) return dynamic_schedule(p) ? 16 : 0;
    return kPartialsOffset + partial_lse_bytes(p, splits) +
           size_t(splits) * size_t(p.heads * p.total_q) * size_t(p.head_dim_v) * sizeof(float);
  }

  // Softmax d 128 over long key ranges runs the wide-key kernel (kBlockN 176); a sliding window or short keys
  // keep 128-key blocks, whose TMA-store epilogue and second Q slot serve short tiles (kernel_traits_sm90.cuh).
  static constexpr bool kHasWideKeys = !kHstu && kHeadDim == 128;
  static constexpr int64_t kWideKeysMinSeqlen = 4096;
  static bool wide_keys(const Params& p) {
    return kHasWideKeys && p.window_left < 0 && p.seqlen_k >= kWideKeysMinSeqlen;
  }

  // Softmax d 64 over long rows runs three consumer warpgroups on 192-row tiles (kernel_traits_sm90.cuh); short
  // rows keep two on 128-row tiles, as a causal diagonal or a short last tile wastes more of a 192-row tile.
  // H100 bf16, same run, TFLOP/s three vs two: no mask s 512 320 vs 322, s 2k 458 vs 416, s 16k 517 vs 443;
  // causal s 512 165 vs 190, s 2k 326 vs 338, s 16k 466 vs 422 (the thresholds lie between measured lengths).
  // A sliding window keeps two.
  static constexpr bool kHasLongRows = !kHstu && kHeadDim == 64;
  static constexpr int64_t kLongRowsMinSeqlen = 1024;
  static constexpr int64_t kLongRowsMinSeqlenCausal = 4096;
  static bool long_rows(const Params& p) {
    return kHasLongRows && p.window_left < 0 &&
           p.seqlen_k >= (p.window_right >= 0 ? kLongRowsMinSeqlenCausal : kLongRowsMinSeqlen);
  }

  // GQA with few query rows per head (decode, speculative verification, chunked prefill) packs the g = h / h_k
  // query heads of a kv head into the rows of one tile (ForwardTraitsSm90's kPackGqa): the tile fills and K/V
  // are read once per kv head instead of once per query head. Packed where s_q <= 128 and the packed 128-row
  // tiles compute at least 1/8 fewer rows than the unpacked kernel's tiles (each head's s_q rounded up to 128
  // rows, or 192 where long_rows): s_q <= 64 (g 2), 96 (g 4), 112 (g 8 and 16), and every s_q <= 128 with
  // 192-row tiles. H100 bf16, b 8, h 32, h_k 4 and 8, s_k 4096 and 16384, causal or not, packed vs unpacked:
  // s_q 1, 16, 64: 1.5-1.9x faster at d 128, 2.1-2.5x at d 64; s_q 128 (no fewer rows at d 128): 0.89-1.08x at
  // d 128, but 1.16-1.43x at d 64 over the 192-row tiles. Environment CUTEATTN_SM90_PACK_GQA=0 / 1 forces it
  // off / on (where g > 1): A/B timing (bench/gqa_short_queries.py), and the tests' packed tiles over long
  // query ranges.
  static constexpr bool kHasPackGqa = !kHstu && (kHeadDim == 64 || kHeadDim == 128);
  static bool pack_gqa(const Params& p) {
    if (!kHasPackGqa || p.heads_k >= p.heads) return false;
    const int64_t g = p.heads / p.heads_k;
    // Packed row indices and the tile count stay 32-bit.
    const int64_t packed_rows = p.seqlen_q * g;
    constexpr int64_t kBlockM = Traits::kBlockM;  // the packed kernel's too
    if (packed_rows + kBlockM >= (int64_t(1) << 31) ||
        (packed_rows + kBlockM - 1) / kBlockM * p.heads_k * p.batch >= (int64_t(1) << 31))
      return false;
    // Read on every call (tests switch it between calls).
    const char* forced = std::getenv("CUTEATTN_SM90_PACK_GQA");
    if (forced != nullptr && forced[0] != '\0') return forced[0] != '0';
    if (p.seqlen_q > kBlockM) return false;  // longer query rows: not measured
    const int64_t unpacked_block =
        long_rows(p) ? 64 * sm90::forward_tile_config(kHeadDim, false, false, true).mma_warpgroups : kBlockM;
    const int64_t unpacked = g * ((p.seqlen_q + unpacked_block - 1) / unpacked_block * unpacked_block);
    const int64_t packed = (packed_rows + kBlockM - 1) / kBlockM * kBlockM;
    return 8 * packed <= 7 * unpacked;
  }

  // HSTU d 128 without rab runs a kernel without the rab ring (ForwardTraitsSm90's kRabless), whose shared
  // memory then has room for the O staging tile of the TMA-store epilogue and two Q slots.
  static constexpr bool kHasRabless = Traits::kRablessVariant;

  // Split-KV (FlashDecoding): where the tiles (packed or not) fill under 80% of the SMs, each tile's key blocks are
  // cut into num_splits contiguous chunks, one tile each (kSplitKv, TileWork::keep_split), and a combine kernel
  // merges the fp32 partials (cuda/split_kv_combine.cuh). The count follows FlashAttention's heuristic: the
  // smallest count whose wave efficiency tiles * splits / (SMs * waves) is within 85% of the best, among the
  // counts that shorten the chunks, with at least kMinBlocksPerSplit key blocks per chunk and at most kMaxSplits.
  // Tiles that already fill 40% of the SMs stream K/V near the memory bound, so splitting gains little next to
  // the combine's fixed cost: their chunks keep at least kMinBlocksPerSplitBusy blocks. H100 bf16, h 32, h_k 8,
  // b 8, s_q 1 and 16 (64 packed tiles), 2 splits vs unsplit, ms: d 128 s_k 4096 (16 blocks a chunk, now
  // unsplit) 0.0717-0.0735 vs 0.0679-0.0688; s_k 8192 (32, split) 0.1149-0.1177 vs 0.1156-0.1164; s_k 16384
  // (64, split) 0.2023-0.2042 vs 0.2089-0.2114; d 64 s_k 4096 (unsplit) 0.0477-0.0486 vs 0.0479-0.0484, s_k 8192
  // (split) 0.0729-0.0730 vs 0.0843. 32 tiles (b 8, h_k 4) split 8-block chunks at 0.67-0.83x the unsplit time.
  // Softmax d 64 and 128 without a sliding window (a window's few visible blocks would leave most chunks
  // empty). Environment CUTEATTN_SM90_NUM_SPLITS=<n> forces n (1 to 128; 1 = unsplit) for every call of these
  // buckets: tests and A/B timing (bench/gqa_short_queries.py).
  static constexpr bool kHasSplitKv = !kHstu && (kHeadDim == 64 || kHeadDim == 128);
  static constexpr int kMaxSplits = 128;
  static constexpr int64_t kMinBlocksPerSplit = 4;
  static constexpr int64_t kMinBlocksPerSplitBusy = 32;
  static int num_splits(const Params& p) {
    if (!kHasSplitKv) return 1;
    constexpr int64_t kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;  // the split kernels' (base tiles)
    const bool packed = pack_gqa(p);
    const int64_t rows = packed ? p.seqlen_q * (p.heads / p.heads_k) : p.seqlen_q;
    const int64_t tiles = (rows + kBlockM - 1) / kBlockM * (packed ? p.heads_k : p.heads) * p.batch;
    if (tiles == 0 || tiles * kMaxSplits >= (int64_t(1) << 31)) return 1;  // tile indices stay 32-bit
    // Read on every call (tests switch it between calls).
    const char* forced = std::getenv("CUTEATTN_SM90_NUM_SPLITS");
    if (forced != nullptr && forced[0] != '\0') return int(std::clamp<long>(std::atol(forced), 1, kMaxSplits));
    if (p.window_left >= 0) return 1;
    const int64_t sms = std::max(DeviceProperties::of(p.device_index).sms, 1);
    if (tiles * 10 >= sms * 8) return 1;
    const int64_t blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
    const int64_t min_blocks = tiles * 5 >= sms * 2 ? kMinBlocksPerSplitBusy : kMinBlocksPerSplit;
    const int max_splits = int(std::min<int64_t>(kMaxSplits, blocks / min_blocks));
    auto efficiency = [&](int n) {
      const double waves = double(tiles * n) / double(sms);
      return waves / std::ceil(waves);
    };
    // Counts that leave the chunk length of n - 1 add tiles but no shorter critical path: not eligible.
    auto eligible = [&](int n) { return n == 1 || (blocks + n - 1) / n != (blocks + n - 2) / (n - 1); };
    double best = 0.0;
    for (int n = 1; n <= max_splits; ++n) {
      if (eligible(n)) best = std::max(best, efficiency(n));
    }
    for (int n = 1; n <= max_splits; ++n) {
      if (eligible(n) && efficiency(n) >= 0.85 * best) return n;
    }
    return 1;
  }

  static Status launch(const Params& p, void* workspace) {
    Status s = supports(p);
    if (!s.ok()) return s;
    if constexpr (kHasSplitKv) {
      const int splits = num_splits(p);
      if (splits > 1) {
        if (workspace == nullptr)
          return Status::Invalid("workspace", "null, but this split-KV call needs " +
                                                  std::to_string(workspace_bytes(p)) + " bytes");
        s = pack_gqa(p) ? launch_with<sm90::ForwardTraitsSm90<kDType, kHeadDim, false, false, false, true, true>>(
                              p, workspace, splits)
                        : launch_with<sm90::ForwardTraitsSm90<kDType, kHeadDim, false, false, false, false, true>>(
                              p, workspace, splits);
        if (!s.ok()) return s;
        return combine_splits(p, workspace, splits);
      }
    }
    if constexpr (kHasPackGqa) {
      if (pack_gqa(p)) {
        return launch_with<sm90::ForwardTraitsSm90<kDType, kHeadDim, false, false, false, true>>(p, workspace);
      }
    }
    if constexpr (kHasWideKeys) {
      if (wide_keys(p)) return launch_with<sm90::ForwardTraitsSm90<kDType, kHeadDim, false, true>>(p, workspace);
    }
    if constexpr (kHasLongRows) {
      if (long_rows(p)) {
        return launch_with<sm90::ForwardTraitsSm90<kDType, kHeadDim, false, false, true>>(p, workspace);
      }
    }
    if constexpr (kHasRabless) {
      if (p.rab == nullptr) {
        return launch_with<sm90::ForwardTraitsSm90<kDType, kHeadDim, true, false, false, false, false, true>>(
            p, workspace);
      }
    }
    return launch_with<Traits>(p, workspace);
  }

  // The combine of the split partials into O and LSE (every row of h * total_q, rows without keys included).
  static Status combine_splits(const Params& p, void* workspace, int splits) {
    const SplitPartials partials = split_partials(p, workspace, splits);
    SplitKvCombineParams c;
    c.lse_partial = partials.lse;
    c.o_partial = partials.o;
    c.rows = p.heads * p.total_q;
    c.num_splits = splits;
    c.head_dim = int(p.head_dim_v);
    c.o = p.o;
    c.lse = p.lse;
    c.varlen = p.varlen;
    c.seqlen_q = p.seqlen_q;
    c.total_q = p.total_q;
    c.heads = p.heads;
    return launch_split_kv_combine<Element>(c, static_cast<cudaStream_t>(p.stream));
  }

  template <class T>
  static Status launch_with(const Params& p, void* workspace, int splits = 1) {
    using namespace cute;
    const int rows_q = int(p.varlen ? p.total_q : p.seqlen_q);
    const int rows_k = int(p.varlen ? p.total_k : p.seqlen_k);
    const int batches = p.varlen ? 1 : int(p.batch);
    // A stride of an extent-1 mode is never used; TMA still wants it 16-byte aligned.
    auto stride_of = [](int64_t extent, int64_t stride, int64_t fallback) {
      return extent == 1 ? fallback : stride;
    };
    auto make_view = [&](const RowMajorView& t, int rows, int64_t cols, int64_t heads, auto* element) {
      const int64_t big = int64_t(rows) * t.row_stride;
      return cute::make_tensor(make_gmem_ptr(static_cast<decltype(element)>(t.ptr)),
                         make_shape(rows, int(cols), int(heads), batches),
                         make_stride(t.row_stride, _1{}, stride_of(heads, t.head_stride, big),
                                     stride_of(batches, t.batch_stride, big)));
    };
    Element const* const kIn = nullptr;  // element types of the views: loads read, the store writes
    Element* const kOut = nullptr;
    sm90::ForwardKernelParams<T> kp{
        make_tma_copy(SM90_TMA_LOAD{}, make_view(p.q, rows_q, p.head_dim, p.heads, kIn), typename T::SmemLayoutQ{},
                      Shape<Int<T::kBlockM>, Int<kHeadDim>>{}, _1{}),
        make_tma_copy(SM90_TMA_LOAD{}, make_view(p.k, rows_k, p.head_dim, p.heads_k, kIn),
                      take<0, 2>(typename T::SmemLayoutK{}), Shape<Int<T::kBlockN>, Int<kHeadDim>>{},
                      _1{}),
        make_tma_copy(SM90_TMA_LOAD{}, make_view(p.v, rows_k, p.head_dim_v, p.heads_k, kIn),
                      take<0, 2>(typename T::SmemLayoutV{}), Shape<Int<T::kBlockN>, Int<kHeadDim>>{},
                      _1{}),
        make_tma_copy(SM90_TMA_STORE{}, make_view(p.o, rows_q, p.head_dim_v, p.heads, kOut),
                      take<0, 2>(typename T::SmemLayoutO{}),
                      Shape<Int<T::kRowsPerWarpGroup>, Int<kHeadDim>>{}, _1{}),
        make_shape(rows_q, int(p.head_dim), int(p.heads), batches),
        make_shape(rows_k, int(p.head_dim), int(p.heads_k), batches),
        p,
        {},
        nullptr,
        int(p.heads / p.heads_k),
        detail::Window32::bound(p.window_left, rows_k),
        detail::Window32::bound(p.window_right, rows_q),
        {},
        {},
        {},
        splits,
        0,
        nullptr,
        nullptr};
    if constexpr (T::kSplitKv) {
      const SplitPartials partials = split_partials(p, workspace, splits);
      kp.partial_rows = p.heads * p.total_q;
      kp.lse_partial = partials.lse;
      kp.o_partial = partials.o;
    }

    // Dispatch made p.device_index current.
    const DeviceProperties device = DeviceProperties::of(p.device_index);

    // Packed GQA: tiles over (packed m block, kv head, batch), each kv head's K/V read by its own tiles only.
    const int64_t tile_rows = T::kPackGqa ? p.seqlen_q * (p.heads / p.heads_k) : p.seqlen_q;
    const int64_t tile_heads = T::kPackGqa ? p.heads_k : p.heads;
    sm90::TileScheduler& sch = kp.scheduler;
    sch.num_m_blocks = int((tile_rows + T::kBlockM - 1) / T::kBlockM);
    sch.heads = int(tile_heads);
    sch.num_bh = int(tile_heads * p.batch);
    sch.num_tiles = sch.num_m_blocks * sch.num_bh * splits;
    sch.longest_first = p.window_right >= 0;
    if constexpr (kHstu) {
      // Sections of (batch, head) pairs whose K/V fit in half the L2 together.
      const int64_t kv_bytes_per_head = std::max<int64_t>(
          1, p.seqlen_k * (p.head_dim + p.head_dim_v) * int64_t(sizeof(Element)) * p.heads_k / tile_heads);
      sch.section = int(std::min<int64_t>(std::max<int64_t>(1, device.l2_bytes / 2 / kv_bytes_per_head), sch.num_bh));
    } else {
      // Sections of a quarter of the SM count: the CTAs running at once hold about four m blocks of each head
      // of a section. H100 bf16 causal FA grid, TFLOP/s of this vs the half-L2 sections above (twice each, same
      // run): d 128 s 512 279/280 vs 265/266, s 1k 399/400 vs 392/392, s 2k 502/487 vs 489/461, s 16k 661/629
      // vs 653/571; d 64 s 512 192/191 vs 188/191, s 2k 345/346 vs 337/337, s 16k 508/471 vs 480/438.
      sch.section = std::min(std::max((device.sms + 3) / 4, 1), sch.num_bh);
    }
    sch.init();
    if (sch.num_tiles == 0) return Status::Ok();
    auto stream = static_cast<cudaStream_t>(p.stream);
    if (dynamic_schedule(p)) {
      if (workspace == nullptr) return Status::Invalid("workspace", "null, but this call needs 16 bytes");
      kp.tile_counter = static_cast<int*>(workspace);
      const cudaError_t err = cudaMemsetAsync(workspace, 0, sizeof(int), stream);
      if (err != cudaSuccess)
        return {StatusCode::kCudaError, std::string("sm90 forward: cudaMemsetAsync: ") + cudaGetErrorString(err)};
    }

    if constexpr (T::kHasRabRing) {
      if (p.rab != nullptr) {
        const int max_sk = int(p.seqlen_k);
        const int64_t big = int64_t(max_sk) * p.rab_row_stride;
        auto rab = cute::make_tensor(make_gmem_ptr(static_cast<Element const*>(p.rab)),
                                     make_shape(max_sk, max_sk, int(p.rab_heads), int(p.batch)),
                                     make_stride(p.rab_row_stride, _1{}, stride_of(p.rab_heads, p.rab_head_stride, big),
                                                 stride_of(p.batch, p.rab_batch_stride, big)));
        kp.tma_rab = make_tma_copy(SM90_TMA_LOAD{}, rab, take<0, 2>(typename T::SmemLayoutRab{}),
                                   Shape<Int<T::kRabTileRows>, Int<T::kBlockN>>{}, _1{});
        kp.shape_rab = rab.shape();
      }
    }
    kp.score.softcap = p.softcap;
    kp.score.scale_over_cap = p.softcap > 0.0f ? p.scale / p.softcap : 0.0f;
    kp.score.scale_log2 = (p.softcap > 0.0f ? 1.0f : p.scale) * float(M_LOG2E);

    auto kernel = sm90::forward_kernel_sm90<T>;
    constexpr int kSmem = T::kSmemBytes;
    cudaError_t err = opt_in_shared_memory<T>(kernel, kSmem, p.device_index);
    if (err != cudaSuccess)
      return {StatusCode::kCudaError, std::string("sm90 forward: cudaFuncSetAttribute: ") + cudaGetErrorString(err)};
    const int grid = std::min(sch.num_tiles, std::max(device.sms, 1));
    kernel<<<grid, T::kNumThreads, kSmem, stream>>>(kp);
    err = cudaGetLastError();
    if (err != cudaSuccess)
      return {StatusCode::kCudaError, std::string("sm90 forward: launch: ") + cudaGetErrorString(err)};
    return Status::Ok();
  }
};

}  // namespace cuteattn::detail
