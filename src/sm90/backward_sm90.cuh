// Entry point of the sm90 backward family (what the generated instances instantiate): which problems an
// instance serves, the workspace it needs, and the launch sequence
//   softmax: D = rowsum(dO * O) -> main dK/dV/dQ kernel (backward_kernel_sm90.cuh) -> dQ conversion;
//   HSTU:    [dRab zero-fill | zeroing the visible part of the dRab accumulator] -> main kernel -> dQ conversion
//            [and the head sum of dRab],
// the small kernels being the sm80 backward's (sm80/backward_aux_sm80.cuh).
// Workspace: the fp32 dQ accumulator (total_q, h, kHeadDim) and its tiles' state words (sm90/dq_tiles_sm90.cuh; the
// d 256 kernel zero-fills the accumulator instead), D (softmax, indexed like LSE), and for HSTU with one
// rab head shared by several query heads either each head's dRab tiles (b, h, max_sk, max_sk rounded to 8), summed
// after the main kernel, or (more than kMaxStagedDrabHeads heads) an fp32 (b, max_sk, max_sk rounded to even) dRab
// accumulator that the main kernel adds into.
// fp16/bf16, d == d_v; buckets d 64 and d 128 (softmax and HSTU) and d 256 (softmax); everything else
// (deterministic mode, d != d_v, other buckets) is refused here and runs on the sm80 backward (dispatch falls
// back when `supports` refuses).
#pragma once

#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <cute/tensor.hpp>

#include "core/device_properties.h"
#include "core/params.h"
#include "cuteattn/attention.h"
#include "sm80/backward_aux_sm80.cuh"
#include "sm90/backward_kernel_sm90.cuh"
#include "sm90/backward_traits_sm90.cuh"
#include "sm90/dq_tiles_sm90.cuh"
#include "sm90/hstu_sm90.cuh"

namespace cuteattn::detail {

template <ScoreFunction kScore, DType kDType, int kHeadDim>
struct Sm90Backward {
  static constexpr bool kHstu = kScore == ScoreFunction::kHstuSilu;
  static_assert(kScore == ScoreFunction::kSoftmax || kHstu);
  using Traits = sm90::BackwardTraitsSm90<kDType, kHeadDim, kHstu>;
  using Element = typename Traits::Element;

  // dRab of one rab head shared by several query heads: each head's tiles staged in the workspace (16-bit, stored
  // by TMA like a per-head dRab) and summed after the main kernel (sm80_bwd::sum_drab_heads_kernel), up to this
  // many heads; above, where h 16-bit copies outgrow twice the one fp32 accumulator, the main kernel adds into that
  // with atomics. H100, HSTU backward with one rab head for 4 (bf16, d 128, jagged): the staged tiles made the
  // backward 1.4x (max_sk 1k) to 2.1x (8k) as fast as the atomics. (The sm80 backward keeps its atomics: with
  // per-head tiles its d 256 HSTU backward measured 4% slower.)
  static constexpr int64_t kMaxStagedDrabHeads = 4;

