// The sm80 forward kernel (FlashAttention-2 algorithm on mma.sync): one thread block computes one
// (query block, batch, head) tile of O for the softmax or the HSTU score function.
// Pipeline per key block n (visited from the last to the first, so the partial and diagonal tiles come
// first): wait for K(n); start V(n); S = Q K^T; score transform and mask; wait for V(n); start K(n-1);
// softmax (or SiLU) on S in registers; O += P V with P reused from the accumulator registers.
#pragma once

#include <climits>
#include <cmath>
#include <type_traits>

#include <cute/tensor.hpp>

#include "core/params.h"
#include "cuda/hstu_pointwise.cuh"
#include "sm80/kernel_traits_fwd_sm80.cuh"
#include "sm80/softmax_sm80.cuh"
#include "sm80/utils_sm80.cuh"
#include "variants/mask.h"
#include "variants/sequence.h"

namespace cuteattn::sm80 {

using namespace cute;
using cute::make_tensor;  // not cuteattn::make_tensor / cuteattn::Tensor (public API names)
using cute::Tensor;
using detail::Mask;
using detail::Params;
using detail::Range;
using detail::SequenceInfo;

using detail::tanh_approx;

// x, passed through an empty volatile asm: the compiler cannot see that the result equals x, so the index
// arithmetic derived from it is done where it is needed, inside the loop body, instead of being hoisted out
// and kept live across the whole key loop. (A shuffle from the thread's own lane hides it from ptxas too and
// takes the d128 spills from 24/32 to 4/4 bytes, but measured ~4% slower at d128 on an H100.)
CUTE_DEVICE int opaque_int(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

// Writes O = 0 (and LSE = -inf) for a query block that sees no key at all.
template <class Traits, class TO>
CUTE_DEVICE void store_empty_block(const Params& p, TO& gO, int rows, int64_t lse_base_row, const SequenceInfo& seq,
                                   int bi, int head) {
  using Element = typename Traits::Element;
  const int tid = threadIdx.x;
  typename Traits::GmemTiledCopyO gmem_tiled_copy_O;
  auto gmem_thr_copy_O = gmem_tiled_copy_O.get_thread_slice(tid);
  Tensor tOgO = gmem_thr_copy_O.partition_D(gO);  // (CPY, CPY_M, CPY_K)
  Tensor tOrO = make_tensor<Element>(shape(tOgO));  // (CPY, CPY_M, CPY_K)
  clear(tOrO);
  Tensor cO = make_identity_tensor(Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{});  // (kBlockM, kHeadDim)
  Tensor tOcO = gmem_thr_copy_O.partition_D(cO);  // (CPY, CPY_M, CPY_K)
  copy_tile_store_predicated(gmem_tiled_copy_O, tOrO, tOgO, tOcO, rows, int(p.head_dim_v));
  if (p.lse != nullptr) {
    for (int r = tid; r < rows; r += Traits::kNThreads) {
      p.lse[seq.lse_index(p, bi, head, lse_base_row + r)] = -INFINITY;
    }
  }
}

// Sets the invisible entries of a score tile (keys n0..) to `value`. `spans` holds, per tile row, the
// visible keys of that row as two intervals [x, y) and [z, w) (Mask's visible_spans, precomputed once per
// query block). The bounds are moved to this thread's column frame once per row, so each element is tested
// against compile-time column offsets: no per-element coordinates stay live across the key loop.
template <class TS, class TC>
CUTE_DEVICE void mask_tile(TS& scores_rc, TC const& coords_rc, const int4* spans, int n0, float value) {
  const int col0 = n0 + get<1>(coords_rc(0, 0));
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(scores_rc); ++mi) {
    const int4 sp = spans[get<0>(coords_rc(mi, 0))];
    const int a0 = sp.x - col0, a1 = sp.y - col0, b0 = sp.z - col0, b1 = sp.w - col0;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(scores_rc); ++ni) {
      const int c = get<1>(coords_rc(0, ni)) - get<1>(coords_rc(0, 0));
      if (!((c >= a0 && c < a1) || (c >= b0 && c < b1))) scores_rc(mi, ni) = value;
    }
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1) forward_kernel_sm80(const __grid_constant__ Params p) {
  using Element = typename Traits::Element;
  constexpr bool kHstu = Traits::kHstu;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;

  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x;
  // Heavier (later, under causal masks) query blocks first: they start while the grid is still full.
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);
  const int bi = blockIdx.y;
  const int head = blockIdx.z;

