// Builds detail::Params, the normalised call every backend consumes, from checked public arguments.
#include <cmath>

#include "core/params.h"

namespace cuteattn::detail {
namespace {

// Fixed (b, s, h, x) -> strides (batch, row, head); varlen (total, h, x) -> (0, row, head).
RowMajorView view_of(const Tensor& t, bool varlen) {
  RowMajorView v;
  if (!t.defined()) return v;
  v.ptr = t.data;
  if (varlen) {
    v.row_stride = t.stride[0];
    v.head_stride = t.stride[1];
  } else {
    v.batch_stride = t.stride[0];
    v.row_stride = t.stride[1];
    v.head_stride = t.stride[2];
  }
  return v;
}

Params build_problem_params(const Problem& pr, const Tensor& out, const Tensor& lse) {
  Params p;
  p.score = pr.score;
  p.dtype = pr.q.dtype;
  p.varlen = pr.cu_seqlens_q.defined();
  const int r = p.varlen ? 3 : 4;
  p.heads = pr.q.shape[r - 2];
  p.heads_k = pr.k.shape[r - 2];
  p.head_dim = pr.q.shape[r - 1];
  p.head_dim_v = pr.v.shape[r - 1];

  if (p.varlen) {
    p.batch = pr.cu_seqlens_q.shape[0] - 1;
    p.cu_seqlens_q = static_cast<const int32_t*>(pr.cu_seqlens_q.data);
    p.cu_seqlens_k = static_cast<const int32_t*>(pr.cu_seqlens_k.data);
    p.seqlen_q = pr.max_seqlen_q;
    p.seqlen_k = pr.max_seqlen_k;
    p.total_q = pr.q.shape[0];
    p.total_k = pr.k.shape[0];
  } else {
    p.batch = pr.q.shape[0];
    p.seqlen_q = pr.q.shape[1];
    p.seqlen_k = pr.k.shape[1];
    p.total_q = p.batch * p.seqlen_q;
    p.total_k = p.batch * p.seqlen_k;
  }

  p.q = view_of(pr.q, p.varlen);
  p.k = view_of(pr.k, p.varlen);
  p.v = view_of(pr.v, p.varlen);
  p.o = view_of(out, p.varlen);
  p.lse = static_cast<float*>(lse.data);

  p.causal = pr.causal;
  p.window_left = pr.window_left;
  p.window_right = pr.causal ? 0 : pr.window_right;
  p.num_contexts = static_cast<const int32_t*>(pr.num_contexts.data);
  p.num_targets = static_cast<const int32_t*>(pr.num_targets.data);
  p.target_group_size = pr.target_group_size;

  p.scale = pr.softmax_scale != 0.0f ? pr.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  p.softcap = pr.softcap;

  p.alpha = pr.alpha;
  // With every sequence empty (max_seqlen_q = 0) nothing is computed; 1 keeps the value finite.
  const float scaling = pr.scaling_seqlen != 0.0f ? pr.scaling_seqlen : static_cast<float>(p.seqlen_q);
  p.inv_scaling_seqlen = scaling > 0.0f ? 1.0f / scaling : 1.0f;
  if (pr.rab.defined()) {
    p.rab = pr.rab.data;
    p.rab_heads = pr.rab.shape[1];
    p.rab_batch_stride = pr.rab.stride[0];
    p.rab_head_stride = pr.rab.stride[1];
    p.rab_row_stride = pr.rab.stride[2];
  }

  p.stream = pr.stream;
  p.device_index = pr.device_index;
  p.num_threads = pr.num_threads;
  return p;
}

}  // namespace

Params build_forward_params(const ForwardArgs& args) { return build_problem_params(args.problem, args.out, args.lse); }

Params build_backward_params(const BackwardArgs& args) {
  Params p = build_problem_params(args.problem, args.out, args.lse);
  p.dout = view_of(args.dout, p.varlen);
  p.dq = view_of(args.dq, p.varlen);
  p.dk = view_of(args.dk, p.varlen);
  p.dv = view_of(args.dv, p.varlen);
  if (args.drab.defined()) {
    p.drab = args.drab.data;
    p.drab_batch_stride = args.drab.stride[0];
    p.drab_head_stride = args.drab.stride[1];
    p.drab_row_stride = args.drab.stride[2];
  }
  p.deterministic = args.deterministic;
  return p;
}

}  // namespace cuteattn::detail
