// Combine of a split-KV forward (FlashDecoding): every split of the key range left, per (query row, head), a
// partial O normalised over its own keys (fp32) and its LSE; this kernel merges them into the call's O and LSE:
//   lse = log(sum_s exp(lse_s)),  O = sum_s exp(lse_s - lse) O_s
// summed over the splits in index order (deterministic). A split that saw no key has lse_s = -inf and weighs 0
// (its O_s is never read); a row no split saw gets O = 0 and LSE = -inf, as the unsplit kernels write
// (SEMANTICS.md). Arch-neutral (plain loads and stores): the sm90 forward uses it, an sm80 split could too.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "core/params.h"
#include "cuteattn/types.h"

namespace cuteattn::detail {

// Partial row idx (0 <= idx < rows) is the LSE index of (batch, head, row): fixed (b, h, s_q), varlen
// (h, total_q) (SequenceInfo::lse_index); split s's rows follow split s - 1's.
struct SplitKvCombineParams {
  float const* o_partial;    // (num_splits * rows, head_dim)
  float const* lse_partial;  // (num_splits * rows)
  int64_t rows;              // h * total_q
  int num_splits;
  int head_dim;  // a multiple of 8 (each thread merges 4 columns)
  RowMajorView o;
  float* lse;  // null: not requested
  bool varlen;
  int64_t seqlen_q, total_q, heads;
};

template <class Element>
__global__ void __launch_bounds__(256) split_kv_combine_kernel(SplitKvCombineParams const cp) {
  const int chunks = cp.head_dim / 4;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t idx = t / chunks;
  if (idx >= cp.rows) return;
  const int col = int(t - idx * chunks) * 4;

  float lse_max = -INFINITY;
  for (int s = 0; s < cp.num_splits; ++s) lse_max = fmaxf(lse_max, cp.lse_partial[s * cp.rows + idx]);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float sum = 0.0f;
  if (lse_max != -INFINITY) {
    for (int s = 0; s < cp.num_splits; ++s) {
      const float l = cp.lse_partial[s * cp.rows + idx];
      if (l == -INFINITY) continue;
      const float w = expf(l - lse_max);
      const float4 o = *reinterpret_cast<float4 const*>(cp.o_partial + (s * cp.rows + idx) * cp.head_dim + col);
      sum += w;
      acc.x = fmaf(w, o.x, acc.x);
      acc.y = fmaf(w, o.y, acc.y);
      acc.z = fmaf(w, o.z, acc.z);
      acc.w = fmaf(w, o.w, acc.w);
    }
  }
  const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;

  int64_t offset;  // of (row, head) in O
  if (cp.varlen) {
    const int64_t head = idx / cp.total_q, row = idx - head * cp.total_q;
    offset = row * cp.o.row_stride + head * cp.o.head_stride;
  } else {
    const int64_t bh = idx / cp.seqlen_q, row = idx - bh * cp.seqlen_q;
    const int64_t b = bh / cp.heads, head = bh - b * cp.heads;
    offset = b * cp.o.batch_stride + row * cp.o.row_stride + head * cp.o.head_stride;
  }
  alignas(8) Element out[4] = {Element(acc.x * inv_sum), Element(acc.y * inv_sum), Element(acc.z * inv_sum),
                               Element(acc.w * inv_sum)};
  *reinterpret_cast<uint2*>(static_cast<Element*>(cp.o.ptr) + offset + col) = *reinterpret_cast<uint2 const*>(out);
  if (cp.lse != nullptr && col == 0) cp.lse[idx] = sum > 0.0f ? lse_max + logf(sum) : -INFINITY;
}

template <class Element>
Status launch_split_kv_combine(const SplitKvCombineParams& cp, cudaStream_t stream) {
  const int64_t threads = cp.rows * (cp.head_dim / 4);
  if (threads == 0) return Status::Ok();
  constexpr int kThreads = 256;
  split_kv_combine_kernel<Element><<<unsigned((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(cp);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return {StatusCode::kCudaError, std::string("split-KV combine: launch: ") + cudaGetErrorString(err)};
  return Status::Ok();
}

}  // namespace cuteattn::detail
