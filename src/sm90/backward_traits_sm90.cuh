// Compile-time shape of the sm90 backward kernel for one (element type, head dim): tile sizes, thread roles,
// shared-memory layouts, TMA copy types and the five warpgroup MMAs of one (query block, key block) step
//   S = Q K^T, dP = dO V^T          (kBlockM query rows x kBlockN keys; softmax d <= 128: warpgroup w takes the
//                                    w-th half of the keys of both; d 256: warpgroup 0 computes S, warpgroup 1 dP,
//                                    whole; HSTU (kSwapSdP): S^T = K Q^T and dP^T = V dO^T, keys as M, warpgroup
//                                    w the w-th half of the keys)
//   dV += P^T dO, dK += dS^T Q      (kBlockN keys x d; d <= 128: warpgroup w takes the same keys as in S; HSTU:
//                                    P^T and dS^T from the registers; d 256 (kSplitCols): all 64 keys, columns
//                                    [128 w, 128 w + 128))
//   dQ = dS K                       (kBlockM query rows x d; warpgroup w takes columns [w d / 2, (w + 1) d / 2);
//                                    kdQTurns: the warpgroups take turns, one computes all of a step's dQ, a
//                                    column half after the other, while the other goes on to the next step)
// from shared memory but for HSTU's P^T and dS^T: P and dS go there as 16-bit tiles (HSTU: dS alone, transposed
// by stmatrix). dS has two buffers, so one step's writes never meet the other warpgroup's reads (dQ) of the step
// before; softmax at d <= 128 P is read only by the warpgroup that wrote it (dV of its own keys), so one buffer
// serves where shared memory is short; at d 256 both warpgroups read all of P, which is double-buffered like dS;
// warpgroup 1 reads P back (ldmatrix) to form dS. dQ leaves through an fp32
// staging tile in two column halves (written by warpgroup w, or by turns both by the warpgroup whose turn it is;
// a writer warp per half, in the producer warpgroup, issues its reduce-add, waits until TMA has read the half and
// hands it back), at d 256 by fp32 vector reductions straight from the registers (no room for a staging tile).
// HSTU adds no shared memory: the rab tile of a step arrives by TMA, with its Q and dO, in the dS buffer the step
// writes later (its consumers read rab^T from there first, by ldmatrix.trans), and dRab of one rab head per query
// head leaves that buffer by a TMA store once dS is in it.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuteattn/types.h"
#include "sm90/kernel_traits_sm90.cuh"