  struct Plan {
    size_t dq_offset = 0, dq_elems = 0, states_offset = 0, states = 0, dsum_offset = 0, drab_offset = 0, total = 0;
    int64_t drab_ld = 0;
    // One rab head, several query heads: dRab summed over heads after the main kernel from per-head tiles, or
    // (more heads) by the main kernel's fp32 atomics.
    bool drab_staged = false, drab_accum = false;
    bool dq_tracked = false;  // the dQ tiles' first contributions store: no zero-fill of the accumulator
  };
  static size_t align_up(size_t x) { return (x + 255) / 256 * 256; }
  static Plan plan(const Params& p) {
    Plan pl;
    pl.dq_elems = size_t(p.total_q) * size_t(p.heads) * kHeadDim;
    pl.states_offset = align_up(pl.dq_elems * sizeof(float));
    // Tile states where the key blocks reach the query blocks one after the other (sm90/dq_tiles_sm90.cuh): masks
    // bounded on the right, or (Traits::kRotatedSteps) at least as many query blocks as key-block diagonals, each
    // key block starting at its own.
    pl.dq_tracked = !Traits::kdQAtomic && (p.window_right >= 0 || (Traits::kRotatedSteps && p.seqlen_q >= p.seqlen_k));
    pl.states = pl.dq_tracked ? size_t(sm90::DqTileStates::count<Traits::kBlockM>(p.total_q, p.batch, p.heads)) : 0;
    pl.dsum_offset = align_up(pl.states_offset + pl.states * sizeof(uint32_t));
    pl.drab_offset = kHstu ? pl.dsum_offset
                           : align_up(pl.dsum_offset + size_t(p.heads) * size_t(p.total_q) * sizeof(float));
    const bool shared_rab = kHstu && p.drab != nullptr && p.rab_heads == 1 && p.heads > 1;
    pl.drab_staged = shared_rab && p.heads <= kMaxStagedDrabHeads;
    pl.drab_accum = shared_rab && !pl.drab_staged;
    // Rows of 16-byte multiples: the staged tiles' TMA stores, the main kernel's 4-key reductions into the sums.
    pl.drab_ld = pl.drab_staged ? (p.seqlen_k + 7) / 8 * 8 : (p.seqlen_k + 3) / 4 * 4;
    pl.total = pl.drab_offset;
    const size_t drab_elems = size_t(p.batch) * size_t(p.seqlen_k) * size_t(pl.drab_ld);  // per head
    if (pl.drab_staged) pl.total = align_up(pl.total + drab_elems * size_t(p.heads) * sizeof(Element));
    if (pl.drab_accum) pl.total = align_up(pl.total + drab_elems * sizeof(float));
    return pl;
  }

