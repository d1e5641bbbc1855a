// The main sm80 backward kernel (FlashAttention-2 algorithm): one CTA per key block, batch entry and group of
// query heads. It keeps K, V and the fp32 dK/dV accumulators on chip, walks the query blocks that see the key
// block, recomputes S and P, and accumulates dV += P^T dO, dK += dS^T Q, and dQ (fp32, atomics into the
// workspace). Softmax (P from LSE, dS = P (dP - D), softcap) and HSTU (SiLU, rab, dRab) share the loop.
#pragma once

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90.hpp>

#include "core/params.h"
#include "cuda/hstu_pointwise.cuh"
#include "sm80/backward_traits_sm80.cuh"
#include "sm80/backward_utils_sm80.cuh"
#include "variants/mask.h"
#include "variants/score.h"
#include "variants/sequence.h"

namespace cuteattn::detail::sm80_bwd {

using namespace cute;
using cute::make_tensor;  // not cuteattn::make_tensor and cuteattn::Tensor of the public API
using cute::Tensor;

struct BwdKernelArgs {
  Params p;
  float* dq_accum;          // fp32 dQ partials in the thread order of DqTiles, one copy per split; zeroed
  int64_t dq_split_stride;  // elements between the dQ partials of two splits
  const float* dsum;        // softmax: rowsum(dO * O), indexed like LSE
  float* drab_accum;        // HSTU, one rab head shared by several heads: (b, max_sk, drab_ld) fp32 partial sums
  int64_t drab_ld;          // row stride of drab_accum (max_sk rounded up to even: column pairs are 8-byte aligned)
  int n_blocks;             // key blocks of the longest sequence
  int nsplit;               // CTAs along x; CTA x walks key blocks x, x + nsplit, ... (deterministic mode)
  int heads_per_cta;        // query heads one CTA walks, in order (a multiple of kv_group)
  int kv_group;             // heads / heads_k: query heads whose dK/dV sum into one kv head
  bool drab_walk;           // drab_accum holds the partial sums one CTA carries through every head (else atomics)
  bool heads_inner;         // grid (nsplit * head groups, b, 1), the head group fastest; else (nsplit, b, head groups)
};

// This batch entry's sequence bounds and mask, in shared memory: held in registers, their 64-bit fields took ~24
// of them across the query-block loop; read from shared memory where used (the loop's barriers keep the compiler
// from hoisting the loads), they cost a few LDS per block.
struct CtaScalars {
  SequenceInfo seq;
  Mask mask;
};
// The same for the query head being walked: its row 0 in q, dout, LSE, D, and its query block 0's tile in this
// split's dQ accumulator.
template <class Element>
struct HeadBases {
  const Element* q;
  const Element* dout;
  const float* lse;
  const float* dsum;
  float* dq;
};

template <class Traits, bool kHstu>
__global__ void __launch_bounds__(Traits::kNThreads, 1) bwd_kernel(const __grid_constant__ BwdKernelArgs args) {
  using Element = typename Traits::Element;
  using ElementAccum = typename Traits::ElementAccum;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr float kLog2e = 1.4426950408889634f;

  const Params& p = args.p;
  const int tidx = threadIdx.x;
  // Softmax never takes the heads-inner grid: there both indices stay special registers (no live registers).
  const bool heads_inner = kHstu && args.heads_inner;
  const int head_groups = int(p.heads / args.heads_per_cta);
  const int split_x = heads_inner ? int(blockIdx.x) / head_groups : int(blockIdx.x);
  const int head_group = heads_inner ? int(blockIdx.x) % head_groups : int(blockIdx.z);
  const int64_t bi = blockIdx.y;
  const int d = int(p.head_dim), dv = int(p.head_dim_v);

  extern __shared__ char smem_raw[];
  Element* smem_q = reinterpret_cast<Element*>(smem_raw);
  Element* smem_do = smem_q + kStages * Traits::kSizeQdO;
  Element* smem_k = smem_do + kStages * Traits::kSizeQdO;
  Element* smem_v = smem_k + Traits::kSizeKV;
  Element* smem_p = smem_v + Traits::kSizeKV;
  Element* smem_ds = smem_p + Traits::kSizePdS;
  float* smem_lse = reinterpret_cast<float*>(smem_ds + Traits::kSizePdS);  // (kStages, kBlockM)
  float* smem_dsum = smem_lse + kStages * kBlockM;                         // (kStages, kBlockM)
  static_assert(sizeof(CtaScalars) + sizeof(HeadBases<Element>) <= Traits::kSmemScalarBytes);
  CtaScalars* cta = reinterpret_cast<CtaScalars*>(smem_dsum + kStages * kBlockM);
  HeadBases<Element>* head = reinterpret_cast<HeadBases<Element>*>(cta + 1);
  if (tidx == 0) {
    const SequenceInfo s = SequenceInfo::of(p, bi);
    *cta = CtaScalars{s, Mask::of(p, s, bi)};
  }
  __syncthreads();
  const SequenceInfo& seq = cta->seq;
  const Mask& mask = cta->mask;
  const int sq = int(seq.sq), sk = int(seq.sk);

  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});         // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutKV{});         // (kBlockN, kHeadDim)
  Tensor sKt = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKt{});        // (kHeadDim, kBlockN)
  Tensor sKtNoSwizzle = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKtNoSwizzle{});  // (kHeadDim, kBlockN)
  Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdS{});        // (kBlockM, kBlockN)
  Tensor sPt = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdSt{});      // (kBlockN, kBlockM)
  Tensor sPtNoSwizzle = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdStNoSwizzle{});  // (kBlockN, kBlockM)
  Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdS{});      // (kBlockM, kBlockN)
  Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdSt{});    // (kBlockN, kBlockM)
  Tensor sQ0 = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQdO{});       // (kBlockM, kHeadDim)
  Tensor sdO0 = make_tensor(make_smem_ptr(smem_do), typename Traits::SmemLayoutQdO{});     // (kBlockM, kHeadDim)
  Tensor sQtNoSwizzle = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQdOtNoSwizzle{});  // (kHeadDim, kBlockM)

  // Every thread-dependent shared or global address (ldmatrix and cp.async partitions, accumulator coordinates)
  // is built where it is used from loop_tid(). With Traits::kRebuildAddresses that index is opaque, so the
  // addresses are recomputed at each use rather than hoisted out of the query-block loop, where they hold ~40
  // registers next to the dK/dV accumulators. The thread slices taken from tidx below serve only the register
  // fragments' shapes.
  auto loop_tid = []() { return thread_index<Traits::kRebuildAddresses>(); };
  typename Traits::GmemTiledCopy gmem_tiled_copy;
  Tensor cQ = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (kBlockM, kHeadDim)
  Tensor cK = make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{});  // (kBlockN, kHeadDim)

  // S = Q K^T and dP = dO V^T.
  typename Traits::TiledMmaSdP tiled_mma_sdp;
  auto thr_mma_sdp = tiled_mma_sdp.get_thread_slice(tidx);
  Tensor tSrQ = thr_mma_sdp.partition_fragment_A(sQ0);    // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_mma_sdp.partition_fragment_B(sK);     // (MMA, MMA_N, MMA_K)
  Tensor tdPrdO = thr_mma_sdp.partition_fragment_A(sdO0); // (MMA, MMA_M, MMA_K)
  Tensor tdPrV = thr_mma_sdp.partition_fragment_B(sV);    // (MMA, MMA_N, MMA_K)
  auto smem_tiled_copy_sdp_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma_sdp);
  auto smem_tiled_copy_sdp_b = make_tiled_copy_B(typename Traits::SmemCopyAtomSdPB{}, tiled_mma_sdp);
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});  // (kBlockM, kBlockN)
  // (ROW, COL) -> index into an S/dP accumulator
  const auto acc_rc = rowcol(make_layout(shape(thr_mma_sdp.partition_C(cS))));
  constexpr int kRows = decltype(size<0>(acc_rc))::value;
  constexpr int kCols = decltype(size<1>(acc_rc))::value;
  // This thread's (row, col) coordinates in the S/dP tile.
  auto score_coords = [&]() {
    Tensor tScS = tiled_mma_sdp.get_thread_slice(loop_tid()).partition_C(cS);  // (MMA, MMA_M, MMA_N)
    return make_tensor(tScS.data(), rowcol(tScS.layout()));                     // (ROW, COL)
  };
  // P and dS into shared memory: by stmatrix where Traits::kStmatrixPdS and the device has it (sm_90). P stays in
  // registers across the dP GEMM (Traits::kPInRegisters) only there: with the 32-bit stores' addresses the sm_80
  // build spilled (d 64: 64 bytes).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using StoreAtomPdS = std::conditional_t<Traits::kStmatrixPdS, Copy_Atom<SM90_U32x4_STSM_N, Element>,
                                          typename Traits::SmemCopyAtomPdS>;
  constexpr bool kPInRegisters = Traits::kPInRegisters;
