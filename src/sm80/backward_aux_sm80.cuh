// The small kernels around the sm80 backward main loop: D = rowsum(dO * O) before it (softmax), zero-filling
// dRab or the visible part of its fp32 head-sum accumulator before it (HSTU), and after it the fp32 -> dtype
// conversions of dQ (from the sm80 kernel's thread-ordered tiles, summing the deterministic partials in a fixed
// order; or from the sm90 backward's row-major accumulator) and of the head-summed dRab (from the fp32
// accumulator, or from the sm90 kernel's per-head tiles).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>

#include "core/params.h"
#include "sm80/backward_utils_sm80.cuh"
#include "sm80/utils_sm80.cuh"
#include "variants/mask.h"
#include "variants/sequence.h"

namespace cuteattn::detail::sm80_bwd {

// dO as the main kernel's dP = dO V^T MMAs see it: fp32 is rounded to tf32 there, so D = dO . O must use the same
// rounded dO. Otherwise D and the row sum of P * dP differ by dO's rounding error times O, and dS = P (dP - D)
// carries that error even where it is exactly 0 (a row with one visible key).
template <class Element>
__device__ __forceinline__ float dout_operand(Element x) {
  if constexpr (std::is_same_v<Element, float>) {
    return ::cuteattn::sm80::round_to_tf32(x);
  } else {
    return static_cast<float>(x);
  }
}

// D = sum_c dO[c] * O[c] in fp32 per (query row, head), stored at the row's LSE index. A group of kGroup
// threads (a power of two) takes one (row, head), 16 bytes of O and dO per thread and step (fp32 rows above 128
// columns take two steps); the loop runs per warp so every lane reaches the shuffles.
template <class Element, int kHeadDim>
__global__ void dot_do_o_kernel(const __grid_constant__ Params p, float* dsum) {
  constexpr int kVec = 16 / int(sizeof(Element));
  constexpr int kChunks = kHeadDim / kVec;
  constexpr int kGroup = kChunks <= 4 ? 4 : kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
  constexpr int kGroupsPerWarp = 32 / kGroup;
  const int lane = threadIdx.x % 32;
  const int c = lane % kGroup * kVec;
  const int64_t rows = p.total_q * p.heads;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t wp = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; wp * kGroupsPerWarp < rows;
       wp += warps) {
    const int64_t w = wp * kGroupsPerWarp + lane / kGroup;  // (global query row, head), row-major
    const int64_t g = w / p.heads;
    const int64_t h = w % p.heads;
    int64_t bi = 0, row = g;
    if (!p.varlen) {
      bi = g / p.seqlen_q;
      row = g % p.seqlen_q;
    }
    float acc = 0.0f;
    for (int cc = c; cc < kHeadDim; cc += kGroup * kVec) {
      if (w < rows && cc < p.head_dim_v) {
        const Element* o = static_cast<const Element*>(p.o.ptr) + bi * p.o.batch_stride + row * p.o.row_stride +
                           h * p.o.head_stride + cc;
        const Element* d_o = static_cast<const Element*>(p.dout.ptr) + bi * p.dout.batch_stride +
                             row * p.dout.row_stride + h * p.dout.head_stride + cc;
        const uint4 ov = *reinterpret_cast<const uint4*>(o);
        const uint4 dv = *reinterpret_cast<const uint4*>(d_o);
        const Element* oe = reinterpret_cast<const Element*>(&ov);
        const Element* de = reinterpret_cast<const Element*>(&dv);
        for (int k = 0; k < kVec; ++k) acc += static_cast<float>(oe[k]) * dout_operand(de[k]);
      }
    }
    for (int s = kGroup / 2; s > 0; s /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    if (w < rows && lane % kGroup == 0) {
      dsum[p.varlen ? h * p.total_q + g : (bi * p.heads + h) * p.seqlen_q + row] = acc;
    }
  }
}

// dQ of query block blockIdx.x, head blockIdx.y, batch entry blockIdx.z from the sm80 backward's workspace
// (DqTiles): scale * the sum of the nsplit partials, in split order. Each thread reads the fragment elements
// the main kernel's thread of the same index reduced (coalesced), and places them by the dQ MMA's partition in
// a shared-memory tile (rows padded by 16 bytes against bank conflicts), which goes out in 16-byte row pieces.
template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads) convert_dq_tiles_kernel(const __grid_constant__ Params p,
                                                                             const float* dq_accum,
                                                                             int64_t split_stride, int nsplit,
                                                                             float scale) {
  using Element = typename Traits::Element;
  using Layout = DqTiles<Traits>;
  constexpr int kBlockM = Traits::kBlockM, kHeadDim = Traits::kHeadDim;
  constexpr int kDqCols = kHeadDim / Traits::kDqChunks;
  constexpr int kVec = 16 / int(sizeof(Element));
  constexpr int kLd = kHeadDim + kVec;  // shared-memory row stride in elements
  __shared__ alignas(16) Element tile[kBlockM * kLd];

  const int64_t bi = blockIdx.z, h = blockIdx.y;
  const int m = blockIdx.x, tid = threadIdx.x;
  const SequenceInfo seq = SequenceInfo::of(p, bi);
  const int rows = int(cute::min(seq.sq - int64_t(m) * kBlockM, int64_t(kBlockM)));
  if (rows <= 0) return;
  const int64_t row0 = seq.first_q_row(p, bi);
  const float* src = dq_accum + (Layout::first_tile(p, bi, row0) + int64_t(m) * p.heads + h) * Layout::kTileElems +
                     tid * kDqRedVec;

  typename Traits::TiledMmadQ tiled_mma_dq;
  auto cdQ = cute::make_identity_tensor(cute::Shape<cute::Int<kBlockM>, cute::Int<kDqCols>>{});
  auto tdQcdQ = tiled_mma_dq.get_thread_slice(tid).partition_C(cdQ);  // (MMA, MMA_M, MMA_D) -> (row, col)
  CUTE_UNROLL
  for (int chunk = 0; chunk < Traits::kDqChunks; ++chunk) {
    float v[Layout::kPerThread];
    CUTE_UNROLL
    for (int g = 0; g < Layout::kPerThread / kDqRedVec; ++g) {
      const float* at = src + chunk * Layout::kChunkElems + g * Traits::kNThreads * kDqRedVec;
      CUTE_UNROLL
      for (int i = 0; i < kDqRedVec; ++i) v[g * kDqRedVec + i] = 0.0f;
      for (int s = 0; s < nsplit; ++s) {
        float part[kDqRedVec];
        if constexpr (kDqRedVec == 4) {
          *reinterpret_cast<float4*>(part) = *reinterpret_cast<const float4*>(at + s * split_stride);
        } else {
          part[0] = at[s * split_stride];
        }
        CUTE_UNROLL
        for (int i = 0; i < kDqRedVec; ++i) v[g * kDqRedVec + i] += part[i];
      }
    }
    // Fragment elements 2k and 2k + 1 are columns c and c + 1 of one row.
    using Pair = cute::uint_bit_t<2 * cute::sizeof_bits_v<Element>>;
    CUTE_UNROLL
    for (int e = 0; e < Layout::kPerThread; e += 2) {
      const int r = cute::get<0>(tdQcdQ(e)), c = chunk * kDqCols + cute::get<1>(tdQcdQ(e));
      Element pair[2] = {static_cast<Element>(v[e] * scale), static_cast<Element>(v[e + 1] * scale)};
      *reinterpret_cast<Pair*>(&tile[r * kLd + c]) = *reinterpret_cast<const Pair*>(pair);
    }
  }
  __syncthreads();

  Element* dst = static_cast<Element*>(p.dq.ptr) + seq.q_offset(p.dq, bi, int64_t(m) * kBlockM, h);
  const int d = int(p.head_dim);
  const bool vectors = reinterpret_cast<uintptr_t>(p.dq.ptr) % 16 == 0 && p.dq.row_stride % kVec == 0 &&
                       p.dq.head_stride % kVec == 0 && p.dq.batch_stride % kVec == 0;
  constexpr int kPieces = kHeadDim / kVec;  // 16-byte pieces per row
  for (int i = tid; i < kBlockM * kPieces; i += Traits::kNThreads) {
    const int r = i / kPieces, c = i % kPieces * kVec;
    if (r >= rows || c >= d) continue;  // d is a multiple of kVec
    Element* out = dst + r * p.dq.row_stride + c;
    if (vectors) {
      *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(&tile[r * kLd + c]);
    } else {
      for (int k = 0; k < kVec; ++k) out[k] = tile[r * kLd + c + k];
    }
  }
}