namespace cuteattn::sm90 {

using namespace cute;

// The named barriers of the backward kernel (ids above CUTLASS's reserved ones, like FwdBarrier's).
enum class BwdBarrier : uint32_t {
  kPdSWritten = 0,   // both consumer warpgroups: this step's P and dS tiles are in shared memory
  kWarpGroup0 = 1,   // consumer warpgroup 0 alone: its P columns are in shared memory
  kWarpGroup1 = 2,   // the same for warpgroup 1
  kPWritten = 3,     // both consumer warpgroups (d 256): this step's P tile is in shared memory
  kdQEmpty0 = 4,     // dQ writer warp 0 (arrive) -> consumer warpgroup 0, by turns the one whose turn it is
                     // (sync): dQ staging half 0 is free
  kdQEmpty1 = 5,     // the same for writer warp 1, half 1 and warpgroup 1
  kdQFull0 = 6,      // consumer warpgroup 0, by turns the one whose turn it is (arrive) -> dQ writer warp 0
                     // (sync): half 0 holds the step's dQ
  kdQFull1 = 7,      // the same for half 1
};

// The column order of the dQ staging tile and, since the TMA reduce-add copies the tile as it lies, of the fp32
// dQ workspace: in each group of 32 columns, logical column 8 j + 4 k + c (c < 4, k < 2, j < 4) sits at column
// 4 j + 16 k + c. A consumer thread stores two adjacent columns of rows r and r + 8 of each 8-column group j;
// in logical order the 128-byte swizzle put rows r and r + 1 of a half-warp's 8-byte stores on the same two
// 16-byte chunks (two-way bank conflicts: 34 M of the d 128 s 4k backward's 112 M shared-store wavefronts,
// ncu); in this order the half-warp's four rows cover all 32 banks. convert_dq_tiles_kernel
// (sm90/dq_tiles_sm90.cuh) reads the columns back through `physical`.
struct dQWorkspaceColumns {
  CUTE_HOST_DEVICE static constexpr int physical(int c) {
    return c / 32 * 32 + c % 32 / 8 * 4 + c % 8 / 4 * 16 + c % 4;
  }
  // The same map as a CuTe layout of a (rows, cols) tile into the (rows, cols) tile it is composed with.
  template <int kRows, int kCols>
  using Layout = cute::Layout<cute::Shape<cute::Int<kRows>, cute::Shape<cute::_4, cute::_2, cute::_4, cute::Int<kCols / 32>>>,
                              cute::Stride<cute::_1, cute::Stride<cute::Int<kRows>, cute::Int<16 * kRows>,
                                                                  cute::Int<4 * kRows>, cute::Int<32 * kRows>>>>;
  template <int kRows, int kCols>
  static constexpr bool agrees() {
    for (int c = 0; c < kCols; ++c)
      if (Layout<kRows, kCols>{}(0, c) != kRows * physical(c)) return false;
    return true;
  }
};

// The fp32 dQ staging tile of the kernels that reduce dQ by TMA; the d 256 kernel has none.
template <bool kStaged, class ElementAccum, int kElems>
struct BackwarddQStaging {};
template <class ElementAccum, int kElems>
struct BackwarddQStaging<true, ElementAccum, kElems> {
  alignas(1024) cute::array_aligned<ElementAccum, kElems, 1024> dq;
};

// The 16-bit P tile(s) of the kernels that take P^T from shared memory; HSTU (kSwapSdP) keeps P in registers.
template <bool kStored, class Element, int kElems>
struct BackwardPTile {};
template <class Element, int kElems>
struct BackwardPTile<true, Element, kElems> {
  alignas(1024) cute::array_aligned<Element, kElems, 1024> p;
};

// Softmax: the row statistics of the step in each Q/dO stage, (LSE in log2 units, D) per query row (+inf, 0 for
// rows past the sequence or that see no key, so their P and dS are 0). The producer warp writes them with the
// stage's Q and dO, and the consumers read them from there instead of loading and shuffling them per step.
template <bool kSoftmax, int kStages, int kBlockM>
struct BackwardRowStats {};
template <int kStages, int kBlockM>
struct BackwardRowStats<true, kStages, kBlockM> {
  alignas(16) float2 lse2_dsum[kStages][kBlockM];
};

// The query-step height per (score, head dim): 128 rows for softmax at d 64 halve the fixed costs of a step
// (barriers, LSE/D loads, stmatrix, the dQ reduce-add, pipeline waits) per FLOP; 64 rows at d 128, where the dK
// and dV accumulators leave no registers for taller S and dP tiles, and for HSTU at d 64 (its sigmoid tile next
// to P spills with 128 rows).
// Shared memory, kBlockN = 128, two Q/dO stages, 16-bit unless noted:
//   softmax d 64, kBlockM 128: 2 x (Q + dO) 64 KB + K + V 32 KB + P (one buffer) 32 KB + dS (two) 64 KB
//                              + dQ fp32 32 KB = 224 KB
//   HSTU d 64, kBlockM 64:     2 x (Q + dO) 32 KB + K + V 32 KB + dS (two) 32 KB + dQ fp32 16 KB = 112 KB
//   softmax d 128, kBlockM 64: 2 x (Q + dO) 64 KB + K + V 64 KB + 2 x (P + dS) 64 KB + dQ fp32 32 KB = 224 KB
//   HSTU d 128, kBlockM 64:    2 x (Q + dO) 64 KB + K + V 64 KB + dS (two) 32 KB + dQ fp32 32 KB = 192 KB
//   d 256, kBlockM 64, kBlockN 64: 2 x (Q + dO) 128 KB + K + V 64 KB + 2 x (P + dS) 32 KB = 224 KB
// and softmax the row statistics, 2 x kBlockM x 8 bytes (2 KB at d 64, 1 KB at d 128 and 256).
// Registers per consumer thread: dK and dV (64 x d / 128 fp32 each), S and dP (kBlockM kBlockN / 256 fp32
// each), dQ (kBlockM d / 256); at d 256 dK and dV 64 each, one 64 x 64 tile (S or dP) 32, dQ 64.
template <DType kDType, int kHeadDim_, bool kHstu_>
struct BackwardTraitsSm90 {
  using Element = ElementOf<kDType>;
  using ElementAccum = float;
  static constexpr bool kHstu = kHstu_;

  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || (kHeadDim == 256 && !kHstu),
                "sm90 backward: head dims 64 and 128, softmax 256");
  // d 256: 64 keys x 256 columns of dK and dV for one warpgroup would take 256 registers per thread; the
  // warpgroups split them by columns instead (64 keys x 128 columns each).
  static constexpr bool kSplitCols = kHeadDim > 128;
  static constexpr bool kdQAtomic = kSplitCols;  // dQ by reductions from registers, no staging tile
  static constexpr int kBlockM = kHeadDim == 64 && !kHstu ? 128 : 64;
  static constexpr int kBlockN = kSplitCols ? 64 : 128;
  // HSTU: S^T = K Q^T and dP^T = V dO^T (keys as M), so that P^T and dS^T are accumulators, which are the A operand
  // of dV += P^T dO and dK += dS^T Q straight from the registers (RS wgmma, as P in the forward's P V): P never
  // goes to shared memory, dV and dK read only dO and Q there, and dV starts with no barrier. dS still goes there,
  // transposed by stmatrix, for dQ = dS K of both warpgroups. H100 bf16 d 128 causal h 4, same process, against P
  // through shared memory: dense 2k / 4k / 16k +0-4% / +4-5% / +3-6%, jagged max 4k / 8k +3-7%; ncu (dense 4k):
  // tensor pipe active 50% -> 54%, shared-memory wavefronts -13%.
  static constexpr bool kSwapSdP = kHstu;
  // Softmax d 128: the steps of a key block may start at its diagonal query block (HeadsStepWalk), so that its dQ
  // tiles are tracked without a right-bounded mask too (sm90/dq_tiles_sm90.cuh): H100 bf16 non-causal, same
  // process, s 512 / 1k / 2k-16k +5% / +3% / +0-1%. At d 64 (128-row steps) the same measured +7% at s 512 but
  // -1% to -2% from s 1k on: it keeps the zero-fill there.
  static constexpr bool kRotatedSteps = !kHstu && kHeadDim == 128;
  static constexpr int kStages = 2;
  static constexpr int kPBuffers = kSwapSdP ? 0 : kBlockM == 128 ? 1 : 2;
  static_assert(!kSplitCols || kPBuffers == 2, "P read by both warpgroups needs two buffers");
  static constexpr int kNumMmaWarpGroups = 2;
  static constexpr int kNumMmaThreads = kNumMmaWarpGroups * 128;
  // Warpgroup 0: the TMA producer warp and (dQ through the staging tile) one dQ writer warp per staging half,
  // which issues the reduce-add of that half and frees it again.
  static constexpr int kNumThreads = kNumMmaThreads + 128;
  static constexpr int kdQWriterThreads = 128 + 32;  // a consumer warpgroup and a dQ writer warp
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;

