// Compile-time configuration of the sm80 forward kernel: tile sizes per head-dim bucket (one constexpr
// function), the tiled MMA, shared-memory layouts (swizzled for 16-bit, padded rows for fp32) and the copy atoms
// (cp.async, ldmatrix, 32-bit loads of the tf32 V^T).
#pragma once

#include <type_traits>

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
//    + 32..128 output registers per thread. 128 x 128 with 4 warps spills at d = 64 next to the fragments
//    of two k-slices; at d = 64, 128 x 128 with 8 warps and 64 x 128 with 4 warps fit but measured 12-17%
//    slower on an H100 (bf16, s 1k-16k, same run). More, smaller tiles per SM lose as well (H100 bf16, same
//    run, s 512-16k): 64 x 64 capped at 168 registers (three per SM) is 5-17% slower at d = 64 and 10-25% at
//    d = 128, capped at 128 with the lean flags (four per SM) 7-19% at d = 64; only s 512 causal gains (+3%
//    at d = 64, even at d = 128).
//  - softmax, d = 192: 64 x 64 with 4 warps of 16 rows (FlashAttention-2's tile there), two tiles per SM that
//    hide each other's prologue and epilogue: H200 bf16, same run, against 128 x 64 with 8 warps (one tile per
//    SM; both with the three lean flags below), s 512 / 2k +7 / +3%, causal +11 / +7%; without the lean flags
//    (255 registers, no spill) a further 6-7%.
//  - softmax, d = 256: 128 x 64 with 8 warps of 16 rows; 128 KiB of shared memory (Q 64K, K 32K, V 32K) fits
//    sm80's 163 KiB and sm90's 227 KiB per block. Short masked rows (Sm80Forward::short_masked_rows) take
//    64 x 64 with 4 warps (96 KiB, two tiles per SM), whose diagonal blocks mask half the rows: H200 bf16, same
//    run, causal s 512 / 1k +5 / +3%, s 2k and non-causal s 512 even; non-causal s 2k-16k and causal s 4k-16k
//    2-8% slower, where the address rebuilds its registers need cost more than the second tile gains.
//  - HSTU: the rab tile is a third (ROWS x COLS) register array next to S and O, so the query block is
//    halved: 64 x 64, 4 warps (and 8 warps from d = 192 on, for the output registers).
//  - fp32 (tf32 MMAs): shared memory doubles, so the tiles shrink: 64 x 64 for d <= 128 (75 KB at d = 96,
//    so sm86/89's 99 KB fit up to there; 99 KB + the static mask spans at d = 128), 64 x 32 for d = 192, 256
//    (96 / 128 KB, sm80's 163 KB), 4 warps (at most 128 O + 16 S registers per thread). 128 x 64 spilled at
//    d = 64: the k8 slices of the tf32 MMAs double the operand loads in flight.
constexpr FwdTileConfig fwd_tile_config(int head_dim, bool hstu, bool fp32, bool short_rows) {
  if (fp32) return head_dim <= 128 ? FwdTileConfig{64, 64, 4} : FwdTileConfig{64, 32, 4};
  if (hstu) return head_dim <= 128 ? FwdTileConfig{64, 64, 4} : FwdTileConfig{128, 64, 8};
  if (head_dim <= 128) return {128, 64, 4};
  if (head_dim == 192 || short_rows) return {64, 64, 4};
  return {128, 64, 8};
}

// The buckets with a second tile for short masked rows (Sm80Forward::short_masked_rows): 16-bit softmax d 256.
constexpr bool has_short_rows_tile(int head_dim, bool hstu, bool fp32) { return !hstu && !fp32 && head_dim == 256; }

