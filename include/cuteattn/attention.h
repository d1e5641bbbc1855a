// cuteattn public entry points: softmax (FlashAttention) and HSTU attention, forward and backward.
// What each call computes and refuses is ../shared/SEMANTICS.md; this header only names the arguments.
#pragma once

#include "cuteattn/types.h"

namespace cuteattn {

enum class ScoreFunction : int {
  kSoftmax = 0,   // P = softmax(scale * QK^T [softcapped]) over visible keys, with LSE
  kHstuSilu = 1,  // P = silu(alpha * (QK^T + rab)) / scaling_seqlen on visible keys, no normalisation
};

// One attention problem: inputs, layout, score function and mask. Shared by forward and backward.
//
// Layouts (strides free, last dimension contiguous):
//   fixed:  q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v)
//   varlen: q (total_q, h, d), k (total_k, h_k, d), v (total_k, h_k, d_v) with cu_seqlens_q/k int32 (b+1).
// The layout is varlen exactly when cu_seqlens_q is given.
struct Problem {
  ScoreFunction score = ScoreFunction::kSoftmax;
  Tensor q, k, v;

  Tensor cu_seqlens_q, cu_seqlens_k;  // varlen only; int32, b+1 entries, on the tensors' device
  int64_t max_seqlen_q = 0;           // varlen only; bounds every sequence's length
  int64_t max_seqlen_k = 0;

  // Masks (both score functions). Causal is the window (-1, 0); with causal set, window_right is 0.
  bool causal = false;
  int64_t window_left = -1;  // -1: unbounded
  int64_t window_right = -1;

  // Softmax only.
  float softmax_scale = 0.0f;  // 0: 1/sqrt(d)
  float softcap = 0.0f;        // 0: off; > 0: S = softcap * tanh(S / softcap)

  // HSTU only.
  float alpha = 1.0f;
  float scaling_seqlen = 0.0f;  // 0: max_seqlen_q
  Tensor rab;                   // optional (b, 1 or h, max_seqlen_k, max_seqlen_k), dtype of q
  Tensor num_contexts;          // optional int32 (b); needs causal
  Tensor num_targets;           // optional int32 (b); needs causal
  int64_t target_group_size = 1;

  // Execution.
  Backend backend = Backend::kAuto;
  DeviceKind device = DeviceKind::kCpu;
  int device_index = 0;
  void* stream = nullptr;  // cudaStream_t for CUDA calls; nullptr = the legacy default stream
  int num_threads = 0;     // CPU backend worker threads; 0 = all hardware threads
};

struct ForwardArgs {
  Problem problem;
  Tensor out;  // fixed (b, s_q, h, d_v) / varlen (total_q, h, d_v), dtype of q
  Tensor lse;  // softmax: optional float32, contiguous (b, h, s_q) / varlen (h, total_q); HSTU: absent

  // Scratch for GPU backends (>= forward_workspace_bytes; the sm90 kernels' tile counter when masks or varlen
  // schedule tiles dynamically). When null the library uses a small buffer it keeps per (device, stream); pass
  // one when calls that share a stream may run concurrently (e.g. a CUDA graph replayed on another stream).
  // CPU backends ignore it.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

struct BackwardArgs {
  Problem problem;
  Tensor out;   // softmax: the forward output; HSTU: absent
  Tensor lse;   // softmax: the forward LSE (required); HSTU: absent
  Tensor dout;  // shape of out
  Tensor dq, dk, dv;  // shapes of q, k, v
  Tensor drab;        // HSTU: optional, shape of rab; requested exactly when given
  bool deterministic = false;  // bit-identical gradients run to run

  // Scratch for GPU backends (>= backward_workspace_bytes). When null the library allocates it
  // stream-ordered on problem.stream and frees it after the call.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Check the arguments (SEMANTICS.md section 3) without running anything.
Status check_forward(const ForwardArgs& args);
Status check_backward(const BackwardArgs& args);

Status attention_forward(const ForwardArgs& args);
Status attention_backward(const BackwardArgs& args);

// Bytes of GPU scratch attention_forward / attention_backward need for these arguments (0 on the CPU).
size_t forward_workspace_bytes(const ForwardArgs& args);
size_t backward_workspace_bytes(const BackwardArgs& args);

// The backend a call would run on (kAuto resolved for this device and problem), after checking the args.
Status resolve_backend(const ForwardArgs& args, Backend* chosen);
Status resolve_backend(const BackwardArgs& args, Backend* chosen);

}  // namespace cuteattn