// The sm90 d 256 backward's row-major accumulator (total_q, heads, kHeadDim), zero-filled and added into from the
// registers in logical column order: dq[g, h, c] = scale * dq_accum[g, h, c]. A thread converts 4 consecutive
// columns of one (row, head). (The other sm90 backward kernels convert through sm90/dq_tiles_sm90.cuh.)
template <class Element, int kHeadDim>
__global__ void convert_dq_rows_kernel(const __grid_constant__ Params p, const float* dq_accum, float scale) {
  constexpr int kVec = 4;
  constexpr int kThreadsPerRow = kHeadDim / kVec;
  if (threadIdx.x >= blockDim.x / kThreadsPerRow * kThreadsPerRow) return;
  const int c = threadIdx.x % kThreadsPerRow * kVec;
  const int64_t rows = p.total_q * p.heads;
  const int64_t rows_per_step = int64_t(gridDim.x) * (blockDim.x / kThreadsPerRow);
  for (int64_t w = int64_t(blockIdx.x) * (blockDim.x / kThreadsPerRow) + threadIdx.x / kThreadsPerRow; w < rows;
       w += rows_per_step) {
    if (c >= p.head_dim) continue;
    const float4 acc = *reinterpret_cast<const float4*>(dq_accum + w * kHeadDim + c);
    const int64_t g = w / p.heads, h = w % p.heads;  // global query row, head
    int64_t bi = 0, row = g;
    if (!p.varlen) {
      bi = g / p.seqlen_q;
      row = g % p.seqlen_q;
    }
    Element* dst = static_cast<Element*>(p.dq.ptr) + bi * p.dq.batch_stride + row * p.dq.row_stride +
                   h * p.dq.head_stride + c;
    dst[0] = static_cast<Element>(acc.x * scale);
    dst[1] = static_cast<Element>(acc.y * scale);
    dst[2] = static_cast<Element>(acc.z * scale);
    dst[3] = static_cast<Element>(acc.w * scale);
  }
}