// Element: the dtype of q, k, v and out in global memory (half, bfloat16 or float); ElementMma: what the MMAs
// read (tfloat32 for float inputs: tiles are rounded to tf32 in shared memory, P when it is formed).
// kShortRows: the 64 x 64 tile of the 16-bit softmax d 256 bucket for short masked rows.
template <class Element_, int kHeadDim_, bool kHstu_, bool kShortRows_ = false>
struct ForwardTraits {
  using Element = Element_;
  using ElementAccum = float;
  static constexpr bool kFp32 = std::is_same_v<Element, float>;
  using ElementMma = std::conditional_t<kFp32, cutlass::tfloat32_t, Element>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kHstu = kHstu_;
  static_assert(!(kFp32 && kHstu), "HSTU runs in fp16/bf16 only");
  static constexpr bool kShortRows = kShortRows_;
  static_assert(!kShortRows || has_short_rows_tile(kHeadDim, kHstu, kFp32), "short rows: 16-bit softmax d 256 only");
  static constexpr FwdTileConfig kConfig = fwd_tile_config(kHeadDim, kHstu, kFp32, kShortRows);
  // Register-lean key loop, in three independent parts: the thread-dependent global addresses of the K/V
  // copies (kRebuildGmemAddresses) and the shared addresses of the ldmatrix operands and score coordinates
  // (kRebuildSmemAddresses) are rebuilt in every key step from an opaque thread index instead of being hoisted
  // out of the loop, and the softmax partial row sums live in shared memory (kRowSumsInSmem). They keep
  // softmax d = 128 (and the HSTU and tf32 tiles) from spilling, but cost issue slots and latency in every
  // step, so each is on only where the registers need it: softmax 16-bit d <= 64 and d = 192 (64-row tile)
  // need none of them (0 spills; d = 64 runs 6-13% faster than with all three on an H100, d = 192 6-7% on an
  // H200), d = 256 only the shared addresses (hoisted global addresses and register row sums: 8-11% faster;
  // hoisting the shared addresses as well spills at sm_80 and sm_90a), and its short-rows tile the global
  // addresses as well (each of 128 threads copies 16 chunks of a 64 x 256 K or V block; hoisted, they spill 12
  // bytes at sm_90a).
  static constexpr bool kLeanDefault = kHstu || kFp32 || (kHeadDim > 64 && kHeadDim < 192);
  static constexpr bool kRebuildGmemAddresses = kLeanDefault || kShortRows;
  static constexpr bool kRebuildSmemAddresses = kLeanDefault || kHeadDim == 256;
  static constexpr bool kRowSumsInSmem = kLeanDefault;
  static constexpr int kBlockM = kConfig.block_m;
  static constexpr int kBlockN = kConfig.block_n;
  static constexpr int kNWarps = kConfig.warps;
  static constexpr int kNThreads = kNWarps * 32;
  static_assert(kHeadDim % 32 == 0, "head-dim buckets are multiples of 32");
  static_assert(kBlockM == 16 * kNWarps || kBlockM == 32 * kNWarps, "each warp owns 16 or 32 rows");
  // Softmax tiles where each warp owns one contiguous slice of 16 rows (8 warps of 128 rows, 4 warps of 64): a
  // warp whose rows see no key of a masked block leaves it (forward_kernel_sm80's step), e.g. warps 0-3 leave the
  // upper of a causal diagonal's two blocks. In the 4-warp tiles of 128 rows a warp's rows are two slices 64 rows
  // apart, which see keys on both sides of a diagonal (contiguous 32-row slices there measured neutral: session
  // 21's results); the HSTU d 256 tile spilled 384 bytes with the skip (sm_90a).
  static constexpr bool kWarpsSkipHiddenBlocks = !kHstu && kBlockM == 16 * kNWarps;
  // 8 warps of up to 255 registers fill the register file, so their tile runs alone on its SM and no second tile
  // hides its prologue: it computes the mask spans while Q and the first K block load. H200 bf16, same run: d 256
  // s 512-2k 0.8-1.6% faster; with the same order in the 4-warp tiles, d 64 ran 1.5-1.8% slower at s 2k-4k.
  static constexpr bool kSpansUnderLoads = kNWarps == 8;

  using MmaAtom = std::conditional_t<
      kFp32, SM80_16x8x8_F32TF32TF32F32_TN,
      std::conditional_t<std::is_same_v<Element, cutlass::half_t>, SM80_16x8x16_F32F16F16F32_TN,
                         SM80_16x8x16_F32BF16BF16F32_TN>>;
  static constexpr int kMmaK = kFp32 ? 8 : 16;
  // Warps tile M; the permutation makes the N extent 16 so ldmatrix.x4 fills two n8 MMAs of B at once.
  using TiledMma =
      TiledMMA<MMA_Atom<MmaAtom>, Layout<Shape<Int<kNWarps>, _1, _1>>, Tile<Int<16 * kNWarps>, _16, Int<kMmaK>>>;