  using AtomSplitN = Layout<Shape<_1, Int<kNumMmaWarpGroups>, _1>>;  // warpgroups split N
  using AtomSplitM = Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>;  // warpgroups split M
  // d 256: one whole (kBlockM, kBlockN) GEMM per warpgroup (S or dP), N = 64 instead of two N = 32 halves of
  // each: every warpgroup reads one of Q and dO instead of both (shared-memory bandwidth bounds N = 32).
  // The N of one warpgroup's S and dP GEMMs: keys (kSwapSdP: query rows).
  static constexpr int kSdPCols = kSwapSdP ? kBlockM : kSplitCols ? kBlockN : kBlockN / kNumMmaWarpGroups;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum, Shape<_64, Int<kSdPCols>, Int<kHeadDim>>>(),
      std::conditional_t<kSplitCols, Layout<Shape<_1, _1, _1>>, std::conditional_t<kSwapSdP, AtomSplitM, AtomSplitN>>{}));
  static constexpr int kdKVCols = kSplitCols ? kHeadDim / kNumMmaWarpGroups : kHeadDim;
  using MmadKVAtom = std::conditional_t<
      kSwapSdP,
      decltype(GMMA::rs_op_selector<Element, Element, ElementAccum, Shape<_64, Int<kdKVCols>, Int<kBlockM>>,
                                    GMMA::Major::K, GMMA::Major::MN>()),
      decltype(GMMA::ss_op_selector<Element, Element, ElementAccum, Shape<_64, Int<kdKVCols>, Int<kBlockM>>,
                                    GMMA::Major::MN, GMMA::Major::MN>())>;
  using TiledMmadKV = decltype(make_tiled_mma(MmadKVAtom{}, std::conditional_t<kSplitCols, AtomSplitN, AtomSplitM>{}));
  // dQ by turns: the warpgroups alternate by step, the one whose turn it is computes both column halves (one
  // after the other: both at once left too few registers) while the other goes on to the next step's S and dP.
  // Softmax at d 64 only: there it gained 4-6% (H100, ratio to cuDNN in the same process, s 1k-16k); at d 128
  // the serial halves cost more than the overlap gained (-3 to -4%, softmax and HSTU; HSTU spilled as well).
  static constexpr bool kdQTurns = !kdQAtomic && !kHstu && kHeadDim == 64;
  // dQ columns [w d / 2, (w + 1) d / 2) by warpgroup w; by turns one column half of one warpgroup.
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum,
                           Shape<_64, Int<kHeadDim / kNumMmaWarpGroups>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      std::conditional_t<kdQTurns, Layout<Shape<_1, _1, _1>>, AtomSplitN>{}));
  static_assert(decltype(size<1>(typename TiledMmaSdP::AtomShape_MNK{}))::value == kSdPCols &&
                    decltype(size<1>(typename TiledMmadKV::AtomShape_MNK{}))::value == kdKVCols &&
                    decltype(size<1>(typename TiledMmadQ::AtomShape_MNK{}))::value == kHeadDim / kNumMmaWarpGroups,
                "wgmma N narrower than the tile");

  using SmemAtomQ = SmemAtomKMajor<Element, kHeadDim>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutdO = SmemLayoutQ;
  // Q^T and dO^T (d, rows, stage): the same bytes, MN-major B operands of dK and dV.
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutV = SmemLayoutK;
  // K^T (d, keys): the B operand of dQ = dS K.
  using SmemLayoutKt =
      decltype(composition(SmemLayoutK{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // P and dS (rows, keys, buffer), keys contiguous: dS is the K-major A operand of dQ; P^T and dS^T (keys, rows,
  // buffer) the MN-major A operands of dV and dK.
  using SmemAtomPdS = SmemAtomKMajor<Element, kBlockN>;
  using SmemLayoutP =
      decltype(tile_to_shape(SmemAtomPdS{}, Shape<Int<kBlockM>, Int<kBlockN>, Int<cute::max(kPBuffers, 1)>>{}));
  using SmemLayoutPt = decltype(composition(
      SmemLayoutP{},
      make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, Int<cute::max(kPBuffers, 1)>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutdS = decltype(tile_to_shape(SmemAtomPdS{}, Shape<Int<kBlockM>, Int<kBlockN>, _2>{}));
  using SmemLayoutdSt = decltype(composition(
      SmemLayoutdS{}, make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));
  // Register -> shared stores of P and dS: stmatrix of 8x8 16-bit matrices, four per instruction; kSwapSdP: dS^T
  // accumulators into the (rows, keys) tile, each matrix transposed (into the tile's (keys, rows) view).
  using SmemCopyPdS = decltype(make_tiled_copy_C(
      Copy_Atom<std::conditional_t<kSwapSdP, SM90_U16x8_STSM_T, SM90_U32x4_STSM_N>, Element>{}, TiledMmaSdP{}));
  // kSwapSdP: the step's rab tile (rows, keys) into the S^T accumulator layout, ldmatrix.trans (the mirror).
  using SmemLoadRabT = decltype(make_tiled_copy_C(Copy_Atom<SM75_U16x8_LDSM_T, Element>{}, TiledMmaSdP{}));
  // d 256: P back from shared memory into warpgroup 1's dP fragment layout (ldmatrix, the mirror of stmatrix).
  using SmemLoadP = decltype(make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, TiledMmaSdP{}));

  // The dK / dV epilogue: each accumulator as 16-bit values by stmatrix into a (kBlockN, kHeadDim) tile laid out
  // like K (in a Q / dO ring, free by then), then to global memory by all consumer threads in 16-byte row pieces.
  using SmemLayoutdKV = SmemLayoutK;
  using SmemCopydKV = decltype(make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, TiledMmadKV{}));
  static constexpr int kdKVChunksPerRow = kHeadDim * int(sizeof(Element)) / 16;
  using GmemCopydKV = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{},
      Layout<Shape<Int<kNumMmaThreads / kdKVChunksPerRow>, Int<kdKVChunksPerRow>>, Stride<Int<kdKVChunksPerRow>, _1>>{},
      Layout<Shape<_1, Int<16 / int(sizeof(Element))>>>{}));

  // The dQ staging tile: (rows, columns of a half, half), 128-byte swizzled fp32, its columns in
  // dQWorkspaceColumns order; TMA adds each half into the fp32 dQ workspace.
  static constexpr int kdQCols = kHeadDim / kNumMmaWarpGroups;
  using SmemLayoutdQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<ElementAccum>{},
                                              Shape<Int<kBlockM>, Int<kdQCols>, Int<kNumMmaWarpGroups>>{}));
  using dQStagingColumns = dQWorkspaceColumns::Layout<kBlockM, kdQCols>;
  static_assert(kdQAtomic || (kdQCols % 32 == 0 && dQWorkspaceColumns::agrees<kBlockM, kdQCols>()),
                "dQ staging column order: the layout and the convert kernel's map disagree");
  // One warpgroup's share of dQ = dS K: the register fragment of every consumer thread has this layout too.
  using TiledMmadQWarpGroup = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum, Shape<_64, Int<kdQCols>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>()));

  // Global views handed to TMA: (rows, d, heads, batch) with 64-bit strides; varlen uses rows = total, batch 1.
  using ShapeRows = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideRows = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensor =
      decltype(cute::make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeRows{}, StrideRows{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{},
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  // HSTU: rab and dRab as (key position rows, key position cols, h_rab, b), one (kBlockM, kBlockN) tile of the
  // dS buffer layout per step.
  using TmaRab = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutdS{}),
                                        Shape<Int<kBlockM>, Int<kBlockN>>{}, _1{}));
  using GmemTensorOut =
      decltype(cute::make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), ShapeRows{}, StrideRows{}));
  using TmadRab = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensorOut{}, take<0, 2>(SmemLayoutdS{}),
                                         Shape<Int<kBlockM>, Int<kBlockN>>{}, _1{}));

  // The fp32 dQ workspace as (total_q, kHeadDim, h).
  using ShapedQ = Shape<int32_t, int32_t, int32_t>;
  using GmemTensordQ = decltype(cute::make_tensor(make_gmem_ptr(static_cast<ElementAccum*>(nullptr)), ShapedQ{},
                                                  Stride<int64_t, _1, int64_t>{}));
  using TmadQ = decltype(make_tma_copy(SM90_TMA_REDUCE_ADD{}, GmemTensordQ{}, take<0, 2>(SmemLayoutdQ{}),
                                       Shape<Int<kBlockM>, Int<kdQCols>>{}, _1{}));
  using TmadQStore = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensordQ{}, take<0, 2>(SmemLayoutdQ{}),
                                            Shape<Int<kBlockM>, Int<kdQCols>>{}, _1{}));

  static constexpr uint32_t kTmaBytesQdO = 2 * kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesKV = 2 * kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesRab = kBlockM * kBlockN * sizeof(Element);

  using PipelineQdO = cutlass::PipelineTmaAsync<kStages>;

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutdO>, 1024> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    BackwardPTile<(kPBuffers > 0), Element, cosize_v<SmemLayoutP>> ptile;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutdS>, 1024> ds;
    BackwarddQStaging<!kdQAtomic, ElementAccum, cosize_v<SmemLayoutdQ>> staging;
    BackwardRowStats<!kHstu, kStages, kBlockM> row_stats;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_kv;
    alignas(16) typename PipelineQdO::SharedStorage pipeline_qdo;
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one sm90 CTA exceeded");
};

}  // namespace cuteattn::sm90
