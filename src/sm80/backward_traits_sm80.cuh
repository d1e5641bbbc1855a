// Compile-time configuration of the sm80 backward kernel: tile sizes per head-dim bucket, the three tiled
// MMAs (S/dP, dK/dV, dQ), swizzled shared-memory layouts with their transposed views, and the copy atoms.
#pragma once

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
template <>
struct ElementOf<DType::kFloat16> {
  using type = cutlass::half_t;
  using MmaAtom = SM80_16x8x16_F32F16F16F32_TN;
};
template <>
struct ElementOf<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
  using MmaAtom = SM80_16x8x16_F32BF16BF16F32_TN;
};

// One CTA owns a key block of kBlockN rows of K/V and walks the query blocks of kBlockM rows that see it.
// kBlockM = 64 for d > 64 keeps the fp32 dK + dV accumulators (kBlockN x kHeadDim each, spread over 256
// threads) at <= 128 registers per thread next to the S/dP tiles; kBlockN shrinks to 64 for d > 128 for the
// same reason. Softmax with d <= 64 takes 128 x 128 tiles: half the query-block steps, each with twice the
// MMA work (HSTU keeps 64-row blocks: its preloaded rab pairs would double too and spill).
template <DType kDType, int kHeadDim_, bool kHstu>
struct BwdTraits {
  using Element = typename ElementOf<kDType>::type;
  using ElementAccum = float;
  using MmaAtom = typename ElementOf<kDType>::MmaAtom;

  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kHeadDim <= 64 && !kHstu ? 128 : 64;
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : 64;
  static constexpr int kNWarps = 8;
  static constexpr int kNThreads = kNWarps * 32;

  // Warps along M for S/dP, along N for dK/dV, along M for dQ (the rest of the 8 warps tile the other side).
  static constexpr int kAtomMSdP = kBlockN == 128 ? 2 : 4;
  static constexpr int kAtomNdKV = kBlockN == 128 ? 4 : 2;
  static constexpr int kAtomMdQ = 4;
  // dQ = dS K runs over column chunks of kHeadDim / kDqChunks so its fp32 tile stays small next to dK/dV.
  // d = 192 takes three chunks of 64: chunks of 96 columns do not tile the ldmatrix.trans copy of K^T (no build).
  static constexpr int kDqChunks = kHeadDim == 192 ? 3 : kHeadDim >= 128 ? 2 : 1;

  using TiledMmaSdP = TiledMMA<MMA_Atom<MmaAtom>, Layout<Shape<Int<kAtomMSdP>, Int<kNWarps / kAtomMSdP>, _1>>,
                               Tile<Int<16 * kAtomMSdP>, Int<16 * (kNWarps / kAtomMSdP)>, _16>>;
  using TiledMmadKV = TiledMMA<MMA_Atom<MmaAtom>, Layout<Shape<Int<kAtomNdKV>, Int<kNWarps / kAtomNdKV>, _1>>,
                               Tile<Int<16 * kAtomNdKV>, Int<16 * (kNWarps / kAtomNdKV)>, _16>>;
  using TiledMmadQ = TiledMMA<MMA_Atom<MmaAtom>, Layout<Shape<Int<kAtomMdQ>, Int<kNWarps / kAtomMdQ>, _1>>,
                              Tile<Int<16 * kAtomMdQ>, Int<16 * (kNWarps / kAtomMdQ)>, _16>>;

  // Rows of Q/dO/K/V tiles: 64-element (128-byte) swizzle atoms, 32-element ones when d is not a multiple of 64.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzle = kBlockKSmem == 32 ? 2 : 3;
  using SmemLayoutAtomRow =
      decltype(composition(Swizzle<kSwizzle, 3, 3>{}, Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  using SmemLayoutQdO = decltype(tile_to_shape(SmemLayoutAtomRow{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtomRow{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // Transposed views for the operands read with ldmatrix.trans: Q^T, dO^T (dK, dV) and K^T (dQ).
  using SmemLayoutQdOt = decltype(composition(SmemLayoutQdO{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutQdOtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutQdOt{}));
  using SmemLayoutKt = decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutKtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutKt{}));

  // P and dS tiles (kBlockM x kBlockN), written from the S/dP accumulators and read as A of dV/dK (transposed)
  // and A of dQ.
  using SmemLayoutAtomPdS = decltype(composition(Swizzle<3, 3, 3>{}, Layout<Shape<_8, _64>, Stride<_64, _1>>{}));
  using SmemLayoutPdS = decltype(tile_to_shape(SmemLayoutAtomPdS{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  using SmemLayoutPdSt = decltype(composition(SmemLayoutPdS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutPdStNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutPdSt{}));

  static constexpr int kSizeQdO = kBlockM * kHeadDim;
  static constexpr int kSizeKV = kBlockN * kHeadDim;
  static constexpr int kSizePdS = kBlockM * kBlockN;
  // Q and dO are double-buffered (the next query block loads during this one's math) when it fits the
  // 163 KB an A100 gives one CTA; d = 256 runs single-buffered (double-buffered, measured no faster on an
  // H100). Each stage also holds the fp32 LSE and D of its kBlockM rows, loaded with Q and dO so the softmax
  // never waits on global memory.
  static constexpr int smem_bytes(int stages) {
    return (2 * stages * kSizeQdO + 2 * kSizeKV + 2 * kSizePdS) * int(sizeof(Element)) +
           2 * stages * kBlockM * int(sizeof(float));
  }
  static constexpr int kStages = smem_bytes(2) <= 163 * 1024 ? 2 : 1;
  static constexpr int kSmemBytes = smem_bytes(kStages);

  // 128-bit cp.async global -> shared, kGmemThreadsPerRow threads per kBlockKSmem-wide row chunk.
  static constexpr int kGmemElemsPerLoad = 8;
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
  using GmemLayoutAtom = Layout<Shape<Int<kNThreads / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>,
                                Stride<Int<kGmemThreadsPerRow>, _1>>;
  using GmemTiledCopy = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
                                                 GmemLayoutAtom{}, Layout<Shape<_1, Int<kGmemElemsPerLoad>>>{}));

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomPdS = Copy_Atom<DefaultCopy, Element>;
};

}  // namespace cuteattn::detail::sm80_bwd
