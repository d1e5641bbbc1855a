// Compile-time configuration of the sm80 backward kernel: tile sizes per head-dim bucket, the three tiled
// MMAs (S/dP, dK/dV, dQ), shared-memory layouts (swizzled for 16-bit, padded rows for fp32) with their transposed
// views, and the copy atoms.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/bfloat16.h>
#include <cutlass/half.h>
#include <cutlass/numeric_types.h>

#include "cuteattn/types.h"

namespace cuteattn::detail::sm80_bwd {

using namespace cute;
using cute::make_tensor;  // not cuteattn::make_tensor and cuteattn::Tensor of the public API
using cute::Tensor;

template <DType kDType>
struct ElementOf;
// type: q, k, v, dout and the gradients in global memory; mma: what the MMAs read.
template <>
struct ElementOf<DType::kFloat16> {
  using type = cutlass::half_t;
  using mma = cutlass::half_t;
  using MmaAtom = SM80_16x8x16_F32F16F16F32_TN;
};
template <>
struct ElementOf<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
  using mma = cutlass::bfloat16_t;
  using MmaAtom = SM80_16x8x16_F32BF16BF16F32_TN;
};
template <>
struct ElementOf<DType::kFloat32> {
  using type = float;
  using mma = cutlass::tfloat32_t;  // tiles rounded to tf32 in shared memory, P and dS when they are formed
  using MmaAtom = SM80_16x8x8_F32TF32TF32F32_TN;
};

// Tile sizes of the fp32 (tf32) backward. Shared memory doubles next to the 16-bit kernels, so the tiles shrink
// until each bucket fits sm80's 163 KB: 64 x 64 up to d = 96, 64 x 32 at d = 128, 32 x 32 at d = 192, 256, all with
// 8 warps (with 4 warps the dK + dV accumulators alone take 128 registers per thread at d = 256, and it spills).
// Q/dO are double-buffered where that still fits (d = 32, 64, 192).
struct Fp32BwdTiles {
  int block_m, block_n;
};
constexpr Fp32BwdTiles fp32_bwd_tiles(int head_dim) {
  return head_dim <= 96 ? Fp32BwdTiles{64, 64} : head_dim <= 128 ? Fp32BwdTiles{64, 32} : Fp32BwdTiles{32, 32};
}

// One CTA owns a key block of kBlockN rows of K/V and walks the query blocks of kBlockM rows that see it.
// kBlockM = 64 for d > 64 keeps the fp32 dK + dV accumulators (kBlockN x kHeadDim each, spread over 256
// threads) at <= 128 registers per thread next to the S/dP tiles; kBlockN shrinks to 64 for d > 128 for the
// same reason. Softmax with d <= 64 takes 128 x 128 tiles: half the query-block steps, each with twice the
// MMA work (HSTU keeps 64-row blocks: its preloaded rab pairs would double too and spill).
template <DType kDType, int kHeadDim_, bool kHstu, int kSmemBudget = 163 * 1024>
struct BwdTraits {
  using Element = typename ElementOf<kDType>::type;
  using ElementMma = typename ElementOf<kDType>::mma;
  using ElementAccum = float;
  using MmaAtom = typename ElementOf<kDType>::MmaAtom;
  static constexpr bool kFp32 = kDType == DType::kFloat32;
  static_assert(!(kFp32 && kHstu), "HSTU runs in fp16/bf16 only");

  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kFp32 ? fp32_bwd_tiles(kHeadDim).block_m : kHeadDim <= 64 && !kHstu ? 128 : 64;
  static constexpr int kBlockN = kFp32 ? fp32_bwd_tiles(kHeadDim).block_n : kHeadDim <= 128 ? 128 : 64;
  static constexpr int kNWarps = 8;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kMmaK = kFp32 ? 8 : 16;
  // Shared memory one CTA may take: kSmemBudget (163 KB on an A100, 227 KB on sm90) for softmax fp16/bf16; HSTU
  // and tf32 keep the A100 configuration everywhere (not measured with more).
  static constexpr int kBudget = kHstu || kFp32 ? 163 * 1024 : kSmemBudget;