  static Status supports(const Params& p) {
    auto refuse = [](const char* why) {
      return Status::NotSupported(std::string("sm90 backward (") + (kHstu ? "hstu" : "softmax") + ", head dim " +
                                  std::to_string(kHeadDim) + "): " + why);
    };
    if (p.score != kScore) return refuse("score function mismatch");
    if (p.dtype != kDType) return refuse("dtype mismatch");
    if (p.deterministic) return refuse("no deterministic mode (the sm80 backward serves deterministic calls)");
    if (p.head_dim != p.head_dim_v) return refuse("needs d == d_v (the sm80 backward serves d != d_v)");
    if (p.head_dim > kHeadDim || p.head_dim % 8 != 0) return refuse("needs d <= bucket and d % 8 == 0");
    if (!kHstu && !(p.scale > 0.0f)) return refuse("needs softmax_scale > 0");
    if (!kHstu && (p.num_contexts != nullptr || p.num_targets != nullptr))
      return refuse("contextual/target masks are HSTU only");
    // TMA descriptors need a non-empty Q; without query rows the sm80 backward writes the zero dK and dV.
    if (p.total_q == 0) return refuse("no query rows");
    const int64_t rows_q = p.varlen ? p.total_q : p.seqlen_q;
    const int64_t rows_k = p.varlen ? p.total_k : p.seqlen_k;
    if (rows_q >= (int64_t(1) << 31) || rows_k >= (int64_t(1) << 31) || p.heads >= (int64_t(1) << 31))
      return refuse("sizes beyond 32-bit TMA coordinates");
    if (p.batch > 65535 || p.heads_k > 65535) return refuse("batch or kv heads above 65535");
    if ((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM * p.heads >= (int64_t(1) << 31))
      return refuse("query blocks x heads beyond a grid dimension");
    // TMA loads and 16-byte vector accesses: 16-byte aligned base and 16-byte multiple strides.
    auto aligned = [](const RowMajorView& t) {
      constexpr int64_t kVec = 16 / sizeof(Element);
      return reinterpret_cast<uintptr_t>(t.ptr) % 16 == 0 && t.row_stride % kVec == 0 && t.head_stride % kVec == 0 &&
             t.batch_stride % kVec == 0;
    };
    for (const RowMajorView* t : {&p.q, &p.k, &p.v, &p.dout, &p.dk, &p.dv})
      if (!aligned(*t)) return refuse("needs 16-byte aligned pointers and strides");
    if (!kHstu && !aligned(p.o)) return refuse("needs 16-byte aligned pointers and strides");
    if (kHstu) {
      if (const char* why = sm90::hstu_tma_refusal<Element>(p)) return refuse(why);
    }
    if (DeviceProperties::of(p.device_index).smem_optin < Traits::kSmemBytes)
      return refuse("the device has too little shared memory");
    return Status::Ok();
  }

  static size_t workspace_bytes(const Params& p) { return plan(p).total; }

  static Status launch(const Params& p, void* workspace) {
    using namespace cute;
    Status s = supports(p);
    if (!s.ok()) return s;
    const Plan pl = plan(p);
    auto stream = static_cast<cudaStream_t>(p.stream);
    char* ws = static_cast<char*>(workspace);
    float* dq_accum = reinterpret_cast<float*>(ws + pl.dq_offset);
    auto* dq_states = pl.dq_tracked ? reinterpret_cast<uint32_t*>(ws + pl.states_offset) : nullptr;
    float* dsum = reinterpret_cast<float*>(ws + pl.dsum_offset);
    auto fail = [](const char* what, cudaError_t err) {
      return Status{StatusCode::kCudaError, std::string("sm90 backward: ") + what + ": " + cudaGetErrorString(err)};
    };

    const int kAuxThreads = 256;
    auto aux_blocks = [](int64_t work) { return int(std::clamp<int64_t>((work + 255) / 256, 1, 8192)); };
    float* drab_accum = pl.drab_accum ? reinterpret_cast<float*>(ws + pl.drab_offset) : nullptr;
    Element* drab_staged = pl.drab_staged ? reinterpret_cast<Element*>(ws + pl.drab_offset) : nullptr;
    if (p.total_q > 0) {
      if (pl.dq_tracked) {
        sm90::prepare_dq_tiles_kernel<kHeadDim, Traits::kBlockM>
            <<<unsigned(p.batch), kAuxThreads, 0, stream>>>(p, dq_accum, dq_states);
      } else {
        const cudaError_t err = cudaMemsetAsync(dq_accum, 0, pl.dq_elems * sizeof(float), stream);
        if (err != cudaSuccess) return fail("cudaMemsetAsync", err);
      }
      if constexpr (!kHstu) {
        sm80_bwd::dot_do_o_kernel<Element, kHeadDim>
            <<<aux_blocks(p.total_q * p.heads * kHeadDim / 8), kAuxThreads, 0, stream>>>(p, dsum);
      }
    }
    // dRab passes: over the (row, rab head, batch entry) rows of dRab (drab_rows_grid). The main kernel writes
    // (h_rab == h) or sums into (h_rab == 1 < h, accumulator) only the tiles some query block sees; the rest is
    // zero. Staged per-head tiles need no pass before: the head sum writes every element of dRab.
    const dim3 drab_grid = sm80_bwd::drab_rows_grid(p, p.rab_heads);
    const bool drab_rows = kHstu && p.drab != nullptr && p.seqlen_k > 0 && p.batch > 0;
    if (drab_rows && pl.drab_accum) {
      sm80_bwd::zero_drab_accum_kernel<<<sm80_bwd::drab_rows_grid(p, 1), sm80_bwd::kDrabThreads, 0, stream>>>(
          p, drab_accum, pl.drab_ld);
    } else if (drab_rows && !pl.drab_staged) {
      const int64_t sk2 = p.seqlen_k * p.seqlen_k;
      const bool dense = p.drab_row_stride == p.seqlen_k && p.drab_head_stride == sk2 &&
                         p.drab_batch_stride == p.rab_heads * sk2;
      if (dense) {
        const size_t bytes = size_t(p.batch * p.rab_heads * sk2) * sizeof(Element);
        const cudaError_t err = cudaMemsetAsync(p.drab, 0, bytes, stream);
        if (err != cudaSuccess) return fail("cudaMemsetAsync", err);
      } else {
        sm80_bwd::write_drab_kernel<Element><<<drab_grid, sm80_bwd::kDrabThreads, 0, stream>>>(p, nullptr, 0);
      }
    }

    const int n_blocks = int((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN);
    if (n_blocks > 0 && p.batch > 0 && p.heads_k > 0) {
      const int rows_q = int(p.varlen ? p.total_q : p.seqlen_q);
      const int rows_k = int(p.varlen ? p.total_k : p.seqlen_k);
      const int batches = p.varlen ? 1 : int(p.batch);
      // A stride of an extent-1 mode is never used; TMA still wants it 16-byte aligned.
      auto stride_of = [](int64_t extent, int64_t stride, int64_t fallback) { return extent == 1 ? fallback : stride; };
      auto make_view = [&](const RowMajorView& t, int rows, int64_t heads) {
        const int64_t big = int64_t(rows) * t.row_stride;
        return cute::make_tensor(make_gmem_ptr(static_cast<Element const*>(t.ptr)),
                                 make_shape(rows, int(p.head_dim), int(heads), batches),
                                 make_stride(t.row_stride, _1{}, stride_of(heads, t.head_stride, big),
                                             stride_of(batches, t.batch_stride, big)));
      };
      auto tile_q = Shape<Int<Traits::kBlockM>, Int<kHeadDim>>{};
      auto tile_k = Shape<Int<Traits::kBlockN>, Int<kHeadDim>>{};
      auto smem_q = take<0, 2>(typename Traits::SmemLayoutQ{});
      auto dq_view = cute::make_tensor(make_gmem_ptr(dq_accum), make_shape(int(p.total_q), kHeadDim, int(p.heads)),
                                       make_stride(p.heads * kHeadDim, _1{}, int64_t(kHeadDim)));
      // The dQ reduce-add and store by TMA; unused descriptors (`none`) where dQ leaves by reductions from the
      // registers (kdQAtomic).
      auto make_dq_tma = [&](auto op, auto none) {
        if constexpr (Traits::kdQAtomic) {
          return none;
        } else {
          return make_tma_copy(op, dq_view, take<0, 2>(typename Traits::SmemLayoutdQ{}),
                               Shape<Int<Traits::kBlockM>, Int<Traits::kdQCols>>{}, _1{});
        }
      };
      sm90::BackwardKernelParams<Traits> kp{
          make_tma_copy(SM90_TMA_LOAD{}, make_view(p.q, rows_q, p.heads), smem_q, tile_q, _1{}),
          make_tma_copy(SM90_TMA_LOAD{}, make_view(p.dout, rows_q, p.heads), smem_q, tile_q, _1{}),
          make_tma_copy(SM90_TMA_LOAD{}, make_view(p.k, rows_k, p.heads_k), typename Traits::SmemLayoutK{}, tile_k,
                        _1{}),
          make_tma_copy(SM90_TMA_LOAD{}, make_view(p.v, rows_k, p.heads_k), typename Traits::SmemLayoutV{}, tile_k,
                        _1{}),
          make_dq_tma(SM90_TMA_REDUCE_ADD{}, typename Traits::TmadQ{}),
          make_dq_tma(SM90_TMA_STORE{}, typename Traits::TmadQStore{}),
          dq_view.shape(),
          make_shape(rows_q, int(p.head_dim), int(p.heads), batches),
          make_shape(rows_k, int(p.head_dim), int(p.heads_k), batches),
          p,
          dsum,
          int(p.heads / p.heads_k),
          float(p.softcap > 0.0f ? p.softcap : p.scale) * float(M_LOG2E),
          p.softcap > 0.0f ? p.scale / p.softcap : 0.0f,
          {},
          {},
          {},
          {},
          drab_accum,
          pl.drab_ld,
          dq_accum,
          dq_states};
      if constexpr (kHstu) {
        if (p.rab != nullptr) {
          const int max_sk = int(p.seqlen_k);
          const int64_t big = int64_t(max_sk) * p.rab_row_stride;
          auto rab = cute::make_tensor(
              make_gmem_ptr(static_cast<Element const*>(p.rab)),
              make_shape(max_sk, max_sk, int(p.rab_heads), int(p.batch)),
              make_stride(p.rab_row_stride, _1{}, stride_of(p.rab_heads, p.rab_head_stride, big),
                          stride_of(p.batch, p.rab_batch_stride, big)));
          kp.tma_rab = make_tma_copy(SM90_TMA_LOAD{}, rab, take<0, 2>(typename Traits::SmemLayoutdS{}),
                                     Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>{}, _1{});
          kp.shape_rab = rab.shape();
          auto make_drab_tma = [&](auto const& drab) {
            kp.tma_drab = make_tma_copy(SM90_TMA_STORE{}, drab, take<0, 2>(typename Traits::SmemLayoutdS{}),
                                        Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>{}, _1{});
            kp.shape_drab = drab.shape();
          };
          if (pl.drab_staged) {  // (max_sk, max_sk, h, b) tiles of the workspace, one per query head
            const int64_t head_elems = int64_t(max_sk) * pl.drab_ld;
            make_drab_tma(cute::make_tensor(make_gmem_ptr(drab_staged),
                                            make_shape(max_sk, max_sk, int(p.heads), int(p.batch)),
                                            make_stride(pl.drab_ld, _1{}, head_elems, p.heads * head_elems)));
          } else if (p.drab != nullptr && !pl.drab_accum) {
            const int64_t dbig = int64_t(max_sk) * p.drab_row_stride;
            make_drab_tma(cute::make_tensor(
                make_gmem_ptr(static_cast<Element*>(p.drab)),
                make_shape(max_sk, max_sk, int(p.rab_heads), int(p.batch)),
                make_stride(p.drab_row_stride, _1{}, stride_of(p.rab_heads, p.drab_head_stride, dbig),
                            stride_of(p.batch, p.drab_batch_stride, dbig))));
          }
        }
      }
      auto kernel = sm90::backward_kernel_sm90<Traits>;
      cudaError_t err = opt_in_shared_memory<Traits>(kernel, Traits::kSmemBytes, p.device_index);
      if (err != cudaSuccess) return fail("cudaFuncSetAttribute", err);
      kernel<<<dim3(unsigned(n_blocks), unsigned(p.heads_k), unsigned(p.batch)), Traits::kNumThreads,
               Traits::kSmemBytes, stream>>>(kp);
    }

    if (p.total_q > 0 && Traits::kdQAtomic) {
      // The d 256 kernel adds dQ from its registers in logical order into the zeroed accumulator.
      sm80_bwd::convert_dq_rows_kernel<Element, kHeadDim>
          <<<aux_blocks(p.total_q * p.heads * (kHeadDim / 4)), kAuxThreads, 0, stream>>>(p, dq_accum, p.scale);
    } else if (p.total_q > 0) {
      const int64_t m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
      sm90::convert_dq_tiles_kernel<Element, kHeadDim, Traits::kBlockM, sm90::dQWorkspaceColumns>
          <<<dim3(unsigned(m_blocks * p.heads), unsigned(p.batch)), sm90::kConvertThreads, 0, stream>>>(
              p, dq_accum, dq_states, kHstu ? 1.0f : p.scale);
    }
    if (drab_rows && pl.drab_staged) {
      sm80_bwd::sum_drab_heads_kernel<Element>
          <<<sm80_bwd::drab_rows_grid(p, 1, sm80_bwd::kDrabSumWidth), sm80_bwd::kDrabThreads, 0, stream>>>(
              p, drab_staged, pl.drab_ld);
    }
    if (drab_rows && pl.drab_accum) {
      sm80_bwd::write_drab_kernel<Element><<<drab_grid, sm80_bwd::kDrabThreads, 0, stream>>>(p, drab_accum, pl.drab_ld);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return fail("launch", err);
    return Status::Ok();
  }
};

}  // namespace cuteattn::detail