  const SequenceInfo seq = SequenceInfo::of(p, bi);
  const int64_t m0 = int64_t(m_block) * kBlockM;
  if (m0 >= seq.sq) return;
  const int rows_q = int(detail::min64(seq.sq - m0, kBlockM));
  const Mask mask = Mask::of(p, seq, bi);
  const int head_k = int(head / (p.heads / p.heads_k));

  Element* o_ptr = static_cast<Element*>(p.o.ptr) + seq.q_offset(p.o, bi, m0, head);
  Tensor gO = make_tensor(make_gmem_ptr(o_ptr), Shape<Int<kBlockM>, Int<kHeadDim>>{},
                          make_stride(p.o.row_stride, _1{}));  // (kBlockM, kHeadDim)

  const Range keys = mask.key_range(m0, m0 + kBlockM);
  if (keys.empty()) {
    store_empty_block<Traits>(p, gO, rows_q, m0, seq, bi, head);
    return;
  }
  const int n_block_min = int(keys.begin / kBlockN);
  const int n_block_max = int((keys.end + kBlockN - 1) / kBlockN);
  // The walk goes down from n_block_max - 1 and jumps over the key blocks no row of this block sees (target
  // keys before the rows' own target groups: Mask::key_hole).
  const Range skipped = detail::blocks_inside(mask.key_hole(m0, m0 + kBlockM), kBlockN);
  const int skip_begin = int(skipped.begin), skip_end = int(skipped.end);
  auto next_block = [&](int n_block) {
    return n_block - 1 >= skip_begin && n_block - 1 < skip_end ? skip_begin - 1 : n_block - 1;
  };

  // Per-row visible key spans (sequence key indices < 2^31: cu_seqlens are int32), and the keys every
  // row of the block sees, [full_lo, full_hi): tiles inside it skip the element mask. Kept in shared
  // memory, the mask costs the main loop no registers.
  __shared__ int4 smem_spans[kBlockM];
  __shared__ int smem_full[2];
  // K and V of this (batch entry, kv head): the softmax kernels that rebuild the copies' addresses in every step
  // (Traits::kRebuildGmemAddresses) read them back from shared memory at each copy. Kept in registers across the
  // key loop, d 128 spilled 24 bytes (sm_90a; 8 remain, in the softcap loop); the HSTU d 256 kernel spills 4 with
  // them in shared memory. The 8 are the copy thread's 64-bit row index, which ptxas derives once and keeps across
  // that loop (opaque_int does not hide it from ptxas): neither the softcap scale as a kernel parameter nor a
  // compile-time log2(e) there removed it, and the copies' thread index read from %tid.x removed it at sm_80 but
  // spilled 16 bytes at sm_90a (session 27, ptxas only).
  const Element* k_ptr = static_cast<const Element*>(p.k.ptr) + seq.k_offset(p.k, bi, 0, head_k);
  const Element* v_ptr = static_cast<const Element*>(p.v.ptr) + seq.k_offset(p.v, bi, 0, head_k);
  constexpr bool kKvBasesInSmem = Traits::kRebuildGmemAddresses && !kHstu;
  __shared__ const Element* smem_kv_base[2];
  if (tid == 0) {
    smem_full[0] = 0;
    smem_full[1] = INT_MAX;
    smem_kv_base[0] = k_ptr;
    smem_kv_base[1] = v_ptr;
  }
  __syncthreads();
  // Fills the spans and bounds above: here, or while Q and the first K block are in flight where the tile runs
  // alone on its SM (Traits::kSpansUnderLoads).
  auto compute_spans = [&]() __attribute__((always_inline)) {
    for (int r = tid; r < kBlockM; r += Traits::kNThreads) {
      Range a, b;
      detail::visible_spans(mask, m0 + r, &a, &b);
      smem_spans[r] = make_int4(int(a.begin), int(a.end), int(b.begin), int(b.end));
      if (r < rows_q) {
        atomicMax(&smem_full[0], int(a.begin));
        atomicMin(&smem_full[1], int(a.end));
      }
    }
    __syncthreads();
  };
  if constexpr (!Traits::kSpansUnderLoads) compute_spans();

  const Element* q_ptr = static_cast<const Element*>(p.q.ptr) + seq.q_offset(p.q, bi, m0, head);
  auto k_base = [&]() { return kKvBasesInSmem ? smem_kv_base[0] : k_ptr; };
  auto v_base = [&]() { return kKvBasesInSmem ? smem_kv_base[1] : v_ptr; };
  const int64_t k_row_stride = p.k.row_stride;
  const int64_t v_row_stride = p.v.row_stride;