  // Warps along M for S/dP, along N for dK/dV, along M for dQ (the rest of the warps tile the other side).
  // d = 128, and d = 256 with sm90's shared memory, compute dQ with 2 x 4 warps of 32 x 32: each warp reads a
  // quarter of K^T instead of half with 4 x 2 (H100 bf16 d256 vs FA2: 0.84-0.88x -> 0.86-0.90x). d = 64 splits the
  // 128 x 128 S/dP tile 4 x 2 (H100 bf16 vs FA2: 0.79-0.89x -> 0.82-0.90x).
  static constexpr int kAtomMSdP = kFp32 ? kBlockM / 16 : kBlockN == 128 && !(kHeadDim == 64 && kBlockM == 128) ? 2 : 4;
  static constexpr int kAtomNdKV = kFp32 ? kBlockN / 16 : kBlockN == 128 ? 4 : 2;
  static constexpr int kAtomMdQ =
      kFp32 ? kBlockM / 16 : kHeadDim == 128 || (kHeadDim == 256 && kBudget > 163 * 1024) ? 2 : 4;
  // The S/dP tile's N extent: 16 per warp along N (two n8 MMAs, one ldmatrix.x4 of B per k-slice), or 8 when the
  // warps along N already cover kBlockN that way (fp32 32 x 32: 4 warps of 8 columns, ldmatrix.x2).
  static constexpr int kTileNSdP = 16 * (kNWarps / kAtomMSdP) <= kBlockN ? 16 * (kNWarps / kAtomMSdP) : kBlockN;
  static_assert(kTileNSdP / (kNWarps / kAtomMSdP) == 16 || kTileNSdP / (kNWarps / kAtomMSdP) == 8);
  // dQ = dS K runs over column chunks of kHeadDim / kDqChunks so its fp32 tile stays small next to dK/dV (up to
  // d = 128 one chunk: 32 floats per thread; a second pass would read dS and K^T from shared memory again).
  // d = 192 takes three chunks of 64: chunks of 96 columns do not tile the ldmatrix.trans copy of K^T (no build).
  static constexpr int kDqChunks = kHeadDim == 192 ? 3 : kHeadDim > 128 ? 2 : 1;

  using TiledMmaSdP = TiledMMA<MMA_Atom<MmaAtom>, Layout<Shape<Int<kAtomMSdP>, Int<kNWarps / kAtomMSdP>, _1>>,
                               Tile<Int<16 * kAtomMSdP>, Int<kTileNSdP>, Int<kMmaK>>>;
  using TiledMmadKV = TiledMMA<MMA_Atom<MmaAtom>, Layout<Shape<Int<kAtomNdKV>, Int<kNWarps / kAtomNdKV>, _1>>,
                               Tile<Int<16 * kAtomNdKV>, Int<16 * (kNWarps / kAtomNdKV)>, Int<kMmaK>>>;
  using TiledMmadQ = TiledMMA<MMA_Atom<MmaAtom>, Layout<Shape<Int<kAtomMdQ>, Int<kNWarps / kAtomMdQ>, _1>>,
                              Tile<Int<16 * kAtomMdQ>, Int<16 * (kNWarps / kAtomMdQ)>, Int<kMmaK>>>;