// The columns of a dRab row (a key position) that the main kernel writes or sums into: the keys query row
// r - off sees, as two spans of Mask's visible_spans (empty for rows no query sits at, and by default).
struct DrabRowSpans {
  Range first, second;
  __device__ bool visible(int64_t j) const {
    return (j >= first.begin && j < first.end) || (j >= second.begin && j < second.end);
  }
  // Whether some column of [lo, hi) is visible.
  __device__ bool touches(int64_t lo, int64_t hi) const {
    return (first.begin < hi && lo < first.end) || (second.begin < hi && lo < second.end);
  }
};
__device__ __forceinline__ DrabRowSpans drab_row_spans(const Params& p, int64_t bi, int64_t r) {
  const SequenceInfo seq = SequenceInfo::of(p, bi);
  const Mask mask = Mask::of(p, seq, bi);
  DrabRowSpans spans;
  visible_spans(mask, r - mask.off, &spans.first, &spans.second);
  return spans;
}

// The dRab row kernels below run `width` threads per row of dRab (a key position of one batch entry and rab
// head), kDrabThreads / width rows per CTA. The zeroing and fp32 conversion passes take drab_row_threads(p): a warp
// per row up to max_sk 2k, a whole CTA per row above (H100, HSTU backward with one rab head for four, bf16, jagged:
// a warp per row made the whole backward 5-6% faster at max_sk 1k (d 256 on the sm80 kernel; d 128 on the sm90
// kernel when it used these passes) and 5% slower at 4k).
constexpr int kDrabThreads = 256;
__host__ __device__ inline int drab_row_threads(const Params& p) { return p.seqlen_k <= 2048 ? 32 : kDrabThreads; }
inline dim3 drab_rows_grid(const Params& p, int64_t heads, int width) {
  const int64_t rows_per_cta = kDrabThreads / width;
  return dim3(unsigned((p.seqlen_k + rows_per_cta - 1) / rows_per_cta), unsigned(heads), unsigned(p.batch));
}
inline dim3 drab_rows_grid(const Params& p, int64_t heads) { return drab_rows_grid(p, heads, drab_row_threads(p)); }
// This thread's dRab row in a grid of drab_rows_grid(p, heads, width) (seqlen_k or more: none).
__device__ __forceinline__ int64_t drab_row(int width) {
  return int64_t(blockIdx.x) * (kDrabThreads / width) + threadIdx.x / width;
}