  Tensor gQ = make_tensor(make_gmem_ptr(q_ptr), Shape<Int<kBlockM>, Int<kHeadDim>>{},
                          make_stride(p.q.row_stride, _1{}));  // (kBlockM, kHeadDim)
  auto gK_block = [&](int n) {
    return make_tensor(make_gmem_ptr(k_base() + int64_t(n) * kBlockN * k_row_stride), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                       make_stride(k_row_stride, _1{}));  // (kBlockN, kHeadDim)
  };
  auto gV_block = [&](int n) {
    return make_tensor(make_gmem_ptr(v_base() + int64_t(n) * kBlockN * v_row_stride), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                       make_stride(v_row_stride, _1{}));  // (kBlockN, kHeadDim)
  };

  Element* smem_q = reinterpret_cast<Element*>(smem);
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim)
  Tensor sK = make_tensor(make_smem_ptr(smem_q + cosize(typename Traits::SmemLayoutQ{})),
                          typename Traits::SmemLayoutKV{});  // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(sK.data() + cosize(typename Traits::SmemLayoutKV{}),
                          typename Traits::SmemLayoutKV{});  // (kBlockN, kHeadDim)
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});  // (kHeadDim, kBlockN)
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});   // (kBlockM, kHeadDim)

  // Global -> shared (cp.async, 128-bit), with coordinates for the row and head-dim predicates.
  typename Traits::GmemTiledCopyQKV gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tid);
  Tensor tQgQ = gmem_thr_copy.partition_S(gQ);  // (CPY, CPY_M, CPY_K)
  Tensor tQsQ = gmem_thr_copy.partition_D(sQ);  // (CPY, CPY_M, CPY_K)
  Tensor tKsK = gmem_thr_copy.partition_D(sK);  // (CPY, CPY_N, CPY_K)
  Tensor tVsV = gmem_thr_copy.partition_D(sV);  // (CPY, CPY_N, CPY_K)
  Tensor cQ = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});   // (kBlockM, kHeadDim)
  Tensor cKV = make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{});  // (kBlockN, kHeadDim)
  Tensor tQcQ = gmem_thr_copy.partition_S(cQ);     // (CPY, CPY_M, CPY_K)
  Tensor tKVcKV = gmem_thr_copy.partition_S(cKV);  // (CPY, CPY_N, CPY_K)
  Tensor tQKp = make_tensor<bool>(make_shape(size<2>(tQsQ)));  // (CPY_K): column chunk inside d
  CUTE_UNROLL
  for (int k = 0; k < size(tQKp); ++k) tQKp(k) = get<1>(tQcQ(0, 0, k)) < p.head_dim;

  // MMA partitions and the ldmatrix copies that feed them.
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);  // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_mma.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K)
  Tensor tOrVt = thr_mma.partition_fragment_B(
      make_tensor(sV.data(), Layout<Shape<Int<kHeadDim>, Int<kBlockN>>>{}));  // (MMA, MMA_K, MMA_N)
  Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_K)
  clear(acc_o);

  // The ldmatrix tiled copies; their per-thread partitions are rebuilt in every key step (see step).
  auto smem_tiled_copy_Q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_tiled_copy_K = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_tiled_copy_V = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);

  Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));  // (ROWS, COLS_O)
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
  // The thread indices the key loop derives its global (K/V copies) and shared (ldmatrix, score coordinates)
  // addresses from: opaque where the traits ask for them to be rebuilt in every step (see opaque_int), else
  // plain, and the compiler hoists what they feed out of the loop.
  auto gmem_tid = [&]() __attribute__((always_inline)) {
    return Traits::kRebuildGmemAddresses ? opaque_int(tid) : tid;
  };
  auto smem_tid = [&]() __attribute__((always_inline)) {
    return Traits::kRebuildSmemAddresses ? opaque_int(tid) : tid;
  };
  // Tile coordinates of each score register, viewed as (rows, cols).
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});  // (kBlockM, kBlockN)
  auto score_coords = [&]() {
    Tensor tScS = tiled_mma.get_thread_slice(smem_tid()).partition_C(cS);  // (MMA, MMA_M, MMA_N)
    return make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));     // (ROWS, COLS)
  };

  const int64_t sk = seq.sk;
  const bool has_softcap = !kHstu && p.softcap > 0.0f;
  const float softcap_in = has_softcap ? p.scale / p.softcap : 0.0f;
  const float scale_log2 = (has_softcap ? 1.0f : p.scale) * float(M_LOG2E);
  const Element* rab_ptr = nullptr;
  if constexpr (kHstu) {
    if (p.rab != nullptr) {
      rab_ptr = static_cast<const Element*>(p.rab) + int64_t(bi) * p.rab_batch_stride +
                (p.rab_heads == 1 ? 0 : int64_t(head)) * p.rab_head_stride;
    }
  }
  static_assert(kRows == Traits::kRowsPerThread);
  constexpr int kSumRows = kHstu ? 1 : kRows;  // HSTU keeps no row sums
  constexpr bool kSumsInSmem = Traits::kSmemRowSumRows > 0;
  __shared__ float smem_row_sum[kSumsInSmem ? kSumRows : 1][kSumsInSmem ? Traits::kNThreads : 1];
  OnlineSoftmax<kSumRows, Traits::kNThreads, kSumsInSmem> softmax(
      reinterpret_cast<float(*)[Traits::kNThreads]>(&smem_row_sum[0][0]), tid);

  // Starts the cp.async copy of one K or V block (rows past max_rows and columns past head_dim zero-filled).
  // With kRebuildGmemAddresses, addresses and column predicates come from an opaque thread index, so they
  // are rebuilt at each copy instead of being kept across the key loop (8 64-bit row addresses and the
  // predicates per tensor).
  auto copy_kv_block = [&](auto kRowCheck, auto gX, auto& tXsX, int64_t head_dim, int max_rows)
      __attribute__((always_inline)) {
    auto thr_copy = gmem_tiled_copy.get_thread_slice(gmem_tid());
    Tensor tXgX = thr_copy.partition_S(gX);    // (CPY, CPY_N, CPY_K)
    Tensor tXcX = thr_copy.partition_S(cKV);   // (CPY, CPY_N, CPY_K)
    Tensor tXp = make_tensor<bool>(make_shape(size<2>(tXgX)));  // (CPY_K)
    CUTE_UNROLL
    for (int k = 0; k < size(tXp); ++k) tXp(k) = get<1>(tXcX(0, 0, k)) < head_dim;
    copy_tile_predicated<decltype(kRowCheck)::value>(gmem_tiled_copy, tXgX, tXsX, tXcX, tXp, max_rows);
  };

  // Prologue: Q and the last key block in flight together.
  copy_tile_predicated<true>(gmem_tiled_copy, tQgQ, tQsQ, tQcQ, tQKp, rows_q);
  {
    Tensor tKgK = gmem_thr_copy.partition_S(gK_block(n_block_max - 1));  // (CPY, CPY_N, CPY_K)
    copy_tile_predicated<true>(gmem_tiled_copy, tKgK, tKsK, tKVcKV, tQKp, int(sk - int64_t(n_block_max - 1) * kBlockN));
  }
  cp_async_fence();
  if constexpr (Traits::kSpansUnderLoads) compute_spans();
  // Key blocks [full_begin, full_end) lie wholly inside [full_lo, full_hi).
  const int full_begin = (smem_full[0] + kBlockN - 1) / kBlockN;
  const int full_end = smem_full[1] / kBlockN;

  // Whether a row of this thread's warp sees a key of the block from key n0 (Traits::kWarpsSkipHiddenBlocks): each
  // thread tests its own rows' spans, the warp votes.
  auto warp_sees_block = [&](int n0) __attribute__((always_inline)) {
    Tensor tScS_rc = score_coords();  // (ROWS, COLS)
    const int n1 = n0 + kBlockN;
    bool sees = false;
    CUTE_UNROLL
    for (int mi = 0; mi < size<0>(tScS_rc); ++mi) {
      const int4 s = smem_spans[get<0>(tScS_rc(mi, 0))];
      sees |= max(s.x, n0) < min(s.y, n1) || max(s.z, n0) < min(s.w, n1);
    }
    return __any_sync(0xffffffffu, sees);
  };

  // One key block. kMasked: the tile has invisible or out-of-range entries (element mask, row-checked V
  // copy); kFeature: softcap (softmax) or rab (HSTU) is on. Each combination is a separate inlined copy of
  // the body so that the common path (full tile, no feature) carries no predicated-off mask or tanh work.
  using Yes = std::true_type;
  using No = std::false_type;
  auto step = [&](int n_block, auto masked_tag, auto feature_tag) __attribute__((always_inline)) {
    constexpr bool kMasked = decltype(masked_tag)::value;
    constexpr bool kFeature = decltype(feature_tag)::value;
    const int64_t n0 = int64_t(n_block) * kBlockN;
    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
    clear(acc_s);
    Tensor acc_s_rc = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));  // (ROWS, COLS)

    cp_async_wait<0>();
    if constexpr (Traits::kFp32) {  // each thread rounds what its own copies wrote, before the barrier
      if (n_block == n_block_max - 1) round_tile_to_tf32(tQsQ);
      round_tile_to_tf32(tKsK);
    }
    __syncthreads();  // K(n) visible to all warps; every warp is done with V(n+1)
    {
      // Only a masked tile can be partial (a full tile ends at or before the last key).
      copy_kv_block(std::bool_constant<kMasked>{}, gV_block(n_block), tVsV, p.head_dim_v, int(sk - n0));
      cp_async_fence();
    }

    // A warp none of whose rows sees a key of a masked block leaves it: its scores would all be masked, which
    // leaves O and the row statistics as they are. It still takes part in the block's copies and barriers.
    const bool warp_skips = kMasked && Traits::kWarpsSkipHiddenBlocks && !warp_sees_block(int(n0));

    // HSTU relative attention bias, read straight into the accumulator layout; in flight during Q K^T.
    Tensor rRab = make_tensor<float>(shape(acc_s_rc));  // (ROWS, COLS)
    if constexpr (kHstu && kFeature) {
      Tensor tScS_rc = score_coords();  // (ROWS, COLS)
      CUTE_UNROLL
      for (int mi = 0; mi < size<0>(rRab); ++mi) {
        const int64_t i = m0 + get<0>(tScS_rc(mi, 0));
        const int64_t r = i + (seq.sk - seq.sq);
        const bool row_ok = i < seq.sq && r >= 0 && r < p.seqlen_k;
        const Element* rab_row = rab_ptr + r * p.rab_row_stride;
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(rRab); ++ni) {
          const int64_t j = n0 + get<1>(tScS_rc(0, ni));
          rRab(mi, ni) = row_ok && (!kMasked || j < sk) ? float(rab_row[j]) : 0.0f;
        }
      }
    }

    if (!warp_skips) {
      // Swizzled shared addresses of every k-slice; with kRebuildSmemAddresses derived here from a thread index
      // the compiler cannot see through (hoisted out of the key loop they hold ~20 registers for the whole loop).
      const int step_tid = smem_tid();
      auto smem_thr_copy_Q = smem_tiled_copy_Q.get_thread_slice(step_tid);
      Tensor tSsQ = smem_thr_copy_Q.partition_S(sQ);  // (CPY, CPY_M, CPY_K)
      auto smem_thr_copy_K = smem_tiled_copy_K.get_thread_slice(step_tid);
      Tensor tSsK = smem_thr_copy_K.partition_S(sK);  // (CPY, CPY_N, CPY_K)
      gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, smem_tiled_copy_Q, smem_tiled_copy_K, smem_thr_copy_Q,
              smem_thr_copy_K);

      if constexpr (kHstu) {
        const detail::HstuPointwise hstu(p);
        CUTE_UNROLL
        for (int mi = 0; mi < size<0>(acc_s_rc); ++mi) {
          CUTE_UNROLL
          for (int ni = 0; ni < size<1>(acc_s_rc); ++ni) {
            acc_s_rc(mi, ni) = hstu.prob(kFeature ? acc_s_rc(mi, ni) + rRab(mi, ni) : acc_s_rc(mi, ni));
          }
        }
        if constexpr (kMasked) mask_tile(acc_s_rc, score_coords(), smem_spans, int(n0), 0.0f);
      } else {
        if constexpr (kFeature) {
          CUTE_UNROLL
          for (int e = 0; e < size(acc_s); ++e) acc_s(e) = p.softcap * tanh_approx(acc_s(e) * softcap_in);
        }
        if constexpr (kMasked) mask_tile(acc_s_rc, score_coords(), smem_spans, int(n0), -INFINITY);
      }
    }

    cp_async_wait<0>();
    if constexpr (Traits::kFp32) round_tile_to_tf32(tVsV);
    __syncthreads();  // V(n) visible to all warps; every warp is done reading K(n)
    if (next_block(n_block) >= n_block_min) {
      copy_kv_block(std::false_type{}, gK_block(next_block(n_block)), tKsK, p.head_dim, kBlockN);
      cp_async_fence();
    }

    if (warp_skips) return;
    if constexpr (!kHstu) softmax.update(acc_s_rc, acc_o_rc, scale_log2, smem_tid());

    Tensor rP = convert_fragment<typename Traits::ElementMma>(acc_s);  // (MMA, MMA_M, MMA_N)
    Tensor tOrP = make_tensor(rP.data(), [&] {
      if constexpr (Traits::kFp32) {
        return acc_layout_as_tf32_a_operand(rP.layout());  // ((2,2), MMA_M, MMA_N)
      } else {
        return acc_layout_as_a_operand(rP.layout());  // ((2,2,2), MMA_M, MMA_N / 2)
      }
    }());
    auto smem_thr_copy_V = smem_tiled_copy_V.get_thread_slice(smem_tid());
    Tensor tOsVt = smem_thr_copy_V.partition_S(sVt);  // (CPY, CPY_K, CPY_N)
    gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, smem_tiled_copy_V, smem_thr_copy_V);
  };

  // Runs of masked blocks (above the full range, and below it for windows and targets) alternate with the
  // run of full ones; each run is its own loop around one inlined copy of the body.
  auto walk = [&](auto feature_tag) __attribute__((always_inline)) {
    int n_block = n_block_max - 1;
    while (n_block >= n_block_min) {
      for (; n_block >= n_block_min && (n_block >= full_end || n_block < full_begin); n_block = next_block(n_block)) {
        step(n_block, Yes{}, feature_tag);
      }
      for (; n_block >= n_block_min && n_block >= full_begin; n_block = next_block(n_block)) {
        step(n_block, No{}, feature_tag);
      }
    }
  };
  if (kHstu ? rab_ptr != nullptr : has_softcap) {
    walk(Yes{});
  } else {
    walk(No{});
  }

  // Epilogue: normalise, stage O through shared memory (reusing sQ), store with 128-bit vectors. Its
  // thread-dependent coordinates come from a fresh index (opaque with kRebuildSmemAddresses, so that none of
  // them is kept across the loop).
  const int epi_tid = smem_tid();
  Tensor rLse = make_tensor<float>(Shape<Int<kRows>>{});  // (ROWS)
  if constexpr (!kHstu) softmax.finalize(acc_o_rc, rLse, epi_tid);
  Tensor rO = convert_fragment<Element>(acc_o);  // (MMA, MMA_M, MMA_K)
  auto smem_tiled_copy_O = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_copy_O = smem_tiled_copy_O.get_thread_slice(epi_tid);
  Tensor taccOrO = smem_thr_copy_O.retile_S(rO);   // (CPY, CPY_M, CPY_K)
  Tensor taccOsO = smem_thr_copy_O.partition_D(sO);  // (CPY, CPY_M, CPY_K)
  __syncthreads();  // every warp is done reading sQ before it is overwritten with O
  cute::copy(smem_tiled_copy_O, taccOrO, taccOsO);

  if constexpr (!kHstu) {
    if (p.lse != nullptr) {
      Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (kBlockM, kHeadDim)
      Tensor tOcO = tiled_mma.get_thread_slice(epi_tid).partition_C(cO);        // (MMA, MMA_M, MMA_K)
      Tensor tOcO_rc = make_tensor(tOcO.data(), acc_layout_rowcol(tOcO.layout()));  // (ROWS, COLS_O)
      if (get<1>(tOcO_rc(0, 0)) == 0) {  // the first thread of each quad owns its rows' LSE
        CUTE_UNROLL
        for (int mi = 0; mi < kRows; ++mi) {
          const int row = get<0>(tOcO_rc(mi, 0));
          if (row < rows_q) p.lse[seq.lse_index(p, bi, head, m0 + row)] = rLse(mi);
        }
      }
    }
  }
  __syncthreads();

  typename Traits::GmemTiledCopyO gmem_tiled_copy_O;
  auto gmem_thr_copy_O = gmem_tiled_copy_O.get_thread_slice(epi_tid);
  Tensor tOsO = gmem_thr_copy_O.partition_S(sO);  // (CPY, CPY_M, CPY_K)
  Tensor tOgO = gmem_thr_copy_O.partition_D(gO);  // (CPY, CPY_M, CPY_K)
  Tensor tOrO = make_tensor<Element>(shape(tOgO));  // (CPY, CPY_M, CPY_K)
  cute::copy(gmem_tiled_copy_O, tOsO, tOrO);
  Tensor tOcO = gmem_thr_copy_O.partition_D(cQ);  // (CPY, CPY_M, CPY_K)
  copy_tile_store_predicated(gmem_tiled_copy_O, tOrO, tOgO, tOcO, rows_q, int(p.head_dim_v));
}

}  // namespace cuteattn::sm80
