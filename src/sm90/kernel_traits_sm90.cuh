// Compile-time shape of the sm90 forward kernel for one (element type, head dim, score function): tile sizes,
// thread roles, shared-memory layouts, TMA copy types and the two warpgroup MMAs (S = Q K^T from shared memory,
// O += P V with P from registers). HSTU adds a ring of rab tiles (kBlockM x kBlockN) next to the K/V ring; where
// the budget leaves room, an O staging tile for the TMA-store epilogue and a second Q slot.
#pragma once

#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED  // the wgmma N = 80, 112 and 176 atoms (see forward_sm90.cuh)
#endif

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuteattn/types.h"
#include "sm90/tile_scheduler_sm90.cuh"

namespace cuteattn::sm90 {

using namespace cute;

struct ForwardTileConfig {
  int mma_warpgroups;  // consumer warpgroups, 64 query rows each: kBlockM = 64 * mma_warpgroups
  int block_n;
  int stages;
  int producer_registers;  // setmaxnreg of the producer warpgroup; the consumers get the rest (the traits)
};

// Two consumer warpgroups (kBlockM 128), and three (kBlockM 192) in the long-row kernel of softmax d 64
// (Sm90Forward::long_rows): at d 64 a 128 x 128 Q K^T and P V are short next to the softmax of the block, and a
// third warpgroup's tensor-core work hides more of it. kBlockN and the K/V ring depth fill the 227 KB of shared
// memory:
//   Q (kBlockM x d) + stages * (K + V) (kBlockN x d each), 16-bit elements.
// Registers per consumer thread: S = 64 x kBlockN / 128 and O = 64 x d / 128 fp32, plus P in 16 bits; the
// score of block n overlaps P V of block n + 1, so S, P and O are live at once.
//   d  64: 16 KB + 4 x 32 KB                         S 64, O  32
//   d  96: 24 KB + 3 x 48 KB                         S 64, O  48
//   d 128: 32 KB + 2 x 64 KB                         S 64, O  64
//   d 192: 48 KB + 2 x 84 KB, kBlockN 112            S 56, O  96
//   d 256: 64 KB + 2 x 80 KB, kBlockN 80             S 40, O 128
// HSTU adds a rab tile (kBlockM x kBlockN) to every stage (d 128: to one, kRabDepth):
//   d  64: 16 KB + 3 x (32 + 32) KB
//   d  96: 24 KB + 2 x (48 + 32) KB
//   d 128: 32 KB + 2 x 64 KB + 32 KB, and the O staging tile 32 KB
//   d 192: 48 KB + 2 x (48 + 16) KB, kBlockN 64 (96 leaves no room for the rab ring)
//   d 256: 64 KB + 2 x (64 + 16) KB, kBlockN 64
// and without rab (kRabless, d 128 only: elsewhere the ring freed holds no more than the traits already have)
// the softmax layout with its O staging tile and second Q slot.
// Wide keys (softmax d 128 on long key ranges, Sm90Forward::wide_keys): kBlockN 176, 32 KB + 2 x 88 KB; no room
// for the O staging tile or a second Q slot, which short tiles need (s 512: 20% slower), while long rows gain
// (s 16k: +5%).
// Long rows (softmax d 64): kBlockM 192, 24 KB + 4 x 32 KB; 160 registers per consumer thread (512 threads).
// HSTU d 64 with three warpgroups measured slower (H100 bf16, kBlockN 64 as 128 spilled 360 bytes: 215 vs 236
// TFLOP/s at max_seqlen 1k, 384 vs 410 at 4k).
constexpr ForwardTileConfig forward_tile_config(int head_dim, bool hstu, bool wide_keys, bool long_rows) {
  if (wide_keys) return ForwardTileConfig{2, 176, 2, 40};
  if (long_rows) return ForwardTileConfig{3, 128, 4, 32};
  if (hstu) {
    return head_dim <= 64    ? ForwardTileConfig{2, 128, 3, 40}
           : head_dim <= 128 ? ForwardTileConfig{2, 128, 2, 40}
                             : ForwardTileConfig{2, 64, 2, 40};
  }
  return head_dim <= 64    ? ForwardTileConfig{2, 128, 4, 40}
         : head_dim <= 96  ? ForwardTileConfig{2, 128, 3, 40}
         : head_dim <= 128 ? ForwardTileConfig{2, 128, 2, 40}
         : head_dim <= 192 ? ForwardTileConfig{2, 112, 2, 40}
                           : ForwardTileConfig{2, 80, 2, 24};
}

// Index of a consumer thread among the consumer threads (warpgroups 1 and up). kOpaque: read through an opaque
// instruction, so the compiler re-reads it where it is used instead of keeping values derived from it (the
// thread's row coordinates) in registers across tiles, where they spilled (softmax d 256, HSTU d 96); where
// nothing spills the plain index is faster (H100, same run: softmax d 64 s 512 causal 190 vs 185 TFLOP/s, d 128
// s 16k 681 vs 675, d 128 s 512 causal 268 vs 265).
template <bool kOpaque>
CUTE_DEVICE int consumer_thread_index() {
  if constexpr (kOpaque) {
    uint32_t t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return int(t) - 128;
  } else {
    return int(threadIdx.x) - 128;
  }
}

// `x` through an opaque move: the compiler cannot tell the result from x's other uses, so what is derived from it
// is derived again instead of kept live from an earlier derivation.
CUTE_DEVICE int opaque_copy(int x) {
  asm volatile("mov.b32 %0, %0;" : "+r"(x));
  return x;
}

template <DType kDType>
using ElementOf = std::conditional_t<kDType == DType::kBFloat16, cutlass::bfloat16_t, cutlass::half_t>;

// The widest wgmma-canonical swizzle whose row (kCols 16-bit elements) the K-major tile rows are a multiple of.
template <class Element, int kCols>
using SmemAtomKMajor =
    std::conditional_t<kCols % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                       std::conditional_t<kCols % 32 == 0, GMMA::Layout_K_SW64_Atom<Element>,
                                          GMMA::Layout_K_SW32_Atom<Element>>>;

// The rab ring of the HSTU kernel; the softmax kernel has none.
template <bool kHstu, class Element, class SmemLayoutRab>
struct RabStorage {};
template <class Element, class SmemLayoutRab>
struct RabStorage<true, Element, SmemLayoutRab> {
  alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutRab>, 1024> rab;
};

// The O staging tile of the TMA-store epilogue, where the shared-memory budget has room for it.
template <bool kStoreO, class Element, class SmemLayoutO>
struct OStorage {};
template <class Element, class SmemLayoutO>
struct OStorage<true, Element, SmemLayoutO> {
  alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutO>, 1024> o;
};

// kPackGqa: the query heads of a GQA group share the rows of a tile (Sm90Forward::pack_gqa; the row mapping is
// tile_scheduler_sm90.cuh's unpack_row): the producer loads Q with cp.async (a row of the tile gathers one head's
// row of Q, which no TMA box describes) and the epilogue stores O from registers.
// kSplitKv: each tile's key blocks are split into contiguous chunks run by separate tiles (Sm90Forward::num_splits),
// which write fp32 partial O and LSE into the workspace for the combine kernel (cuda/split_kv_combine.cuh).
// kRabless: HSTU launches without rab (d 128: kRablessVariant): no rab ring, so the shared memory it
// would take holds the O staging tile of the TMA-store epilogue and a second Q slot, as in the softmax d 128
// kernel (H100 bf16, causal, h 4, same process, against the rab kernel without rab: dense s 2k 477 -> 524 TFLOP/s,
// 4k 550 -> 604, 16k 666 -> 708; jagged max 1k 328 -> 404, 2k 445 -> 482, 4k 549 -> 585).
template <DType kDType, int kHeadDim_, bool kHstu_, bool kWideKeys_ = false, bool kLongRows_ = false,
          bool kPackGqa_ = false, bool kSplitKv_ = false, bool kRabless_ = false>
struct ForwardTraitsSm90 {
  using Element = ElementOf<kDType>;
  using ElementAccum = float;