  // Rows of Q/dO/K/V tiles, 16-bit: 64-element (128-byte) swizzle atoms, 32-element ones when d is not a multiple
  // of 64. fp32: whole rows padded by 16 bytes (4 floats): ldmatrix and the 128-bit cp.async writes stay
  // conflict-free, the 32-bit reads of the transposed operands (no transposing ldmatrix for 32-bit) see at most
  // 2-way conflicts, and every address such a read takes is one base plus compile-time offsets (a swizzled
  // layout costs a register per loaded element there).
  static constexpr int kPad = kFp32 ? 4 : 0;
  static constexpr int kBlockKSmem = kFp32 ? 32 : kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzle = kBlockKSmem == 32 ? 2 : 3;
  using SmemLayoutAtomRow =
      decltype(composition(Swizzle<kSwizzle, 3, 3>{}, Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  template <int kRows>
  using SmemLayoutRows =
      std::conditional_t<kFp32, Layout<Shape<Int<kRows>, Int<kHeadDim>>, Stride<Int<kHeadDim + kPad>, _1>>,
                         decltype(tile_to_shape(SmemLayoutAtomRow{}, Shape<Int<kRows>, Int<kHeadDim>>{}))>;
  using SmemLayoutQdO = SmemLayoutRows<kBlockM>;
  using SmemLayoutKV = SmemLayoutRows<kBlockN>;
  // Transposed views for the operands read with ldmatrix.trans: Q^T, dO^T (dK, dV) and K^T (dQ).
  using SmemLayoutQdOt = decltype(composition(SmemLayoutQdO{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutQdOtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutQdOt{}));
  using SmemLayoutKt = decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutKtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutKt{}));

  // P and dS tiles (kBlockM x kBlockN), written from the S/dP accumulators and read as A of dV/dK (transposed)
  // and A of dQ.
  static constexpr int kPdSAtomCols = kFp32 ? 32 : 64;  // fp32 takes the padded layout below, not this atom
  using SmemLayoutAtomPdS =
      decltype(composition(Swizzle<3, 3, 3>{}, Layout<Shape<_8, Int<kPdSAtomCols>>, Stride<Int<kPdSAtomCols>, _1>>{}));
  using SmemLayoutPdS =
      std::conditional_t<kFp32, Layout<Shape<Int<kBlockM>, Int<kBlockN>>, Stride<Int<kBlockN + kPad>, _1>>,
                         decltype(tile_to_shape(SmemLayoutAtomPdS{}, Shape<Int<kBlockM>, Int<kBlockN>>{}))>;
  using SmemLayoutPdSt = decltype(composition(SmemLayoutPdS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutPdStNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutPdSt{}));

  static constexpr int kSizeQdO = kBlockM * (kHeadDim + kPad);
  static constexpr int kSizeKV = kBlockN * (kHeadDim + kPad);
  static constexpr int kSizePdS = kBlockM * (kBlockN + kPad);
  // Q and dO are double-buffered (the next query block loads during this one's math) when that fits kBudget:
  // everywhere but d = 256 on an A100 (with sm90's 227 KB, H100 bf16 d256 vs FA2: 0.81-0.84x -> 0.84-0.88x). Each
  // stage also holds the fp32 LSE and D of its kBlockM rows, loaded with Q and dO so the softmax never waits on
  // global memory. Behind them, kSmemScalarBytes hold the batch entry's sequence bounds and mask.
  static constexpr int kSmemScalarBytes = 160;
  static constexpr int smem_bytes(int stages) {
    return (2 * stages * kSizeQdO + 2 * kSizeKV + 2 * kSizePdS) * int(sizeof(Element)) +
           2 * stages * kBlockM * int(sizeof(float)) + kSmemScalarBytes;
  }
  static constexpr int kStages = smem_bytes(2) <= kBudget ? 2 : 1;
  // The loop runs dV, dQ, dK (the dK MMAs overlap the dQ atomics), except single-buffered (d = 256 on an A100),
  // where the reordering costs spills.
  static constexpr bool kDkAfterDq = kStages == 2;
  // With kDkAfterDq: the dK GEMM's k-slices (of kBlockM / kMmaK) over which the last dQ chunk's reductions are
  // spread (H100, softmax bf16, vs FA2: d128 0.82-0.89x -> 0.87-0.96x, d64 0.80-0.83x -> 0.84-0.88x; all at
  // slice 0 measured no faster than before the GEMM); 0 issues them all before the dK GEMM: HSTU (spreading them
  // raises its spills) and tf32 (not measured).
  static constexpr int kDqRedSteps = kHstu || kFp32 ? 0 : kBlockM / kMmaK;
  // Thread-dependent addresses rebuilt at each use from an opaque thread index instead of hoisted out of the
  // query-block loop (see the kernel's loop_tid). HSTU only: there it takes the spills to 0 (d128 72/300, d192
  // 64/224 bytes before) at unchanged speed; softmax measured 2-4% slower with it on an H100 (d64-d256).
  static constexpr bool kRebuildAddresses = kHstu;
  static constexpr int kSmemBytes = smem_bytes(kStages);

  // 128-bit cp.async global -> shared, kGmemThreadsPerRow threads per kBlockKSmem-wide row chunk.
  static constexpr int kGmemElemsPerLoad = 16 / int(sizeof(Element));
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
  using GmemLayoutAtom = Layout<Shape<Int<kNThreads / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>,
                                Stride<Int<kGmemThreadsPerRow>, _1>>;
  using GmemTiledCopy = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
                                                 GmemLayoutAtom{}, Layout<Shape<_1, Int<kGmemElemsPerLoad>>>{}));
  // The dK / dV epilogue of 16-bit tiles: the accumulators go as column pairs into two swizzled (kBlockN, kHeadDim)
  // tiles in the Q/dO stage buffers (free once the last query block is done), then to global memory in 16-byte row
  // pieces (column pairs stored straight from the accumulators wrote 4 bytes of a 32-byte sector each). fp32 keeps
  // the direct stores.
  static constexpr bool kSmemEpilogue = !kFp32 && kBlockN <= kStages * kBlockM;
  using GmemTiledCopyStore = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{},
                                                      GmemLayoutAtom{}, Layout<Shape<_1, Int<kGmemElemsPerLoad>>>{}));
  using SmemCopyAtomdKV = Copy_Atom<UniversalCopy<uint_bit_t<2 * sizeof_bits_v<Element>>>, Element>;

  // K-major operands: ldmatrix (also for tf32: one tf32 is a pair of b16). Transposed operands: ldmatrix.trans,
  // or for tf32 one 32-bit load per element.
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, ElementMma>;
  using SmemCopyAtomSdPB = std::conditional_t<kTileNSdP / (kNWarps / kAtomMSdP) == 8,
                                              Copy_Atom<SM75_U32x2_LDSM_N, ElementMma>, SmemCopyAtom>;
  using SmemCopyAtomTransposed =
      std::conditional_t<kFp32, Copy_Atom<UniversalCopy<uint32_t>, ElementMma>, Copy_Atom<SM75_U16x8_LDSM_T, Element>>;
  using SmemCopyAtomPdS = Copy_Atom<DefaultCopy, Element>;
  // Softmax d <= 64 stores P and dS by stmatrix on sm_90 (four 8 x 8 matrices per instruction): a quarter of the
  // 32-bit stores' instructions in the shared-memory queue, whose throttle was the stall that set this kernel
  // apart from FA2's at d 64 (ncu, H100: 1.17 vs 0.29 cycles per issued instruction). H100 bf16, same process,
  // against the 32-bit stores: d 64 s 1k / 4k +1% / +3%, causal +1% / +2%; d 128 neutral, d 256 -3% (not taken).
  static constexpr bool kStmatrixPdS = !kHstu && !kFp32 && kHeadDim <= 64;
  // Softmax d <= 64 on sm_90 (the kernel's kPInRegisters): P stays in registers (16-bit) across the dP GEMM and
  // goes to shared memory after it, as in FA2: the GEMM's ldmatrix loads and MMAs then interleave with the
  // exponentials (stored first, the loads waited for the stores, and the 64 exponentials of a step queued as one
  // burst: ncu, s 4k, MIO-throttle stall samples 91 K against FA2's 26 K), and dS takes P from the registers
  // instead of reading the tile back. H100 bf16 d 64, against P through shared memory, same process (two calls):
  // s 512 / 1k / 4k / 16k +2.4-2.6% / +3.4-4.0% / +4.7-5.4% / +5.4-5.7%, causal s 1k / 4k +2.5-2.9% / +3.6-5.1%.
  // With its hoisted addresses (the kernel's step_tid) it was 2-3% faster still, but spilled 44 bytes. At d 128
  // (32-bit stores, no spills) it measured -1% to +1%.
  static constexpr bool kPInRegisters = !kHstu && !kFp32 && kHeadDim <= 64;
  // P (or HSTU's dprob) back from shared memory into the dP accumulator layout: 16-bit tiles by ldmatrix, four
  // 8 x 8 matrices per instruction (element-wise 16/32-bit loads kept the shared-memory pipe 3x as busy as FA2's
  // on an H100, ncu: 27M LDS next to 75M LDSM at d64 s2k); fp32 element-wise.
  using SmemLoadAtomPdS =
      std::conditional_t<kFp32, Copy_Atom<DefaultCopy, Element>, Copy_Atom<SM75_U32x4_LDSM_N, Element>>;
};

}  // namespace cuteattn::detail::sm80_bwd