#else
  using StoreAtomPdS = typename Traits::SmemCopyAtomPdS;
  constexpr bool kPInRegisters = false;
#endif
  // Where P stays in registers, the S and dP GEMMs' addresses and the dQ reductions' are rebuilt at each use too:
  // hoisted out of the loop they spilled (sm_90a, d 64: 44 bytes; the dQ offsets as separate 64-bit registers), and
  // so did hoisting any one or two of the three groups (24-60 bytes).
  auto step_tid = []() { return thread_index<Traits::kRebuildAddresses || kPInRegisters>(); };
  auto smem_tiled_copy_pds = make_tiled_copy_C(StoreAtomPdS{}, tiled_mma_sdp);
  // A fragment in the S/dP accumulator layout to or from this thread's part of sP or sdS.
  auto store_pds = [&](auto const& frag, auto& sX) {
    auto thr = smem_tiled_copy_pds.get_thread_slice(loop_tid());
    copy(smem_tiled_copy_pds, thr.retile_S(frag), thr.partition_D(sX));
  };
  auto smem_tiled_load_pds = make_tiled_copy_C(typename Traits::SmemLoadAtomPdS{}, tiled_mma_sdp);
  // ldmatrix hands each lane values other lanes of its warp stored (store_pds): the warp synchronises first, and
  // again after, since HSTU's dS then overwrites the dprob values other lanes read.
  auto load_pds = [&](auto const& sX, auto& frag) {
    __syncwarp();
    auto thr = smem_tiled_load_pds.get_thread_slice(loop_tid());
    copy(smem_tiled_load_pds, thr.partition_S(sX), thr.retile_D(frag));
    __syncwarp();
  };

  // dV += P^T dO and dK += dS^T Q.
  typename Traits::TiledMmadKV tiled_mma_dkv;
  auto thr_mma_dkv = tiled_mma_dkv.get_thread_slice(tidx);
  Tensor tdVrPt = thr_mma_dkv.partition_fragment_A(sPtNoSwizzle);   // (MMA, MMA_N, MMA_K)
  Tensor tdVrdOt = thr_mma_dkv.partition_fragment_B(sQtNoSwizzle);  // (MMA, MMA_D, MMA_K)
  Tensor tdKrdSt = thr_mma_dkv.partition_fragment_A(sPtNoSwizzle);  // (MMA, MMA_N, MMA_K)
  Tensor tdKrQt = thr_mma_dkv.partition_fragment_B(sQtNoSwizzle);   // (MMA, MMA_D, MMA_K)
  auto smem_tiled_copy_dkv_a = make_tiled_copy_A(typename Traits::SmemCopyAtomTransposed{}, tiled_mma_dkv);
  auto smem_tiled_copy_dkv_b = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma_dkv);
  Tensor acc_dk = partition_fragment_C(tiled_mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});  // (MMA, MMA_N, MMA_D)
  Tensor acc_dv = partition_fragment_C(tiled_mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});  // (MMA, MMA_N, MMA_D)

  // dQ = dS K.
  typename Traits::TiledMmadQ tiled_mma_dq;
  auto thr_mma_dq = tiled_mma_dq.get_thread_slice(tidx);
  Tensor tdQrdS = thr_mma_dq.partition_fragment_A(sdS);          // (MMA, MMA_M, MMA_K)
  constexpr int kDqCols = kHeadDim / Traits::kDqChunks;
  Tensor tdQrKt = thr_mma_dq.partition_fragment_B(
      local_tile(sKtNoSwizzle, Shape<Int<kDqCols>, Int<kBlockN>>{}, make_coord(0, 0)));  // (MMA, MMA_D, MMA_K)
  auto smem_tiled_copy_dq_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma_dq);
  auto smem_tiled_copy_dq_b = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma_dq);
  Tensor cdQ = make_identity_tensor(Shape<Int<kBlockM>, Int<kDqCols>>{});  // (kBlockM, kDqCols)
  // dQ reductions: groups of kDqRedVec fragment elements, each one instruction (DqTiles gives their order).
  using DqLayout = DqTiles<Traits>;
  static_assert(decltype(size(thr_mma_dq.partition_C(cdQ)))::value == DqLayout::kPerThread);
  constexpr int kDqGroups = DqLayout::kPerThread / kDqRedVec;
  const int64_t dq_block_stride = p.heads * int64_t(DqLayout::kTileElems);  // between two query blocks' tiles

  const SoftcapScore softmax_score{p.scale, p.softcap};
  const HstuPointwise hstu(p);
  const float scale_log2 = p.scale * kLog2e;
  const bool drab_direct = kHstu && p.drab != nullptr && args.drab_accum == nullptr;
  // dRab summed over heads by one CTA that walks every head of its key block (else atomics into a zeroed
  // drab_accum): the first head stores its fp32 dS, later ones add to it, the last writes dRab itself.
  const bool drab_walk = kHstu && args.drab_walk;
  const bool deterministic = p.deterministic;

  // LSE in log2 units; rows that see no key have LSE = -inf and get +inf, so their P = exp2(x - inf) = 0.
  auto lse_log2 = [](float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; };

  // A query block is visited when the mask lets some of its rows see this key block.
  auto block_visible = [&](int m, int n0) {
    const Range keys = mask.key_range(int64_t(m) * kBlockM, int64_t(m + 1) * kBlockM);
    return keys.begin < n0 + kBlockN && keys.end > n0;
  };

  for (int n_block = split_x; n_block < args.n_blocks; n_block += args.nsplit) {
    const int n0 = n_block * kBlockN;
    if (n0 >= sk) break;
    const Range rows = mask.row_range(n0, n0 + kBlockN);
    const int m_begin = rows.empty() ? 0 : int(rows.begin / kBlockM);
    const int m_end = rows.empty() ? 0 : int((rows.end + kBlockM - 1) / kBlockM);
    // Which query blocks [chunk_base, chunk_base + 32) see this key block (vis_bits) and are fully visible
    // (full_bits): one mask evaluation per lane every 32 blocks instead of the 64-bit mask math per block.
    int chunk_base = m_end;
    uint32_t vis_bits = 0, full_bits = 0;
    // Visible keys of query row i as two column intervals [x, y) and [z, w) of this key block (Mask's
    // visible_spans; key indices fit 32 bits), so a partially visible tile masks with four compares per element.
    auto row_spans = [&](int i) {
      Range a, b;
      visible_spans(mask, i, &a, &b);
      return make_int4(int(a.begin) - n0, int(a.end) - n0, int(b.begin) - n0, int(b.end) - n0);
    };
    auto next_visible = [&](int m) {  // first visible query block >= m (m_end if none); its bits are loaded
      while (m < m_end) {
        if (m < chunk_base || m >= chunk_base + 32) {
          const int mm = m + tidx % 32;
          const bool in = mm < m_end;
          vis_bits = __ballot_sync(0xffffffffu, in && block_visible(mm, n0));
          full_bits = __ballot_sync(0xffffffffu, in && mask.tile_fully_visible(int64_t(mm) * kBlockM,
                                                                               int64_t(mm + 1) * kBlockM, n0,
                                                                               n0 + kBlockN));
          chunk_base = m;
        }
        const uint32_t rest = vis_bits >> (m - chunk_base);
        if (rest != 0u) return m + __ffs(int(rest)) - 1;
        m = chunk_base + 32;
      }
      return m_end;
    };

    const int kv_heads_per_cta = args.heads_per_cta / args.kv_group;
    for (int kv_i = 0; kv_i < kv_heads_per_cta; ++kv_i) {
      const int hk = head_group * kv_heads_per_cta + kv_i;
      __syncthreads();  // every warp is done reading sK/sV (and sQ/sdO) of the previous head or key block
      {
        Tensor gK = make_tensor(make_gmem_ptr(static_cast<const Element*>(p.k.ptr) + seq.k_offset(p.k, bi, n0, hk)),
                                Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(p.k.row_stride, _1{}));  // (kBlockN, kHeadDim)
        Tensor gV = make_tensor(make_gmem_ptr(static_cast<const Element*>(p.v.ptr) + seq.k_offset(p.v, bi, n0, hk)),
                                Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(p.v.row_stride, _1{}));  // (kBlockN, kHeadDim)
        auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(loop_tid());
        Tensor tKcK = gmem_thr_copy.partition_S(cK);  // (CPY, CPY_N, CPY_K)
        Tensor tKgK = gmem_thr_copy.partition_S(gK);  // (CPY, CPY_N, CPY_K)
        Tensor tKsK = gmem_thr_copy.partition_D(sK);  // (CPY, CPY_N, CPY_K)
        Tensor tVgV = gmem_thr_copy.partition_S(gV);  // (CPY, CPY_N, CPY_K)
        Tensor tVsV = gmem_thr_copy.partition_D(sV);  // (CPY, CPY_N, CPY_K)
        copy_tile_pred<kBlockN, kHeadDim>(gmem_tiled_copy, tKgK, tKsK, tKcK, sk - n0, d);
        copy_tile_pred<kBlockN, kHeadDim>(gmem_tiled_copy, tVgV, tVsV, tKcK, sk - n0, dv);
        cp_async_fence();
      }
      bool kv_unrounded = Traits::kFp32;  // fp32: K/V still to be rounded to tf32 once they have landed
      clear(acc_dk);
      clear(acc_dv);

      for (int g = 0; g < args.kv_group; ++g) {
        const int hq = hk * args.kv_group + g;
        auto load_q_do = [&](int m, int stage) {
          Tensor gQ = make_tensor(make_gmem_ptr(head->q + int64_t(m) * kBlockM * p.q.row_stride),
                                  Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_stride(p.q.row_stride, _1{}));  // (kBlockM, kHeadDim)
          Tensor gdO = make_tensor(make_gmem_ptr(head->dout + int64_t(m) * kBlockM * p.dout.row_stride),
                                   Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_stride(p.dout.row_stride, _1{}));  // (kBlockM, kHeadDim)
          Tensor sQ = make_tensor(make_smem_ptr(smem_q + stage * Traits::kSizeQdO), typename Traits::SmemLayoutQdO{});    // (kBlockM, kHeadDim)
          Tensor sdO = make_tensor(make_smem_ptr(smem_do + stage * Traits::kSizeQdO), typename Traits::SmemLayoutQdO{});  // (kBlockM, kHeadDim)
          // Always from an opaque index: hoisted, the 64-bit row offsets of these copies stay live across the loop.
          auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(thread_index<true>());
          Tensor tQcQ = gmem_thr_copy.partition_S(cQ);     // (CPY, CPY_M, CPY_K)
          Tensor tQgQ = gmem_thr_copy.partition_S(gQ);     // (CPY, CPY_M, CPY_K)
          Tensor tQsQ = gmem_thr_copy.partition_D(sQ);     // (CPY, CPY_M, CPY_K)
          Tensor tdOgdO = gmem_thr_copy.partition_S(gdO);  // (CPY, CPY_M, CPY_K)
          Tensor tdOsdO = gmem_thr_copy.partition_D(sdO);  // (CPY, CPY_M, CPY_K)
          copy_tile_pred<kBlockM, kHeadDim>(gmem_tiled_copy, tQgQ, tQsQ, tQcQ, sq - m * kBlockM, d);
          copy_tile_pred<kBlockM, kHeadDim>(gmem_tiled_copy, tdOgdO, tdOsdO, tQcQ, sq - m * kBlockM, dv);
          if (!kHstu && tidx < 2 * kBlockM) {  // rows past sq read as 0
            const int r = tidx % kBlockM, i = m * kBlockM + r;
            const float* src = (tidx < kBlockM ? head->lse : head->dsum) + (i < sq ? i : 0);
            cp_async_4b(src, (tidx < kBlockM ? smem_lse : smem_dsum) + stage * kBlockM + r, i < sq);
          }
          cp_async_fence();
        };

        int m = next_visible(m_begin);
        int stage = 0;
        __syncthreads();  // the previous head's last query block is no longer read from sQ/sdO or *head
        if (tidx == 0) {
          const int64_t lse_row0 = kHstu ? 0 : seq.lse_index(p, bi, hq, 0);
          *head = HeadBases<Element>{
              static_cast<const Element*>(p.q.ptr) + seq.q_offset(p.q, bi, 0, hq),
              static_cast<const Element*>(p.dout.ptr) + seq.q_offset(p.dout, bi, 0, hq),
              kHstu ? nullptr : p.lse + lse_row0, kHstu ? nullptr : args.dsum + lse_row0,
              args.dq_accum + (deterministic ? split_x : 0) * args.dq_split_stride +
                  (DqLayout::first_tile(p, bi, seq.first_q_row(p, bi)) + hq) * DqLayout::kTileElems};
        }
        __syncthreads();
        if (m < m_end) load_q_do(m, 0);
        while (m < m_end) {
          const bool full_tile = full_bits >> (m - chunk_base) & 1u;
          const int m_next = next_visible(m + 1);
          const int m0 = m * kBlockM;
          cp_async_wait<0>();
          if constexpr (Traits::kFp32) {  // each thread rounds what its own copies wrote, before the barrier
            auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(loop_tid());
            round_tile_to_tf32(gmem_thr_copy.partition_D(
                make_tensor(make_smem_ptr(smem_q + stage * Traits::kSizeQdO), typename Traits::SmemLayoutQdO{})));
            round_tile_to_tf32(gmem_thr_copy.partition_D(
                make_tensor(make_smem_ptr(smem_do + stage * Traits::kSizeQdO), typename Traits::SmemLayoutQdO{})));
            if (kv_unrounded) {
              round_tile_to_tf32(gmem_thr_copy.partition_D(sK));
              round_tile_to_tf32(gmem_thr_copy.partition_D(sV));
              kv_unrounded = false;
            }
          }
          __syncthreads();  // Q/dO (and K/V) landed; the previous block's reads of sP/sdS/other stage are done

          // HSTU rab of this thread's (row, column pair)s, as 32-bit pairs (the checker guarantees 4-byte aligned
          // rab rows; column pairs start at even j) copied asynchronously into sP where this thread writes P (it is
          // free since the barrier above): the loads' latency hides behind the S GEMM without holding registers,
          // and since every thread reads back only what it copied, no barrier is needed.
          const bool has_rab = kHstu && p.rab != nullptr;
          if constexpr (kHstu) {
            const int64_t hr = p.rab_heads == 1 ? 0 : hq;
            Tensor tScS_rc = score_coords();                                      // (ROW, COL)
            Tensor tSsP = tiled_mma_sdp.get_thread_slice(loop_tid()).partition_C(sP);  // (MMA, MMA_M, MMA_N)
            const int col0 = get<1>(tScS_rc(0, 0));  // rab and dRab addresses: col0 plus compile-time deltas
            CUTE_UNROLL
            for (int mi = 0; mi < kRows; ++mi) {
              const int i = m0 + get<0>(tScS_rc(mi, 0));
              if (has_rab) {
                const Element* rab_row = static_cast<const Element*>(p.rab) + bi * p.rab_batch_stride +
                                         hr * p.rab_head_stride + (i + mask.off) * p.rab_row_stride + n0 + col0;
                CUTE_UNROLL
                for (int nj = 0; nj < kCols / 2; ++nj) {
                  const int dj = get<1>(tScS_rc(mi, 2 * nj)) - col0;
                  const bool in = i < sq && n0 + col0 + dj < sk;
                  cp_async_4b(in ? rab_row + dj : static_cast<const Element*>(p.rab),
                               &tSsP(acc_rc(mi, 2 * nj)), in);
                }
              }
              // drab_walk: the dRab partial sums of the heads before this one, into L1 while the S and dP GEMMs
              // run (held in registers they would spill). Pairs 2k and 2k + 1 sit in one 16-column group.
              if (drab_walk && kv_i > 0 && i < sq) {
                const float* prev = args.drab_accum + (bi * p.seqlen_k + i + mask.off) * args.drab_ld + n0 + col0;
                CUTE_UNROLL
                for (int nj = 0; nj < kCols / 2; nj += 2) {
                  asm volatile("prefetch.global.L1 [%0];" ::"l"(prev + (get<1>(tScS_rc(mi, 2 * nj)) - col0)));
                }
              }
            }
            if (has_rab) cp_async_fence();
          }
          if (kStages == 2 && m_next < m_end) load_q_do(m_next, stage ^ 1);

          Tensor sQ = make_tensor(make_smem_ptr(smem_q + stage * Traits::kSizeQdO), typename Traits::SmemLayoutQdO{});    // (kBlockM, kHeadDim)
          Tensor sdO = make_tensor(make_smem_ptr(smem_do + stage * Traits::kSizeQdO), typename Traits::SmemLayoutQdO{});  // (kBlockM, kHeadDim)
          Tensor sQt = make_tensor(make_smem_ptr(smem_q + stage * Traits::kSizeQdO), typename Traits::SmemLayoutQdOt{});  // (kHeadDim, kBlockM)
          Tensor sdOt = make_tensor(make_smem_ptr(smem_do + stage * Traits::kSizeQdO), typename Traits::SmemLayoutQdOt{}); // (kHeadDim, kBlockM)
          // LSE and D of this block's rows (0 for rows past sq).
          const float* lse_blk = smem_lse + stage * kBlockM;
          const float* dsum_blk = smem_dsum + stage * kBlockM;

          // S = Q K^T
          Tensor acc_s = partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
          clear(acc_s);
          gemm_ss(tiled_mma_sdp, acc_s, tSrQ, tSrK, sQ, sK, smem_tiled_copy_sdp_a, smem_tiled_copy_sdp_b, step_tid());

          // Softmax P in the MMA input type, stored to sP before the dP GEMM, or where kPInRegisters after it
          // (dS then takes P from here).
          Tensor rP_mma = make_tensor<typename Traits::ElementMma>(acc_s.layout());  // (MMA, MMA_M, MMA_N)

          // P goes to sP; HSTU also parks the dP-independent factor dprob(S_pre) in sdS. The thread that wrote them
          // reads them back to form dS, so no fp32 tile stays live across the dP GEMM next to dK/dV (P kept in
          // registers instead measured 1-4% slower on an H100, d96 and d128; softmax d <= 64 keeps it there on
          // sm_90, kPInRegisters).
          // Masking is a separate pass that only partially visible tiles take.
          Tensor s_rc = make_tensor(acc_s.data(), rowcol(acc_s.layout()));  // (ROW, COL)
          if constexpr (kHstu) {
            if (has_rab) {  // this thread's rab copies (the newest group unless the next Q/dO went out after it)
              if (kStages == 2 && m_next < m_end) {
                cp_async_wait<1>();
              } else {
                cp_async_wait<0>();
              }
            }
            // P is rounded to the input dtype as it is formed, so no second fp32 tile sits next to acc_s.
            Tensor rP = make_tensor<Element>(acc_s.layout());           // (MMA, MMA_M, MMA_N)
            Tensor p_rc = make_tensor(rP.data(), rowcol(rP.layout()));  // (ROW, COL)
            // Two copies of the score pass, with and without rab, so the one without reads nothing per pair.
            auto score_pass = [&](auto with_rab) {
              Tensor tSsP = tiled_mma_sdp.get_thread_slice(loop_tid()).partition_C(sP);  // (MMA, MMA_M, MMA_N)
              CUTE_UNROLL
              for (int mi = 0; mi < kRows; ++mi) {
                CUTE_UNROLL
                for (int nj = 0; nj < kCols / 2; ++nj) {
                  Element rab[2] = {Element(0.0f), Element(0.0f)};
                  if constexpr (decltype(with_rab)::value) {
                    *reinterpret_cast<uint32_t*>(rab) =
                        *reinterpret_cast<const uint32_t*>(&tSsP(acc_rc(mi, 2 * nj)));
                  }
                  CUTE_UNROLL
                  for (int ni = 2 * nj; ni < 2 * nj + 2; ++ni) {
                    float slope;
                    p_rc(mi, ni) =
                        static_cast<Element>(hstu.prob_and_slope(s_rc(mi, ni) + static_cast<float>(rab[ni % 2]), slope));
                    s_rc(mi, ni) = slope;
                  }
                }
              }
            };
            if (has_rab) {
              score_pass(cute::true_type{});
            } else {
              score_pass(cute::false_type{});
            }
            if (!full_tile) {
              Tensor tScS_rc = score_coords();  // (ROW, COL)
              CUTE_UNROLL
              for (int mi = 0; mi < kRows; ++mi) {
                const int4 sp = row_spans(m0 + get<0>(tScS_rc(mi, 0)));
                CUTE_UNROLL
                for (int ni = 0; ni < kCols; ++ni) {
                  const int c = get<1>(tScS_rc(mi, ni));
                  if (!((c >= sp.x && c < sp.y) || (c >= sp.z && c < sp.w))) {
                    p_rc(mi, ni) = static_cast<Element>(0.0f);
                    s_rc(mi, ni) = 0.0f;
                  }
                }
              }
            }
            store_pds(rP, sP);
            store_pds(convert_fragment<Element>(acc_s), sdS);
          } else {
            float row_lse2[kRows];  // LSE * log2(e); +inf for rows that see no key (P = 0 there)
            {
              Tensor tScS_rc = score_coords();  // (ROW, COL)
              CUTE_UNROLL
              for (int mi = 0; mi < kRows; ++mi) row_lse2[mi] = lse_log2(lse_blk[get<0>(tScS_rc(mi, 0))]);
            }
            // The softcap and the mask go first (the mask as -inf, so P = 0 there), each a pass that only its own
            // calls take, and the exponentials after them: the exp pass, P's stores and the dP GEMM are then one
            // branch-free stretch that ptxas interleaves (with the mask pass after the exponentials, the branch
            // between them kept the 64 exponentials of a d 64 step in one burst that waited on the MIO queue). At
            // d 128, where P still goes to shared memory first, the reordering alone measured +3% / +4% (H100 bf16,
            // s 1k / 4k); d 256 +0-1%.
            if (p.softcap > 0.0f) {
              CUTE_UNROLL
              for (int i = 0; i < size(acc_s); ++i) acc_s(i) = softmax_score.apply(acc_s(i)) * kLog2e;
            }
            if (!full_tile) {
              Tensor tScS_rc = score_coords();  // (ROW, COL)
              CUTE_UNROLL
              for (int mi = 0; mi < kRows; ++mi) {
                const int4 sp = row_spans(m0 + get<0>(tScS_rc(mi, 0)));
                CUTE_UNROLL
                for (int ni = 0; ni < kCols; ++ni) {
                  const int c = get<1>(tScS_rc(mi, ni));
                  if (!((c >= sp.x && c < sp.y) || (c >= sp.z && c < sp.w))) s_rc(mi, ni) = -INFINITY;
                }
              }
            }
            const float exp_scale = p.softcap > 0.0f ? 1.0f : scale_log2;  // softcapped scores are in log2 units
            CUTE_UNROLL
            for (int mi = 0; mi < kRows; ++mi) {
              CUTE_UNROLL
              for (int ni = 0; ni < kCols; ++ni) s_rc(mi, ni) = exp2f(fmaf(s_rc(mi, ni), exp_scale, -row_lse2[mi]));
            }
            rP_mma = convert_fragment<typename Traits::ElementMma>(acc_s);
            if constexpr (!kPInRegisters) store_pds(rP_mma, sP);
          }

          // dP = dO V^T
          Tensor acc_dp = partition_fragment_C(tiled_mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
          clear(acc_dp);
          gemm_ss(tiled_mma_sdp, acc_dp, tdPrdO, tdPrV, sdO, sV, smem_tiled_copy_sdp_a, smem_tiled_copy_sdp_b, step_tid());
          if constexpr (kPInRegisters) store_pds(rP_mma, sP);

          // dS, left in acc_dp. Softmax dS omits the factor `scale`, applied to dQ and dK at the end.
          Tensor rX = make_tensor<Element>(acc_dp.layout());  // (MMA, MMA_M, MMA_N): P, or HSTU's dprob(S_pre)
          if constexpr (!kPInRegisters) load_pds(kHstu ? sdS : sP, rX);
          Tensor rX_rc = make_tensor(rX.data(), rowcol(rX.layout()));          // (ROW, COL)
          Tensor rP_rc = make_tensor(rP_mma.data(), rowcol(rP_mma.layout()));  // (ROW, COL)
          auto prob = [&](int mi, int ni) {  // softmax P
            if constexpr (kPInRegisters) {
              return static_cast<float>(rP_rc(mi, ni));
            } else {
              return static_cast<float>(rX_rc(mi, ni));
            }
          };
          Tensor dp_rc = make_tensor(acc_dp.data(), rowcol(acc_dp.layout()));  // (ROW, COL)
          Tensor tScS_rc = score_coords();                                      // (ROW, COL)
          if constexpr (kHstu) {
            CUTE_UNROLL
            for (int e = 0; e < size(acc_dp); ++e) acc_dp(e) *= static_cast<float>(rX(e));
          } else if (p.softcap > 0.0f) {
            // The softcapped score, recovered from P = exp(S - LSE): dS/d(qk) = scale * (1 - (S/c)^2).
            CUTE_UNROLL
            for (int mi = 0; mi < kRows; ++mi) {
              const int row = get<0>(tScS_rc(mi, 0));
              const float lse2 = lse_log2(lse_blk[row]);
              const float dsum = dsum_blk[row];
              CUTE_UNROLL
              for (int ni = 0; ni < kCols; ++ni) {
                const float pr = prob(mi, ni);
                const float t = (log2f(pr) + lse2) / (kLog2e * p.softcap);
                dp_rc(mi, ni) = pr > 0.0f ? pr * (dp_rc(mi, ni) - dsum) * (1.0f - t * t) : 0.0f;
              }
            }
          } else {
            CUTE_UNROLL
            for (int mi = 0; mi < kRows; ++mi) {
              const float dsum = dsum_blk[get<0>(tScS_rc(mi, 0))];
              CUTE_UNROLL
              for (int ni = 0; ni < kCols; ++ni) dp_rc(mi, ni) = prob(mi, ni) * (dp_rc(mi, ni) - dsum);
            }
          }
          if constexpr (kHstu) {
            const int row0 = get<0>(tScS_rc(0, 0)), col0 = get<1>(tScS_rc(0, 0));  // this thread's first element
            if (p.drab != nullptr && !drab_direct && !drab_walk) {
              // Head sum by atomics: one vector reduction per column pair at this thread's first address plus a row
              // and a compile-time column delta; a tile inside sq and sk takes no per-pair tests (padded rows: c + 1
              // is in the buffer).
              float* accum_thr = args.drab_accum + (bi * p.seqlen_k + m0 + row0 + mask.off) * args.drab_ld + n0 + col0;
              auto red_pair = [&](int mi, int nj) {
                red_add_f32x2(accum_thr + (get<0>(tScS_rc(mi, 0)) - row0) * args.drab_ld + (get<1>(tScS_rc(mi, 2 * nj)) - col0),
                              dp_rc(mi, 2 * nj), dp_rc(mi, 2 * nj + 1));
              };
              if (m0 + kBlockM <= sq && n0 + kBlockN <= sk) {
                CUTE_UNROLL
                for (int mi = 0; mi < kRows; ++mi) {
                  CUTE_UNROLL
                  for (int nj = 0; nj < kCols / 2; ++nj) red_pair(mi, nj);
                }
              } else {
                CUTE_UNROLL
                for (int mi = 0; mi < kRows; ++mi) {
                  if (m0 + get<0>(tScS_rc(mi, 0)) >= sq) continue;
                  CUTE_UNROLL
                  for (int nj = 0; nj < kCols / 2; ++nj) {
                    if (n0 + get<1>(tScS_rc(mi, 2 * nj)) < sk) red_pair(mi, nj);
                  }
                }
              }
            } else if (p.drab != nullptr) {  // dRab per head, or the deterministic walk over the heads
              const int64_t hr = p.rab_heads == 1 ? 0 : hq;
              const bool store_drab = drab_direct || kv_i == kv_heads_per_cta - 1;
              CUTE_UNROLL
              for (int mi = 0; mi < kRows; ++mi) {
                const int i = m0 + get<0>(tScS_rc(mi, 0));
                if (i >= sq) continue;
                const int64_t r = i + mask.off;
                Element* drab_row = static_cast<Element*>(p.drab) + bi * p.drab_batch_stride +
                                    hr * p.drab_head_stride + r * p.drab_row_stride + n0 + col0;
                float* drab_accum_row =
                    drab_direct ? nullptr : args.drab_accum + (bi * p.seqlen_k + r) * args.drab_ld + n0 + col0;
                // Columns c and c + 1 (c even) of row r; c + 1 may be the first column past sk.
                CUTE_UNROLL
                for (int nj = 0; nj < kCols / 2; ++nj) {
                  const int dj = get<1>(tScS_rc(mi, 2 * nj)) - col0;
                  if (n0 + col0 + dj >= sk) continue;
                  const bool pair = n0 + col0 + dj + 1 < sk;
                  float2 v = make_float2(dp_rc(mi, 2 * nj), dp_rc(mi, 2 * nj + 1));
                  if (drab_walk && kv_i > 0) {
                    const float2 prev = *reinterpret_cast<const float2*>(drab_accum_row + dj);
                    v = make_float2(prev.x + v.x, prev.y + v.y);
                  }
                  if (store_drab) {
                    drab_row[dj] = static_cast<Element>(v.x);
                    if (pair) drab_row[dj + 1] = static_cast<Element>(v.y);
                  } else {
                    *reinterpret_cast<float2*>(drab_accum_row + dj) = v;  // padded rows: c + 1 is in the buffer
                  }
                }
              }
            }
          }
          Tensor rdS = convert_fragment<typename Traits::ElementMma>(acc_dp);  // (MMA, MMA_M, MMA_N)
          store_pds(rdS, sdS);
          __syncthreads();  // sP and sdS are complete

          // dV += P^T dO, then dQ += dS K and dK += dS^T Q (dK before dQ where Traits::kDkAfterDq is off: the
          // reordering costs spills there). dQ is accumulated in fp32 in the workspace, one column chunk at a
          // time, into this query block's whole tile (DqTiles): each reduction address is this thread's pointer
          // plus a compile-time delta, with no row or column tests.
          gemm_ss(tiled_mma_dkv, acc_dv, tdVrPt, tdVrdOt, sPt, sdOt, smem_tiled_copy_dkv_a, smem_tiled_copy_dkv_b,
                  loop_tid());
          auto gemm_dk = [&](auto const& hook) {
            gemm_ss(tiled_mma_dkv, acc_dk, tdKrdSt, tdKrQt, sdSt, sQt, smem_tiled_copy_dkv_a, smem_tiled_copy_dkv_b,
                    loop_tid(), hook);
            if (kStages == 1 && m_next < m_end) {
              __syncthreads();  // sQ/sdO are free once every warp finished dK and dV
              load_q_do(m_next, 0);
            }
          };
          if constexpr (!Traits::kDkAfterDq) gemm_dk(NoHook{});
          float* dq_thr = head->dq + m * dq_block_stride + step_tid() * kDqRedVec;
          // Reductions of the element groups [g_begin, g_end) of chunk `chunk`. The loop runs over all groups and
          // tests the range, so every fragment index is a constant (looping over [g_begin, g_end) put acc_dq in
          // local memory on sm_80). A visited block never starts past sq: that test is there as a branch, which
          // ends ptxas's scheduling region; without it ptxas hoists the dK GEMM's next ldmatrix loads above the
          // reductions (sm_90a spill stores: softmax d256 32 bytes, HSTU d128 8; without spills at d64/d128 softmax
          // it measured 1-3% slower on an H100).
          auto reduce_dq = [&](auto const& acc_dq, int chunk, int g_begin, int g_end) {
            if (m0 >= sq) return;
            CUTE_UNROLL
            for (int g = 0; g < kDqGroups; ++g) {
              if (g < g_begin || g >= g_end) continue;
              red_add_dq(dq_thr + chunk * DqLayout::kChunkElems + g * Traits::kNThreads * kDqRedVec, acc_dq,
                         g * kDqRedVec);
            }
          };
          CUTE_UNROLL
          for (int chunk = 0; chunk < Traits::kDqChunks; ++chunk) {
            Tensor sKt_chunk = local_tile(sKt, Shape<Int<kDqCols>, Int<kBlockN>>{}, make_coord(chunk, 0));  // (kDqCols, kBlockN)
            Tensor acc_dq = partition_fragment_C(tiled_mma_dq, Shape<Int<kBlockM>, Int<kDqCols>>{});  // (MMA, MMA_M, MMA_D)
            clear(acc_dq);
            gemm_ss(tiled_mma_dq, acc_dq, tdQrdS, tdQrKt, sdS, sKt_chunk, smem_tiled_copy_dq_a, smem_tiled_copy_dq_b,
                    loop_tid());
            if (Traits::kDkAfterDq && Traits::kDqRedSteps > 0 && chunk == Traits::kDqChunks - 1) {
              // The last chunk's reductions go out during the dK GEMM, kDqRedSteps k-slices of it taking a share
              // each: issued all at once they stall its first ldmatrix, which reuses their source registers.
              constexpr int kSteps = Traits::kDqRedSteps > 0 ? Traits::kDqRedSteps : 1;
              constexpr int kPerStep = (kDqGroups + kSteps - 1) / kSteps;
              gemm_dk([&](int k) {
                if (k < kSteps) reduce_dq(acc_dq, chunk, kPerStep * k, cute::min(kPerStep * (k + 1), kDqGroups));
              });
            } else {
              reduce_dq(acc_dq, chunk, 0, kDqGroups);
            }
          }
          if constexpr (Traits::kDkAfterDq && Traits::kDqRedSteps == 0) gemm_dk(NoHook{});

          m = m_next;
          if (kStages == 2) stage ^= 1;
        }
      }
      cp_async_wait<0>();  // a key block no query block sees still has its K/V loads in flight

      const float dk_scale = kHstu ? 1.0f : p.scale;
      if constexpr (Traits::kSmemEpilogue) {
        // dK (times the softmax scale) and dV in the input dtype through shared memory (see the traits), from a
        // fresh opaque thread index (nothing of it is kept across the loops).
        const int epi_tid = thread_index<true>();
        Tensor rdK = make_tensor<Element>(acc_dk.layout());  // (MMA, MMA_N, MMA_D)
        CUTE_UNROLL
        for (int e = 0; e < size(acc_dk); ++e) rdK(e) = static_cast<Element>(acc_dk(e) * dk_scale);
        Tensor rdV = convert_fragment<Element>(acc_dv);  // (MMA, MMA_N, MMA_D)
        Tensor sdK = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutKV{});                   // (kBlockN, kHeadDim)
        Tensor sdV = make_tensor(make_smem_ptr(smem_q + Traits::kSizeKV), typename Traits::SmemLayoutKV{});  // (kBlockN, kHeadDim)
        auto smem_tiled_copy_dkv = make_tiled_copy_C(typename Traits::SmemCopyAtomdKV{}, tiled_mma_dkv);
        auto smem_thr_copy_dkv = smem_tiled_copy_dkv.get_thread_slice(epi_tid);
        __syncthreads();  // every warp is done reading sQ / sdO
        copy(smem_tiled_copy_dkv, smem_thr_copy_dkv.retile_S(rdK), smem_thr_copy_dkv.partition_D(sdK));
        copy(smem_tiled_copy_dkv, smem_thr_copy_dkv.retile_S(rdV), smem_thr_copy_dkv.partition_D(sdV));
        __syncthreads();
        typename Traits::GmemTiledCopyStore gmem_tiled_copy_store;
        auto gmem_thr_copy_store = gmem_tiled_copy_store.get_thread_slice(epi_tid);
        Tensor tKVcKV = gmem_thr_copy_store.partition_D(cK);  // (CPY, CPY_N, CPY_D)
        auto store = [&](auto const& sX, RowMajorView const& view, int cols) {
          Tensor gX = make_tensor(make_gmem_ptr(static_cast<Element*>(view.ptr) + seq.k_offset(view, bi, n0, hk)),
                                  Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(view.row_stride, _1{}));  // (kBlockN, kHeadDim)
          Tensor tXgX = gmem_thr_copy_store.partition_D(gX);      // (CPY, CPY_N, CPY_D)
          Tensor tXrX = make_tensor<Element>(shape(tXgX));         // (CPY, CPY_N, CPY_D)
          copy(gmem_tiled_copy_store, gmem_thr_copy_store.partition_S(sX), tXrX);
          sm80::copy_tile_store_predicated(gmem_tiled_copy_store, tXrX, tXgX, tKVcKV, sk - n0, cols);
        };
        store(sdK, p.dk, d);
        store(sdV, p.dv, dv);
      } else {
        // fp32: dK (times the softmax scale) and dV straight from the accumulators, consecutive column pairs as one
        // store.
        using Pair = uint_bit_t<2 * sizeof_bits_v<Element>>;
        // As for dQ: this thread's first element plus compile-time deltas. The coordinates come from an opaque
        // index, so that none of them (nor the column tests) is computed before the loops and kept across them.
        Tensor tdKVcdKV = tiled_mma_dkv.get_thread_slice(thread_index<true>()).partition_C(cK);  // (MMA, MMA_N, MMA_D)
        const int kv_r0 = get<0>(tdKVcdKV(0)), kv_c0 = get<1>(tdKVcdKV(0));
        Element* dk_thr = static_cast<Element*>(p.dk.ptr) + seq.k_offset(p.dk, bi, n0 + kv_r0, hk) + kv_c0;
        Element* dv_thr = static_cast<Element*>(p.dv.ptr) + seq.k_offset(p.dv, bi, n0 + kv_r0, hk) + kv_c0;
        CUTE_UNROLL
        for (int e = 0; e < size(acc_dk); e += 2) {
          const int r = get<0>(tdKVcdKV(e)), c = get<1>(tdKVcdKV(e));
          if (n0 + r >= sk) continue;
          if (c < d) {
            Element pair[2] = {static_cast<Element>(acc_dk(e) * dk_scale), static_cast<Element>(acc_dk(e + 1) * dk_scale)};
            *reinterpret_cast<Pair*>(dk_thr + (r - kv_r0) * p.dk.row_stride + (c - kv_c0)) = *reinterpret_cast<Pair*>(pair);
          }
          if (c < dv) {
            Element pair[2] = {static_cast<Element>(acc_dv(e)), static_cast<Element>(acc_dv(e + 1))};
            *reinterpret_cast<Pair*>(dv_thr + (r - kv_r0) * p.dv.row_stride + (c - kv_c0)) = *reinterpret_cast<Pair*>(pair);
          }
        }
      }
    }
  }
}

}  // namespace cuteattn::detail::sm80_bwd