  // Shared layouts, 16-bit: rows of 64 (or 32) elements, XOR-swizzled in 16-byte chunks so that both the
  // 128-bit cp.async writes (8 threads cover one 128-byte row) and the ldmatrix reads (8 rows of one 16-byte
  // column) hit 8 distinct bank groups.
  // fp32: whole rows of d floats padded by 16 bytes. ldmatrix (8 rows of 16 bytes) and cp.async stay
  // conflict-free as with a swizzle, and so do the 32-bit V^T reads (lanes (t, g) read key 2t (+1), column g:
  // bank 8t + g); unlike a swizzle, every address a thread reads is one base plus compile-time offsets (a
  // swizzled V^T costs one register per loaded element and spills).
  static constexpr int kBlockKSmem = kFp32 ? 32 : kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kBlockKSmem == 64 ? 3 : 2;
  using SmemLayoutAtom =
      decltype(composition(Swizzle<kSwizzleBits, 3, 3>{}, Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  template <int kRows>
  using SmemLayoutRows =
      std::conditional_t<kFp32, Layout<Shape<Int<kRows>, Int<kHeadDim>>, Stride<Int<kHeadDim + 4>, _1>>,
                         decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kRows>, Int<kHeadDim>>{}))>;
  using SmemLayoutQ = SmemLayoutRows<kBlockM>;
  using SmemLayoutKV = SmemLayoutRows<kBlockN>;
  // V seen as V^T (kHeadDim, kBlockN) over the same bytes, the B operand of P V. 16-bit: read with
  // ldmatrix.trans. fp32: read with 32-bit loads (no transposing ldmatrix for 32-bit elements), and the keys of
  // every k8 slice permuted as acc_layout_as_tf32_a_operand expects: logical key (k0, k1) of (4, 2) is key
  // 2 k0 + k1.
  using VtKeys = std::conditional_t<kFp32, Layout<Shape<Shape<_4, _2, Int<kBlockN / 8>>>, Stride<Stride<_2, _1, _8>>>,
                                    Layout<Shape<Int<kBlockN>>, Stride<_1>>>;
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_layout(Layout<Shape<Int<kHeadDim>>, Stride<Int<kBlockN>>>{}, VtKeys{})));
  using SmemLayoutO = SmemLayoutQ;

  static constexpr int kSmemQBytes = int(cosize(SmemLayoutQ{})) * int(sizeof(Element));
  static constexpr int kSmemKVBytes = int(cosize(SmemLayoutKV{})) * int(sizeof(Element));
  static constexpr int kSmemBytes = kSmemQBytes + 2 * kSmemKVBytes;
  // Accumulator rows per thread (two per 16-row MMA step), and the kernel's static shared memory: per-row
  // visible key spans (int4), the full-block bounds (2 int) and, with kRowSumsInSmem, the softmax row sums
  // (float per row and thread).
  static constexpr int kRowsPerThread = kBlockM / (8 * kNWarps);
  static constexpr int kSmemRowSumRows = kRowSumsInSmem && !kHstu ? kRowsPerThread : 0;
  static constexpr int kSmemStaticBytes = kBlockM * 16 + 8 + kSmemRowSumRows * kNThreads * 4;

  // K-major operands (Q, K): ldmatrix, also for tf32 (one tf32 = a pair of b16). V^T: see SmemLayoutVt.
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, ElementMma>;
  using SmemCopyAtomTransposed =
      std::conditional_t<kFp32, Copy_Atom<UniversalCopy<uint32_t>, ElementMma>, Copy_Atom<SM75_U16x8_LDSM_T, Element>>;
  using SmemCopyAtomO = Copy_Atom<UniversalCopy<uint_bit_t<2 * sizeof_bits_v<Element>>>, Element>;  // 2 adjacent values

  // Global <-> shared: every thread moves 16 contiguous bytes (8 16-bit or 4 fp32 elements) per copy.
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