// Zeroes the fp32 dRab accumulator (b, max_sk, ld) where the main kernel's atomics land and write_drab_kernel
// reads: each row of batch entry blockIdx.z from the first to the last visible column (rounded out to column
// pairs; ld is even). The rest of the buffer is never read. Grid drab_rows_grid(p, 1). Internal linkage: every
// instance's translation unit holds its own copy of this non-template kernel.
static __global__ void zero_drab_accum_kernel(const __grid_constant__ Params p, float* accum, int64_t ld) {
  const int width = drab_row_threads(p);
  const int64_t r = drab_row(width), bi = blockIdx.z;
  if (r >= p.seqlen_k) return;
  const int lane = int(threadIdx.x % width);
  const DrabRowSpans spans = drab_row_spans(p, bi, r);
  const Range a = spans.first, b = spans.second;
  const bool has_a = a.begin < a.end, has_b = b.begin < b.end;
  if (!has_a && !has_b) return;
  const int64_t lo = (has_a && has_b ? min64(a.begin, b.begin) : has_a ? a.begin : b.begin) / 2 * 2;
  const int64_t hi = has_a && has_b ? max64(a.end, b.end) : has_a ? a.end : b.end;
  float* row = accum + (bi * p.seqlen_k + r) * ld;
  for (int64_t j = lo + 2 * lane; j < hi; j += 2 * width) *reinterpret_cast<float2*>(row + j) = make_float2(0.0f, 0.0f);
}

