// The normalised description of one checked call that every backend consumes.
// Built once by core/build_params.cpp from the public args; plain data, valid on host and device.
#pragma once

#include <cstdint>

#include "cuteattn/attention.h"

namespace cuteattn::detail {

// Element offsets of a (batch or sequence-start, row, head) tensor, all 64-bit.
// fixed layout:  element(b, row, head, col) = ptr + b*batch + row*row + head*head + col
// varlen layout: batch = 0 and rows are global (cu_seqlens[b] + local row).
struct RowMajorView {
  void* ptr = nullptr;
  int64_t batch_stride = 0;
  int64_t row_stride = 0;
  int64_t head_stride = 0;
};

struct Params {
  ScoreFunction score = ScoreFunction::kSoftmax;
  DType dtype = DType::kFloat16;

  int64_t batch = 0;
  int64_t heads = 0;    // query heads h
  int64_t heads_k = 0;  // kv heads h_k; query head i reads kv head i / (h / h_k)
  int64_t head_dim = 0;
  int64_t head_dim_v = 0;

  bool varlen = false;
  const int32_t* cu_seqlens_q = nullptr;  // varlen: b+1 entries
  const int32_t* cu_seqlens_k = nullptr;
  int64_t seqlen_q = 0;  // fixed: every sequence's length; varlen: max_seqlen_q
  int64_t seqlen_k = 0;
  int64_t total_q = 0;  // rows of q over the whole batch (fixed: b * s_q)
  int64_t total_k = 0;

  RowMajorView q, k, v, o;
  float* lse = nullptr;  // contiguous; fixed (b, h, s_q), varlen (h, total_q)

  // Mask, merged: causal is already folded into window_right (= 0); -1 = unbounded side.
  bool causal = false;
  int64_t window_left = -1;
  int64_t window_right = -1;
  const int32_t* num_contexts = nullptr;  // HSTU, per sequence, or null
  const int32_t* num_targets = nullptr;   // HSTU, per sequence, or null
  int64_t target_group_size = 1;

  // Softmax.
  float scale = 1.0f;    // resolved softmax_scale
  float softcap = 0.0f;  // 0 = off

  // HSTU.
  float alpha = 1.0f;
  float inv_scaling_seqlen = 1.0f;
  const void* rab = nullptr;  // (b, h_rab, max_seqlen_k, max_seqlen_k) with strides below; null = none
  int64_t rab_heads = 0;
  int64_t rab_batch_stride = 0, rab_head_stride = 0, rab_row_stride = 0;

  // Backward.
  RowMajorView dout, dq, dk, dv;
  void* drab = nullptr;  // same strides as rab; null = not requested
  int64_t drab_batch_stride = 0, drab_head_stride = 0, drab_row_stride = 0;
  bool deterministic = false;

  // Execution.
  void* stream = nullptr;
  int device_index = 0;
  int num_threads = 0;
};

// Builds Params from checked arguments (call check_* first).
Params build_forward_params(const ForwardArgs& args);
Params build_backward_params(const BackwardArgs& args);

}  // namespace cuteattn::detail
