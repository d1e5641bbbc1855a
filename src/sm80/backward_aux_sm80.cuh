// The small kernels around the sm80 backward main loop: D = rowsum(dO * O) before it (softmax), zero-filling
// dRab before it (HSTU, one rab head per query head), and after it the fp32 -> dtype conversions of dQ (summing
// the deterministic partials in a fixed order) and of the head-summed dRab.
#pragma once

#include <cstdint>

#include "core/params.h"
#include "variants/sequence.h"

namespace cuteattn::detail::sm80_bwd {

// One warp per (query row, head): D = sum_c dO[c] * O[c] in fp32, stored at the row's LSE index.
template <class Element>
__global__ void dot_do_o_kernel(const __grid_constant__ Params p, float* dsum) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t w = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; w < p.total_q * p.heads; w += warps) {
    const int64_t g = w / p.heads;  // global query row
    const int64_t h = w % p.heads;
    int64_t bi = 0, row = g;
    if (!p.varlen) {
      bi = g / p.seqlen_q;
      row = g % p.seqlen_q;
    }
    const Element* o = static_cast<const Element*>(p.o.ptr) + bi * p.o.batch_stride + row * p.o.row_stride +
                       h * p.o.head_stride;
    const Element* d_o = static_cast<const Element*>(p.dout.ptr) + bi * p.dout.batch_stride +
                         row * p.dout.row_stride + h * p.dout.head_stride;
    float acc = 0.0f;
    for (int64_t c = lane; c < p.head_dim_v; c += 32) acc += static_cast<float>(o[c]) * static_cast<float>(d_o[c]);
    for (int s = 16; s > 0; s /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    if (lane == 0) dsum[p.varlen ? h * p.total_q + g : (bi * p.heads + h) * p.seqlen_q + row] = acc;
  }
}

// dq[g, h, c] = scale * sum over splits of dq_accum[split, g, h, c], in split order. A thread converts 4
// consecutive columns of one (row, head).
template <class Element, int kHeadDim>
__global__ void convert_dq_kernel(const __grid_constant__ Params p, const float* dq_accum, int64_t split_stride,
                                  int nsplit, float scale) {
  constexpr int kVec = 4;
  constexpr int kThreadsPerRow = kHeadDim / kVec;
  if (threadIdx.x >= blockDim.x / kThreadsPerRow * kThreadsPerRow) return;
  const int c = threadIdx.x % kThreadsPerRow * kVec;
  const int64_t rows = p.total_q * p.heads;
  const int64_t rows_per_step = int64_t(gridDim.x) * (blockDim.x / kThreadsPerRow);
  for (int64_t w = int64_t(blockIdx.x) * (blockDim.x / kThreadsPerRow) + threadIdx.x / kThreadsPerRow; w < rows;
       w += rows_per_step) {
    if (c >= p.head_dim) continue;
    float4 acc = *reinterpret_cast<const float4*>(dq_accum + w * kHeadDim + c);
    for (int s = 1; s < nsplit; ++s) {
      const float4 part = *reinterpret_cast<const float4*>(dq_accum + s * split_stride + w * kHeadDim + c);
      acc.x += part.x;
      acc.y += part.y;
      acc.z += part.z;
      acc.w += part.w;
    }
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

// Every element of dRab (b, rab_heads, max_sk, max_sk): zero (accum == null) or the fp32 head sum (rab_heads == 1).
template <class Element>
__global__ void write_drab_kernel(const __grid_constant__ Params p, const float* accum) {
  const int64_t msk = p.seqlen_k;
  const int64_t n = p.batch * p.rab_heads * msk * msk;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % msk;
    const int64_t r = (e / msk) % msk;
    const int64_t h = (e / (msk * msk)) % p.rab_heads;
    const int64_t bi = e / (msk * msk * p.rab_heads);
    const float value = accum != nullptr ? accum[(bi * msk + r) * msk + j] : 0.0f;
    static_cast<Element*>(p.drab)[bi * p.drab_batch_stride + h * p.drab_head_stride + r * p.drab_row_stride + j] =
        static_cast<Element>(value);
  }
}

}  // namespace cuteattn::detail::sm80_bwd