// dRab (b, rab_heads, max_sk, max_sk), rab head blockIdx.y, batch entry blockIdx.z, row by row: zero
// (accum == null), or the fp32 head sum (rab_heads == 1, accum rows ld floats apart, ld even) on the visible
// columns and zero elsewhere. Column pairs as one 32-bit store where the row is 4-byte aligned. Grid
// drab_rows_grid(p, rab_heads).
template <class Element>
__global__ void write_drab_kernel(const __grid_constant__ Params p, const float* accum, int64_t ld) {
  const int64_t msk = p.seqlen_k;
  const int width = drab_row_threads(p);
  const int64_t r = drab_row(width), h = blockIdx.y, bi = blockIdx.z;
  if (r >= msk) return;
  const int lane = int(threadIdx.x % width);
  DrabRowSpans spans;  // nothing visible without an accumulator: zeros
  const float* src = nullptr;
  if (accum != nullptr) {
    spans = drab_row_spans(p, bi, r);
    src = accum + (bi * msk + r) * ld;
  }
  Element* dst = static_cast<Element*>(p.drab) + bi * p.drab_batch_stride + h * p.drab_head_stride + r * p.drab_row_stride;
  if (reinterpret_cast<uintptr_t>(dst) % (2 * sizeof(Element)) == 0) {
    using Pair = cute::uint_bit_t<2 * cute::sizeof_bits_v<Element>>;
    for (int64_t j = 2 * lane; j < msk; j += 2 * width) {
      // Both columns of the pair lie inside the row of ld floats (ld >= msk rounded up to even); only pairs with
      // a visible column are read (the accumulator is zeroed there only).
      const bool v0 = spans.visible(j), v1 = spans.visible(j + 1);
      const float2 sums = v0 || v1 ? *reinterpret_cast<const float2*>(src + j) : make_float2(0.0f, 0.0f);
      const float x0 = v0 ? sums.x : 0.0f, x1 = v1 ? sums.y : 0.0f;
      if (j + 1 < msk) {
        Element pair[2] = {static_cast<Element>(x0), static_cast<Element>(x1)};
        *reinterpret_cast<Pair*>(dst + j) = *reinterpret_cast<const Pair*>(pair);
      } else {
        dst[j] = static_cast<Element>(x0);
      }
    }
  } else {
    for (int64_t j = lane; j < msk; j += width) dst[j] = static_cast<Element>(spans.visible(j) ? src[j] : 0.0f);
  }
}

// dRab of one rab head shared by several query heads, from the sm90 main kernel's per-head 16-bit dRab tiles
// (staged: (b, h, max_sk, ld), ld a multiple of 8): the head sum in fp32, rounded once, on the visible columns of
// each row, and zero elsewhere (staged elements there were never written). The heads are added in order, so the
// result is deterministic, and each head's term is rounded to Element first, as a framework that sums per-head
// gradients of a broadcast rab does. A warp per row (grid drab_rows_grid(p, 1, kDrabSumWidth)), 8 columns
// (16 bytes) per lane and step.
constexpr int kDrabSumWidth = 32;
template <class Element>
__global__ void sum_drab_heads_kernel(const __grid_constant__ Params p, const Element* staged, int64_t ld) {
  static_assert(sizeof(Element) == 2, "16-bit elements: 8 to a 16-byte vector");
  const int64_t msk = p.seqlen_k;
  const int64_t r = drab_row(kDrabSumWidth), bi = blockIdx.z;
  if (r >= msk) return;
  const int lane = int(threadIdx.x % kDrabSumWidth);
  const DrabRowSpans spans = drab_row_spans(p, bi, r);
  const int64_t head_stride = msk * ld;
  const Element* src = staged + (bi * p.heads * msk + r) * ld;
  Element* dst = static_cast<Element*>(p.drab) + bi * p.drab_batch_stride + r * p.drab_row_stride;
  const bool vector_store = reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  for (int64_t c0 = 8 * lane; c0 < msk; c0 += 8 * kDrabSumWidth) {
    float sum[8] = {};
    if (spans.touches(c0, c0 + 8)) {
      for (int64_t h = 0; h < p.heads; ++h) {
        alignas(16) Element term[8];
        *reinterpret_cast<uint4*>(term) = __ldg(reinterpret_cast<const uint4*>(src + h * head_stride + c0));
        CUTE_UNROLL
        for (int i = 0; i < 8; ++i) sum[i] += static_cast<float>(term[i]);
      }
    }
    alignas(16) Element out[8];
    CUTE_UNROLL
    for (int i = 0; i < 8; ++i) out[i] = static_cast<Element>(spans.visible(c0 + i) ? sum[i] : 0.0f);
    if (vector_store && c0 + 8 <= msk) {
      *reinterpret_cast<uint4*>(dst + c0) = *reinterpret_cast<const uint4*>(out);
    } else {
      CUTE_UNROLL
      for (int i = 0; i < 8; ++i)
        if (c0 + i < msk) dst[c0 + i] = out[i];
    }
  }
}

}  // namespace cuteattn::detail::sm80_bwd
