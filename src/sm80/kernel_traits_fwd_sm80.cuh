// Compile-time configuration of the sm80 forward kernel: tile sizes per head-dim bucket (one constexpr
// function), the tiled MMA, swizzled shared-memory layouts and the copy atoms (cp.async, ldmatrix).
#pragma once

#include <cute/tensor.hpp>

#include <cutlass/numeric_types.h>

namespace cuteattn::sm80 {

using namespace cute;
using cute::make_tensor;  // not cuteattn::make_tensor / cuteattn::Tensor (public API names)
using cute::Tensor;

struct FwdTileConfig {
  int block_m;
  int block_n;
  int warps;
};

// Tile sizes per head-dim bucket and score function. Each warp owns 16 query rows per MMA row step; the
// register budget (255 per thread) is what limits the tile: a thread holds block_m * block_n / threads
// fp32 scores, block_m * d / threads fp32 outputs, and two k-slices of the ldmatrix operand fragments.
//  - softmax, d <= 128: 128 x 64, 4 warps (the FlashAttention-2 choice for d = 128 on A100/H100): 64 score
//    + 32..128 output registers per thread. 128 x 128 spills at d = 64 next to the fragments of two
//    k-slices; 8 warps cost ~25% in barriers and shared-memory traffic.
//  - softmax, d = 192, 256: 128 x 64 with 8 warps: 4 warps would need 192..256 output registers per
//    thread; 8 warps keep 16 rows each, and 128 KiB of shared memory (Q 64K, K 32K, V 32K at d = 256)
//    fits sm80's 163 KiB and sm90's 227 KiB per block.
//  - HSTU: the rab tile is a third (ROWS x COLS) register array next to S and O, so the query block is
//    halved: 64 x 64, 4 warps (and 8 warps from d = 192 on, for the output registers).
constexpr FwdTileConfig fwd_tile_config(int head_dim, bool hstu) {
  if (hstu) return head_dim <= 128 ? FwdTileConfig{64, 64, 4} : FwdTileConfig{128, 64, 8};
  if (head_dim <= 128) return {128, 64, 4};
  return {128, 64, 8};
}

template <class Element_, int kHeadDim_, bool kHstu_>
struct ForwardTraits {
  using Element = Element_;
  using ElementAccum = float;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kHstu = kHstu_;
  static constexpr FwdTileConfig kConfig = fwd_tile_config(kHeadDim, kHstu);
  static constexpr int kBlockM = kConfig.block_m;
  static constexpr int kBlockN = kConfig.block_n;
  static constexpr int kNWarps = kConfig.warps;
  static constexpr int kNThreads = kNWarps * 32;
  static_assert(kHeadDim % 32 == 0, "head-dim buckets are multiples of 32");
  static_assert(kBlockM == 16 * kNWarps || kBlockM == 32 * kNWarps, "each warp owns 16 or 32 rows");

  using MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>, SM80_16x8x16_F32F16F16F32_TN,
                                     SM80_16x8x16_F32BF16BF16F32_TN>;
  // Warps tile M; the permutation makes the N extent 16 so ldmatrix.x4 fills two n8 MMAs of B at once.
  using TiledMma = TiledMMA<MMA_Atom<MmaAtom>, Layout<Shape<Int<kNWarps>, _1, _1>>, Tile<Int<16 * kNWarps>, _16, _16>>;

  // Shared layouts: rows of 64 (or 32) elements, XOR-swizzled in 16-byte chunks so that both the 128-bit
  // cp.async writes (8 threads cover one 128-byte row) and the ldmatrix reads (8 rows of one 16-byte
  // column) hit 8 distinct bank groups.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kBlockKSmem == 64 ? 3 : 2;
  using SmemLayoutAtom =
      decltype(composition(Swizzle<kSwizzleBits, 3, 3>{}, Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V seen as V^T (kHeadDim, kBlockN) over the same bytes, read with ldmatrix.trans for the B operand of P V.
  using SmemLayoutVt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutO = SmemLayoutQ;

  static constexpr int kSmemQBytes = int(cosize(SmemLayoutQ{})) * int(sizeof(Element));
  static constexpr int kSmemKVBytes = int(cosize(SmemLayoutKV{})) * int(sizeof(Element));
  static constexpr int kSmemBytes = kSmemQBytes + 2 * kSmemKVBytes;

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomO = Copy_Atom<UniversalCopy<uint32_t>, Element>;  // 2 adjacent accumulator values

  // Global <-> shared: every thread moves 8 contiguous elements (128 bits) per copy.
  static constexpr int kGmemElemsPerLoad = 16 / int(sizeof(Element));
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
  static_assert(kNThreads % kGmemThreadsPerRow == 0);
  using GmemThreadLayout = Layout<Shape<Int<kNThreads / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>,
                                  Stride<Int<kGmemThreadsPerRow>, _1>>;
  using GmemValLayout = Layout<Shape<_1, Int<kGmemElemsPerLoad>>>;
  using GmemTiledCopyQKV = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, Element>{},
                                                    GmemThreadLayout{}, GmemValLayout{}));
  using GmemTiledCopyO =
      decltype(make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, Element>{}, GmemThreadLayout{}, GmemValLayout{}));
  static_assert(kBlockM % (kNThreads / kGmemThreadsPerRow) == 0);
  static_assert(kBlockN % (kNThreads / kGmemThreadsPerRow) == 0);
};

}  // namespace cuteattn::sm80