  static constexpr bool kHstu = kHstu_;
  static constexpr bool kWideKeys = kWideKeys_;
  static constexpr bool kLongRows = kLongRows_;
  static constexpr bool kPackGqa = kPackGqa_;
  static constexpr bool kSplitKv = kSplitKv_;
  static constexpr bool kRabless = kRabless_;
  static constexpr bool kHasRabRing = kHstu && !kRabless;
  // The HSTU head dims whose launches without rab run the kRabless kernel (Sm90Forward::launch).
  static constexpr bool kRablessVariant = kHstu && kHeadDim_ == 128;
  static_assert(!kRabless || kRablessVariant, "rabless: HSTU d 128 only");
  static_assert(!kSplitKv || (!kHstu && !kWideKeys && !kLongRows), "split keys: the softmax base tiles only");
  static_assert(!kWideKeys || (!kHstu && kHeadDim_ == 128), "wide key blocks: softmax d 128 only");
  static_assert(!kLongRows || (!kHstu && kHeadDim_ == 64), "long rows: softmax d 64 only");
  static_assert(!kPackGqa || (!kHstu && !kWideKeys && !kLongRows), "packed GQA: the softmax base tiles only");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr ForwardTileConfig kConfig = forward_tile_config(kHeadDim, kHstu, kWideKeys, kLongRows);
  static constexpr int kNumMmaWarpGroups = kConfig.mma_warpgroups;
  static_assert(kNumMmaWarpGroups == 2 || kNumMmaWarpGroups == 3, "named barriers for up to three consumers");
  static constexpr int kBlockM = 64 * kNumMmaWarpGroups;
  static constexpr int kBlockN = kConfig.block_n;
  static constexpr int kStages = kConfig.stages;
  static constexpr int kNumMmaThreads = kNumMmaWarpGroups * 128;
  static constexpr int kNumThreads = kNumMmaThreads + 128;  // warpgroup 0 produces (one TMA warp)
  // setmaxnreg budget: the launch bound gives every thread 65536 / threads registers (rounded down to 8: 168 of
  // 384 threads, 128 of 512), split as producer * 128 + consumer * kNumMmaThreads. 40 / 232 by default: with 24
  // the producer warp spilled its tile loop (claim, plan, TMA issue: 28 bytes softmax d 128, 108 HSTU d 128).
  // Softmax d 256 (kBlockN 80) takes 24 / 240: with 232 its consumers spilled 52 bytes in the key-block loop
  // (row spans, softmax statistics); its producer's tile loop fits in 24 with its counters packed
  // (forward_sm90.cuh). Three consumer warpgroups: 32 / 160.
  static constexpr int kProducerRegisters = kConfig.producer_registers;
  static constexpr int kRegisterBudget = 65536 / kNumThreads / 8 * 8 * kNumThreads;
  static constexpr int kConsumerRegisters = (kRegisterBudget - kProducerRegisters * 128) / kNumMmaThreads / 8 * 8;
  static constexpr bool kOpaqueThreadIndex = kHstu || kHeadDim > 128 || kWideKeys || kNumMmaWarpGroups > 2;
  // Three consumer warpgroups (160 registers): the tile's work (sequence, coordinates) for the epilogue and the
  // ring positions are derived again where used instead of kept across the mainloop, where they spilled.
  static constexpr bool kReplanEpilogue = kNumMmaWarpGroups > 2;
  static constexpr bool kCountedReads = kNumMmaWarpGroups > 2;  // ForwardMainloopSm90::ReadPosition
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "wgmma K is 16");

  using TileShapeQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;  // (M, N, K) of S = Q K^T
  using TileShapePV = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;  // (M, N, K) of O = P V
  using AtomLayoutMNK = Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>;     // warpgroups split M
  using TiledMmaQK = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, ElementAccum, TileShapeQK>(),
                                             AtomLayoutMNK{}));
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, ElementAccum, TileShapePV, GMMA::Major::K, GMMA::Major::MN>(),
      AtomLayoutMNK{}));
  // One wgmma per warpgroup and k slice: without CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED the selector silently
  // splits N = 80 / 112 (any N but 8, 16, 32, 64, 96, 128, 192, 256) into N = 16 atoms: 25-30% slower on
  // an H100.
  static_assert(decltype(size<1>(typename TiledMmaQK::AtomShape_MNK{}))::value == kBlockN &&
                    decltype(size<1>(typename TiledMmaPV::AtomShape_MNK{}))::value == kHeadDim,
                "wgmma N narrower than the tile");

  using SmemAtom = SmemAtomKMajor<Element, kHeadDim>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = SmemLayoutK;
  // V^T for the B operand of P V: the same bytes as V viewed (kHeadDim, kBlockN, kStages), i.e. MN-major.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{},
      make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  static constexpr int kRowsPerWarpGroup = kBlockM / kNumMmaWarpGroups;
  // The rab ring, kRabDepth blocks deep: kStages, but one block at d 128, whose second block's 32 KB hold the O
  // staging tile instead. A one-block ring holds a tile per consumer warpgroup (its rows; slot b * warpgroups + w
  // is warpgroup w's tile of the b-th block), so the producer loads a warpgroup's next tile as soon as that
  // warpgroup has read this one, while the block's GEMMs run (H100 bf16, jagged max 1k / 2k / 4k / 8k with a rab,
  // against the two-block ring of whole tiles: 293 / 374 / 462 / 502 -> 305 / 392 / 465 / 502 TFLOP/s). Deeper
  // rings keep whole tiles, one per block (per-warpgroup tiles there: d 64 and 256 2-4% slower).
  static constexpr int kRabDepth = kHeadDim == 128 ? 1 : kStages;
  static constexpr int kRabTileRows = kRabDepth == 1 ? kRowsPerWarpGroup : kBlockM;
  static constexpr int kRabTilesPerBlock = kBlockM / kRabTileRows;
  static constexpr int kRabSlots = kRabDepth * kRabTilesPerBlock;
  static constexpr int kRabSlotReaders = kRabTileRows / kRowsPerWarpGroup * 128;  // consumer threads per tile
  // rab tiles row-major (query rows x key columns), 128-byte swizzled: the 8 rows of one accumulator column
  // pair read by a warp fall into 8 different 16-byte chunks, so the consumers' reads are conflict-free.
  using SmemLayoutRab = decltype(tile_to_shape(SmemAtomKMajor<Element, kBlockN>{},
                                               Shape<Int<kRabTileRows>, Int<kBlockN>, Int<kRabSlots>>{}));

  // Global views handed to TMA: (rows, d, heads, batch) with 64-bit strides; varlen uses rows = total, batch 1.
  using ShapeRows = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideRows = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensor = decltype(cute::make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeRows{},
                                          StrideRows{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutK{}),
                                       Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  // rab as (key position rows, key position cols, h_rab, b).
  using TmaRab = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutRab{}),
                                        Shape<Int<kRabTileRows>, Int<kBlockN>>{}, _1{}));

  // Epilogue: each consumer warpgroup stages its 64 rows of O in shared memory and one of its threads stores
  // them with TMA, so the warpgroup goes on to its next tile while the store drains. It needs kBlockM x d more
  // shared memory: softmax d <= 128 and HSTU d <= 192 have it (d 128: 32 + 2 x 64 + 32 KB, HSTU with its one
  // block of rab 32 KB more); the others store from registers, 16 bytes per thread after a transpose within each
  // quad (ForwardEpilogueSm90::store_from_registers). 1 KB of the budget is left for the barriers.
  static constexpr int kBytesO = kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kBytesMain =
      (kBlockM * kHeadDim + kStages * 2 * kBlockN * kHeadDim + (kHasRabRing ? kRabDepth * kBlockM * kBlockN : 0)) *
      int(sizeof(Element));
  static constexpr bool kStoreOWithTma = !kPackGqa && !kSplitKv && kBytesMain + kBytesO + 1024 <= 227 * 1024;
  // Q slots: a second one where the budget still has room (softmax d <= 128), so the producer loads the next
  // tile's Q while the consumers work on this one; short tiles (causal s 512) otherwise wait for it.
  static constexpr int kQueryStages =
      kBytesMain + kBlockM * kHeadDim * int(sizeof(Element)) + (kStoreOWithTma ? kBytesO : 0) + 1024 <= 227 * 1024
          ? 2
          : 1;
  // HSTU calls without rab to a kernel with a rab ring (no kRablessVariant) leave the ring unused: where the
  // traits have one Q slot, its first kBlockM x d elements serve as a second (the kernel decides per launch,
  // forward_kernel_sm90), so that the next tile's Q loads while the consumers finish this one instead of after
  // their last Q K^T.
  static constexpr bool kSpareQuerySlot = kHasRabRing && !kRablessVariant && kQueryStages == 1 &&
                                          cosize_v<SmemLayoutRab> >= cosize_v<SmemLayoutQ>;
  static constexpr int kMaxQuerySlots = kQueryStages + (kSpareQuerySlot ? 1 : 0);
  // (rows of a warpgroup, d, warpgroup): each warpgroup's rows contiguous, one TMA box.
  using SmemLayoutO =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kRowsPerWarpGroup>, Int<kHeadDim>, Int<kNumMmaWarpGroups>>{}));
  // One warpgroup's share of O = P V: the register fragment of every consumer thread has this layout too.
  using TiledMmaPVWarpGroup = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, ElementAccum,
                           Shape<Int<kRowsPerWarpGroup>, Int<kHeadDim>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>()));
  using SmemCopyO = decltype(make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, TiledMmaPVWarpGroup{}));
  using GmemTensorOut = decltype(cute::make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), ShapeRows{},
                                                   StrideRows{}));
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensorOut{}, take<0, 2>(SmemLayoutO{}),
                                      Shape<Int<kRowsPerWarpGroup>, Int<kHeadDim>>{}, _1{}));

  static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesKV = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesRab = kRabTileRows * kBlockN * sizeof(Element);

  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;
  using PipelineRab = cutlass::PipelineTmaAsync<kRabSlots>;

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, kQueryStages * cosize_v<SmemLayoutQ>, 1024> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    RabStorage<kHasRabRing, Element, SmemLayoutRab> rab;
    OStorage<kStoreOWithTma, Element, SmemLayoutO> o;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_q[kMaxQuerySlots];
    alignas(16) typename PipelineKV::SharedStorage pipeline_k;
    alignas(16) typename PipelineKV::SharedStorage pipeline_v;
    alignas(16) typename PipelineRab::SharedStorage pipeline_rab;  // HSTU with rab only
    alignas(16) TileHandoffStorage handoff;  // dynamic tile scheduling: producer -> consumers
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one sm90 CTA exceeded");
};

}  // namespace cuteattn::sm90
