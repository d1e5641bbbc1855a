// The argument checker: every refusal of SEMANTICS.md section 3, shared by check_forward and check_backward.
// Each concern has one function; each error is Status::Invalid("<argument>", "<what, got, expected>").
//
// Static checks (shapes, dtypes, strides, options) run first and never touch tensor data. Then the checks
// that read data: cu_seqlens, num_contexts and num_targets contents. CPU tensors are read directly. CUDA
// tensors are copied to the host on problem.stream (and the stream synchronised) when the library is built
// with CUDA; while problem.stream is being captured into a CUDA graph those content checks are skipped (a
// copy and a synchronisation cannot be captured), so a captured call trusts the contents.
// Alignment (16 bytes for data pointers and for the batch/row/head strides, so 128-bit vector loads are
// legal) is a GPU requirement and is checked for CUDA tensors only; the CPU backends need no alignment.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/check.h"
#include "cuteattn/attention.h"

#if CUTEATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cuteattn {
namespace {

constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kAlignBytes = 16;

std::string num(int64_t v) { return std::to_string(v); }

std::string shape_str(const Tensor& t) {
  std::string s = "(";
  for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + num(t.shape[i]);
  return s + ")";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + num(shape[i]);
  return s + ")";
}

bool is_float_dtype(DType d) { return d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kFloat32; }

bool valid_dtype(DType d) { return is_float_dtype(d) || d == DType::kInt32; }

// The sizes every later check refers to, read off q, k and v.
struct Dims {
  bool varlen = false;
  int64_t b = 0;           // fixed: q.shape[0]; varlen: cu_seqlens_q entries - 1
  int64_t sq = 0, sk = 0;  // fixed layout only
  int64_t total_q = 0, total_k = 0;
  int64_t h = 0, hk = 0, d = 0, dv = 0;
  DType dtype = DType::kFloat16;

  std::vector<int64_t> q_shape() const {
    return varlen ? std::vector<int64_t>{total_q, h, d} : std::vector<int64_t>{b, sq, h, d};
  }
  std::vector<int64_t> k_shape() const {
    return varlen ? std::vector<int64_t>{total_k, hk, d} : std::vector<int64_t>{b, sk, hk, d};
  }
  std::vector<int64_t> v_shape() const {
    return varlen ? std::vector<int64_t>{total_k, hk, dv} : std::vector<int64_t>{b, sk, hk, dv};
  }
  std::vector<int64_t> out_shape() const {
    return varlen ? std::vector<int64_t>{total_q, h, dv} : std::vector<int64_t>{b, sq, h, dv};
  }
  std::vector<int64_t> lse_shape() const {
    return varlen ? std::vector<int64_t>{h, total_q} : std::vector<int64_t>{b, h, sq};
  }
  const char* q_names() const { return varlen ? "(total_q, h, d)" : "(b, s_q, h, d)"; }
  const char* k_names() const { return varlen ? "(total_k, h_k, d)" : "(b, s_k, h_k, d)"; }
  const char* v_names() const { return varlen ? "(total_k, h_k, d_v)" : "(b, s_k, h_k, d_v)"; }
  const char* out_names() const { return varlen ? "(total_q, h, d_v)" : "(b, s_q, h, d_v)"; }
  const char* lse_names() const { return varlen ? "(h, total_q)" : "(b, h, s_q)"; }
};

// ---- one tensor on its own ----

// Rank, dtype value, non-negative shapes and strides, element count and addressed span within int64,
// data present when there are elements.
Status check_tensor_sane(const char* name, const Tensor& t) {
  if (t.rank < 0 || t.rank > Tensor::kMaxRank)
    return Status::Invalid(name, "rank " + num(t.rank) + " outside 0.." + num(Tensor::kMaxRank));
  if (!valid_dtype(t.dtype)) return Status::Invalid(name, "unknown dtype value " + num(static_cast<int>(t.dtype)));
  int64_t count = 1, span = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0) return Status::Invalid(name, "negative size " + num(t.shape[i]) + " in dimension " + num(i));
    if (t.stride[i] < 0)
      return Status::Invalid(name, "negative stride " + num(t.stride[i]) + " in dimension " + num(i));
    int64_t extent_span = 0;
    if (__builtin_mul_overflow(count, t.shape[i], &count) ||
        (t.shape[i] > 0 && __builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &extent_span)) ||
        __builtin_add_overflow(span, extent_span, &span))
      return Status::Invalid(name, "shape " + shape_str(t) + " overflows 64-bit element offsets");
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(span + 1, static_cast<int64_t>(dtype_size(t.dtype)), &bytes))
    return Status::Invalid(name, "shape " + shape_str(t) + " overflows 64-bit byte offsets");
  if (count > 0 && t.data == nullptr) return Status::Invalid(name, "data is null for shape " + shape_str(t));
  return Status::Ok();
}

Status expect_shape(const char* name, const Tensor& t, const std::vector<int64_t>& shape, const char* names) {
  bool same = t.rank == static_cast<int>(shape.size());
  for (int i = 0; same && i < t.rank; ++i) same = t.shape[i] == shape[i];
  if (!same)
    return Status::Invalid(name, "expected shape " + shape_str(shape) + " = " + names + ", got " + shape_str(t));
  return Status::Ok();
}

Status expect_dtype(const char* name, const Tensor& t, DType dtype, const char* of_what) {
  if (t.dtype != dtype)
    return Status::Invalid(name, std::string("dtype ") + dtype_name(t.dtype) + " does not match " + of_what + " (" +
                                     dtype_name(dtype) + ")");
  return Status::Ok();
}

// Dimensions of extent 1 never step, so their strides are free (as in PyTorch's contiguity rule).
Status check_last_dim_contiguous(const char* name, const Tensor& t) {
  const int last = t.rank - 1;
  if (t.shape[last] > 1 && t.stride[last] != 1)
    return Status::Invalid(name, "last dimension must be contiguous (stride 1), got stride " + num(t.stride[last]));
  return Status::Ok();
}

Status check_row_major(const char* name, const Tensor& t) {
  int64_t expected = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] > 1 && t.stride[i] != expected)
      return Status::Invalid(name, "must be contiguous: dimension " + num(i) + " has stride " + num(t.stride[i]) +
                                       ", expected " + num(expected));
    expected *= t.shape[i];
  }
  return Status::Ok();
}

// Outputs written by many threads must not alias themselves.
Status check_no_zero_stride(const char* name, const Tensor& t) {
  if (t.numel() == 0) return Status::Ok();
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] > 1 && t.stride[i] == 0)
      return Status::Invalid(
          name, "stride 0 in dimension " + num(i) + " (size " + num(t.shape[i]) + ") makes output elements overlap");
  return Status::Ok();
}

Status check_alignment(const char* name, const Tensor& t) {
  const int64_t elem = static_cast<int64_t>(dtype_size(t.dtype));
  if (reinterpret_cast<uintptr_t>(t.data) % kAlignBytes != 0)
    return Status::Invalid(name, "data pointer is not " + num(kAlignBytes) + "-byte aligned (GPU vector loads)");
  for (int i = 0; i + 1 < t.rank; ++i)
    if (t.shape[i] > 1 && (t.stride[i] * elem) % kAlignBytes != 0)
      return Status::Invalid(name, "stride " + num(t.stride[i]) + " of dimension " + num(i) + " is " +
                                       num(t.stride[i] * elem) + " bytes, not a multiple of " + num(kAlignBytes) +
                                       " (GPU vector loads)");
  return Status::Ok();
}

// A floating-point tensor in the layout of one of q, k, v, out (and their gradients).
Status check_data_tensor(const Problem& p, const char* name, const Tensor& t, const std::vector<int64_t>& shape,
                         const char* names, DType dtype, bool output) {
  if (!t.defined()) return Status::Invalid(name, "missing; expected shape " + shape_str(shape) + " = " + names);
  Status s = check_tensor_sane(name, t);
  if (s.ok()) s = expect_shape(name, t, shape, names);
  if (s.ok()) s = expect_dtype(name, t, dtype, "q");
  if (s.ok()) s = check_last_dim_contiguous(name, t);
  if (s.ok() && output) s = check_no_zero_stride(name, t);
  if (s.ok() && p.device == DeviceKind::kCuda) s = check_alignment(name, t);
  return s;
}

// ---- the problem ----

Status check_enums(const Problem& p) {
  const int score = static_cast<int>(p.score), backend = static_cast<int>(p.backend);
  const int device = static_cast<int>(p.device);
  if (score < 0 || score > static_cast<int>(ScoreFunction::kHstuSilu))
    return Status::Invalid("score", "unknown score function value " + num(score));
  if (backend < 0 || backend > static_cast<int>(Backend::kSm90))
    return Status::Invalid("backend", "unknown backend value " + num(backend));
  if (device < 0 || device > static_cast<int>(DeviceKind::kCuda))
    return Status::Invalid("device", "unknown device value " + num(device));
  return Status::Ok();
}

Status check_backend_device(const Problem& p) {
  const bool gpu_backend = p.backend == Backend::kSm80 || p.backend == Backend::kSm90;
  const bool cpu_backend = p.backend == Backend::kCpu || p.backend == Backend::kCpuReference;
  if (gpu_backend && p.device != DeviceKind::kCuda)
    return Status::Invalid("backend", std::string(backend_name(p.backend)) + " needs CUDA tensors (device kCuda)");
  if (cpu_backend && p.device != DeviceKind::kCpu)
    return Status::Invalid("backend", std::string(backend_name(p.backend)) + " needs CPU tensors (device kCpu)");
  if (p.device_index < 0) return Status::Invalid("device_index", "must be >= 0, got " + num(p.device_index));
  if (p.num_threads < 0) return Status::Invalid("num_threads", "must be >= 0, got " + num(p.num_threads));
  return Status::Ok();
}

// q fixes the layout, the batch (fixed layout), the heads and the head dim.
Status check_q(const Problem& p, Dims* dims) {
  dims->varlen = p.cu_seqlens_q.defined();
  if (!p.q.defined()) return Status::Invalid("q", "missing");
  Status s = check_tensor_sane("q", p.q);
  if (!s.ok()) return s;
  if (!is_float_dtype(p.q.dtype))
    return Status::Invalid("q", std::string("dtype ") + dtype_name(p.q.dtype) + " not supported (fp16, bf16, fp32)");
  dims->dtype = p.q.dtype;
  const int rank = dims->varlen ? 3 : 4;
  if (p.q.rank != rank)
    return Status::Invalid("q", "expected rank " + num(rank) + " " + dims->q_names() + ", got rank " + num(p.q.rank) +
                                    " " + shape_str(p.q));
  if (dims->varlen) {
    dims->total_q = p.q.shape[0];
  } else {
    dims->b = p.q.shape[0];
    dims->sq = p.q.shape[1];
    dims->total_q = dims->b * dims->sq;
    if (dims->b == 0) return Status::Invalid("q", "batch size 0");
  }
  dims->h = p.q.shape[rank - 2];
  dims->d = p.q.shape[rank - 1];
  if (dims->h == 0) return Status::Invalid("q", "0 heads");
  if (dims->d < 1 || dims->d > kMaxHeadDim)
    return Status::Invalid("q", "head dim " + num(dims->d) + " outside 1.." + num(kMaxHeadDim));
  s = check_last_dim_contiguous("q", p.q);
  if (s.ok() && p.device == DeviceKind::kCuda) s = check_alignment("q", p.q);
  return s;
}

// k and v: ranks, dtypes, batch/sequence agreement, kv heads, head dims.
Status check_kv(const Problem& p, Dims* dims) {
  const int rank = dims->varlen ? 3 : 4;
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"k", p.k}, {"v", p.v}}) {
    if (!t.defined()) return Status::Invalid(name, "missing");
    Status s = check_tensor_sane(name, t);
    if (s.ok()) s = expect_dtype(name, t, dims->dtype, "q");
    if (!s.ok()) return s;
    if (t.rank != rank)
      return Status::Invalid(name, "expected rank " + num(rank) + " " +
                                       (name[0] == 'k' ? dims->k_names() : dims->v_names()) + ", got rank " +
                                       num(t.rank) + " " + shape_str(t));
  }
  if (!dims->varlen && p.k.shape[0] != dims->b)
    return Status::Invalid("k", "batch size " + num(p.k.shape[0]) + " does not match q (" + num(dims->b) + ")");
  dims->sk = dims->varlen ? 0 : p.k.shape[1];
  dims->total_k = dims->varlen ? p.k.shape[0] : dims->b * dims->sk;
  dims->hk = p.k.shape[rank - 2];
  if (p.k.shape[rank - 1] != dims->d)
    return Status::Invalid("k", "head dim " + num(p.k.shape[rank - 1]) + " does not match q (" + num(dims->d) + ")");
  if (dims->hk == 0) return Status::Invalid("k", "0 heads");
  if (dims->h % dims->hk != 0)
    return Status::Invalid("k", "q heads " + num(dims->h) + " are not a multiple of k heads " + num(dims->hk));
  dims->dv = p.v.shape[rank - 1];
  if (dims->dv < 1 || dims->dv > kMaxHeadDim)
    return Status::Invalid("v", "head dim " + num(dims->dv) + " outside 1.." + num(kMaxHeadDim));
  for (int i = 0; i + 1 < rank; ++i)
    if (p.v.shape[i] != p.k.shape[i])
      return Status::Invalid(
          "v", "shape " + shape_str(p.v) + " does not match k " + shape_str(p.k) + " except in the last dimension");
  Status s = check_last_dim_contiguous("k", p.k);
  if (s.ok()) s = check_last_dim_contiguous("v", p.v);
  if (s.ok() && p.device == DeviceKind::kCuda) s = check_alignment("k", p.k);
  if (s.ok() && p.device == DeviceKind::kCuda) s = check_alignment("v", p.v);
  return s;
}

Status check_cu_seqlens_tensor(const char* name, const Tensor& t, int64_t entries) {
  Status s = check_tensor_sane(name, t);
  if (!s.ok()) return s;
  if (t.dtype != DType::kInt32 || t.rank != 1 || t.shape[0] != entries)
    return Status::Invalid(name, "expected int32 with b+1 = " + num(entries) + " entries, got " + dtype_name(t.dtype) +
                                     " of shape " + shape_str(t));
  return check_last_dim_contiguous(name, t);
}

Status check_max_seqlen(const char* name, int64_t max_seqlen, int64_t b, int64_t rows, const char* tensor) {
  if (max_seqlen < 0) return Status::Invalid(name, "must be >= 0, got " + num(max_seqlen));
  if (rows > 0 && max_seqlen == 0)
    return Status::Invalid(name, std::string("0, but ") + tensor + " has " + num(rows) + " rows");
  int64_t bound = 0;
  if (!__builtin_mul_overflow(b, max_seqlen, &bound) && rows > bound)
    return Status::Invalid(name, num(max_seqlen) + " is too small: " + tensor + " has " + num(rows) + " rows > b * " +
                                     name + " = " + num(bound));
  return Status::Ok();
}

// The varlen arguments without their contents: presence, dtype, length, max_seqlen bounds.
Status check_layout(const Problem& p, Dims* dims) {
  if (!dims->varlen) {
    if (p.cu_seqlens_k.defined()) return Status::Invalid("cu_seqlens_k", "given without cu_seqlens_q");
    if (p.max_seqlen_q != 0)
      return Status::Invalid("max_seqlen_q", "varlen only (no cu_seqlens_q given), got " + num(p.max_seqlen_q));
    if (p.max_seqlen_k != 0)
      return Status::Invalid("max_seqlen_k", "varlen only (no cu_seqlens_q given), got " + num(p.max_seqlen_k));
    return Status::Ok();
  }
  Status s = check_tensor_sane("cu_seqlens_q", p.cu_seqlens_q);
  if (!s.ok()) return s;
  if (p.cu_seqlens_q.dtype != DType::kInt32 || p.cu_seqlens_q.rank != 1)
    return Status::Invalid("cu_seqlens_q", std::string("expected a rank-1 int32 tensor of b+1 entries, got ") +
                                               dtype_name(p.cu_seqlens_q.dtype) + " of shape " +
                                               shape_str(p.cu_seqlens_q));
  dims->b = p.cu_seqlens_q.shape[0] - 1;
  if (dims->b < 1)
    return Status::Invalid("cu_seqlens_q",
                           "batch size 0: expected at least 2 entries, got " + num(p.cu_seqlens_q.shape[0]));
  s = check_cu_seqlens_tensor("cu_seqlens_q", p.cu_seqlens_q, dims->b + 1);
  if (s.ok() && !p.cu_seqlens_k.defined()) s = Status::Invalid("cu_seqlens_k", "missing (cu_seqlens_q is given)");
  if (s.ok()) s = check_cu_seqlens_tensor("cu_seqlens_k", p.cu_seqlens_k, dims->b + 1);
  if (s.ok()) s = check_max_seqlen("max_seqlen_q", p.max_seqlen_q, dims->b, dims->total_q, "q");
  if (s.ok()) s = check_max_seqlen("max_seqlen_k", p.max_seqlen_k, dims->b, dims->total_k, "k");
  return s;
}

Status check_mask(const Problem& p) {
  if (p.window_left < -1)
    return Status::Invalid("window_left", "must be >= 0 or -1 (unbounded), got " + num(p.window_left));
  if (p.window_right < -1)
    return Status::Invalid("window_right", "must be >= 0 or -1 (unbounded), got " + num(p.window_right));
  if (p.causal && p.window_right > 0)
    return Status::Invalid("window_right", num(p.window_right) + " conflicts with causal (window_right = 0)");
  if (p.target_group_size < 1)
    return Status::Invalid("target_group_size", "must be >= 1, got " + num(p.target_group_size));
  return Status::Ok();
}

Status check_softmax_options(const Problem& p) {
  if (!std::isfinite(p.softmax_scale))
    return Status::Invalid("softmax_scale", "must be finite, got " + std::to_string(p.softmax_scale));
  if (!std::isfinite(p.softcap) || p.softcap < 0.0f)
    return Status::Invalid("softcap", "must be finite and >= 0, got " + std::to_string(p.softcap));
  const char* hstu_only = "HSTU only, but score is softmax";
  if (p.rab.defined()) return Status::Invalid("rab", hstu_only);
  if (p.num_contexts.defined()) return Status::Invalid("num_contexts", hstu_only);
  if (p.num_targets.defined()) return Status::Invalid("num_targets", hstu_only);
  if (p.target_group_size != 1)
    return Status::Invalid("target_group_size", std::string(hstu_only) + " (got " + num(p.target_group_size) + ")");
  if (p.alpha != 1.0f)
    return Status::Invalid(
        "alpha", std::string(hstu_only) + " (got " + std::to_string(p.alpha) + "); softmax uses softmax_scale");
  if (p.scaling_seqlen != 0.0f)
    return Status::Invalid("scaling_seqlen",
                           std::string(hstu_only) + " (got " + std::to_string(p.scaling_seqlen) + ")");
  return Status::Ok();
}

// An optional per-sequence int32 vector of HSTU (num_contexts, num_targets).
Status check_per_sequence(const Problem& p, const char* name, const Tensor& t, int64_t b) {
  Status s = check_tensor_sane(name, t);
  if (!s.ok()) return s;
  if (t.dtype != DType::kInt32 || t.rank != 1 || t.shape[0] != b)
    return Status::Invalid(name, "expected int32 with b = " + num(b) + " entries, got " + dtype_name(t.dtype) +
                                     " of shape " + shape_str(t));
  if (!p.causal) return Status::Invalid(name, "needs causal");
  if (p.window_left != -1)
    return Status::Invalid(name, "cannot be combined with a local window (window_left = " + num(p.window_left) + ")");
  return check_last_dim_contiguous(name, t);
}

Status check_rab_like(const Problem& p, const char* name, const Tensor& t, const Dims& dims) {
  Status s = check_tensor_sane(name, t);
  if (s.ok()) s = expect_dtype(name, t, dims.dtype, "q");
  if (!s.ok()) return s;
  const bool heads_ok = t.rank == 4 && (t.shape[1] == 1 || t.shape[1] == dims.h);
  if (t.rank != 4 || t.shape[0] != dims.b || !heads_ok || t.shape[2] != p.max_seqlen_k || t.shape[3] != p.max_seqlen_k)
    return Status::Invalid(name, "expected shape (b, 1 or h, max_seqlen_k, max_seqlen_k) = (" + num(dims.b) +
                                     ", 1 or " + num(dims.h) + ", " + num(p.max_seqlen_k) + ", " + num(p.max_seqlen_k) +
                                     "), got " + shape_str(t));
  s = check_last_dim_contiguous(name, t);
  if (s.ok() && p.device == DeviceKind::kCuda) s = check_alignment(name, t);
  return s;
}

Status check_hstu_options(const Problem& p, const Dims& dims) {
  const char* softmax_only = "softmax only, but score is hstu";
  if (p.softcap != 0.0f) return Status::Invalid("softcap", softmax_only);
  if (p.softmax_scale != 0.0f) return Status::Invalid("softmax_scale", std::string(softmax_only) + "; HSTU uses alpha");
  if (!std::isfinite(p.alpha)) return Status::Invalid("alpha", "must be finite, got " + std::to_string(p.alpha));
  if (!std::isfinite(p.scaling_seqlen) || p.scaling_seqlen < 0.0f)
    return Status::Invalid("scaling_seqlen", "must be finite and >= 0, got " + std::to_string(p.scaling_seqlen));
  if (!dims.varlen) return Status::Invalid("cu_seqlens_q", "HSTU needs the jagged (varlen) layout");
  if (dims.hk != dims.h)
    return Status::Invalid("k", "HSTU needs as many k heads as q heads (" + num(dims.h) + "), got " + num(dims.hk));
  Status s;
  if (p.rab.defined()) s = check_rab_like(p, "rab", p.rab, dims);
  if (s.ok() && p.num_contexts.defined()) s = check_per_sequence(p, "num_contexts", p.num_contexts, dims.b);
  if (s.ok() && p.num_targets.defined()) s = check_per_sequence(p, "num_targets", p.num_targets, dims.b);
  if (s.ok() && p.target_group_size != 1 && !p.num_targets.defined())
    s = Status::Invalid("target_group_size", num(p.target_group_size) + " given without num_targets");
  return s;
}

// The static checks of the problem, shared by forward and backward.
Status check_problem(const Problem& p, Dims* dims) {
  Status s = check_enums(p);
  if (s.ok()) s = check_backend_device(p);
  if (s.ok()) s = check_q(p, dims);
  if (s.ok()) s = check_kv(p, dims);
  if (s.ok()) s = check_layout(p, dims);
  if (s.ok()) s = check_mask(p);
  if (!s.ok()) return s;
  return p.score == ScoreFunction::kSoftmax ? check_softmax_options(p) : check_hstu_options(p, *dims);
}

Status check_lse(const Problem& p, const Tensor& lse, const Dims& dims) {
  Status s = check_tensor_sane("lse", lse);
  if (s.ok() && lse.dtype != DType::kFloat32)
    s = Status::Invalid("lse", std::string("dtype ") + dtype_name(lse.dtype) + ", expected fp32");
  if (s.ok()) s = expect_shape("lse", lse, dims.lse_shape(), dims.lse_names());
  if (s.ok()) s = check_row_major("lse", lse);
  if (s.ok() && p.device == DeviceKind::kCuda && reinterpret_cast<uintptr_t>(lse.data) % kAlignBytes != 0)
    s = Status::Invalid("lse", "data pointer is not " + num(kAlignBytes) + "-byte aligned (GPU vector loads)");
  return s;
}

// ---- checks that read data ----

#if CUTEATTN_WITH_CUDA
// Switches to a device for the lifetime of the object.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      if (cudaSetDevice(device) == cudaSuccess) restore_ = true;
    }
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

Status cuda_failure(const char* name, const char* what, cudaError_t err) {
  cudaGetLastError();
  return {StatusCode::kCudaError, std::string(name) + ": " + what + ": " + cudaGetErrorString(err)};
}

// Every data pointer of a CUDA call must be device-accessible memory of problem.device_index.
Status check_cuda_pointer(const Problem& p, const char* name, const Tensor& t) {
  if (!t.defined() || t.data == nullptr) return Status::Ok();
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, t.data);
  if (err != cudaSuccess) return cuda_failure(name, "cudaPointerGetAttributes failed", err);
  if (attr.type == cudaMemoryTypeUnregistered)
    return Status::Invalid(name, "data is plain host memory, but problem.device is kCuda");
  if (attr.type == cudaMemoryTypeDevice && attr.device != p.device_index)
    return Status::Invalid(
        name, "data is on CUDA device " + num(attr.device) + ", but device_index is " + num(p.device_index));
  return Status::Ok();
}
#endif

struct Int32Read {
  const char* name;
  const Tensor* tensor;
  std::vector<int32_t>* out;
};

#if CUTEATTN_WITH_CUDA
// Page-locked host memory for the device reads of one thread, grown as needed: a copy into pageable memory
// blocks the host until it is done (one round trip per vector: ~40 us of GPU idle time per varlen call, H100),
// copies into page-locked memory queue up and one stream synchronisation waits for them all.
class PinnedStaging {
 public:
  ~PinnedStaging() {
    if (data_ != nullptr) cudaFreeHost(data_);  // at thread exit; the CUDA runtime may be gone at process exit
  }
  // Room for n values, or nullptr (the allocation's error in *err).
  int32_t* reserve(size_t n, cudaError_t* err) {
    *err = cudaSuccess;
    if (n <= capacity_) return data_;
    const size_t grown = std::max(n, 2 * capacity_);
    void* fresh = nullptr;
    *err = cudaMallocHost(&fresh, grown * sizeof(int32_t));
    if (*err != cudaSuccess) return nullptr;
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = static_cast<int32_t*>(fresh);
    capacity_ = grown;
    return data_;
  }

 private:
  int32_t* data_ = nullptr;
  size_t capacity_ = 0;
};
#endif

// Copies int32 vectors to the host, for a CUDA problem through page-locked staging with one stream
// synchronisation for all of them. Sets *available = false when device contents cannot be read now (the stream
// is being captured into a graph, or no CUDA in this build).
Status read_int32s(const Problem& p, std::initializer_list<Int32Read> reads, bool* available) {
  *available = true;
  for (const Int32Read& r : reads) r.out->resize(r.tensor->defined() ? static_cast<size_t>(r.tensor->shape[0]) : 0);
  if (p.device == DeviceKind::kCpu) {
    for (const Int32Read& r : reads) {
      const int32_t* src = static_cast<const int32_t*>(r.tensor->data);
      for (size_t i = 0; i < r.out->size(); ++i) (*r.out)[i] = src[static_cast<int64_t>(i) * r.tensor->stride[0]];
    }
    return Status::Ok();
  }
#if CUTEATTN_WITH_CUDA
  DeviceGuard guard(p.device_index);
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    *available = false;
    return Status::Ok();
  }
  size_t total = 0;
  for (const Int32Read& r : reads) total += r.out->size();
  if (total == 0) return Status::Ok();
  thread_local PinnedStaging staging;
  cudaError_t err = cudaSuccess;
  int32_t* host = staging.reserve(total, &err);
  if (host == nullptr) return cuda_failure(reads.begin()->name, "allocating page-locked host memory failed", err);
  size_t offset = 0;
  for (const Int32Read& r : reads) {
    if (r.out->empty()) continue;
    err = cudaMemcpyAsync(host + offset, r.tensor->data, r.out->size() * sizeof(int32_t), cudaMemcpyDefault, stream);
    if (err != cudaSuccess) return cuda_failure(r.name, "copying the contents to the host failed", err);
    offset += r.out->size();
  }
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return cuda_failure(reads.begin()->name, "copying the contents to the host failed", err);
  offset = 0;
  for (const Int32Read& r : reads) {
    std::copy(host + offset, host + offset + r.out->size(), r.out->begin());
    offset += r.out->size();
  }
  return Status::Ok();
#else
  *available = false;
  return Status::Ok();
#endif
}

Status check_cu_seqlens_contents(const char* name, const std::vector<int32_t>& cu, int64_t total, const char* rows_of,
                                 int64_t max_seqlen, const char* max_name) {
  if (cu[0] != 0) return Status::Invalid(name, "entry 0 must be 0, got " + num(cu[0]));
  const int64_t b = static_cast<int64_t>(cu.size()) - 1;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = static_cast<int64_t>(cu[i + 1]) - cu[i];
    if (len < 0)
      return Status::Invalid(name,
                             "decreases at entry " + num(i + 1) + " (" + num(cu[i]) + " -> " + num(cu[i + 1]) + ")");
    if (len > max_seqlen)
      return Status::Invalid(
          name, "sequence " + num(i) + " has length " + num(len) + " > " + max_name + " = " + num(max_seqlen));
  }
  if (cu[b] != total)
    return Status::Invalid(name,
                           "last entry " + num(cu[b]) + " does not match the " + num(total) + " rows of " + rows_of);
  return Status::Ok();
}

Status check_device_data(const Problem& p, const Dims& dims) {
#if CUTEATTN_WITH_CUDA
  if (p.device == DeviceKind::kCuda) {
    const std::pair<const char*, const Tensor*> tensors[] = {{"q", &p.q},
                                                             {"k", &p.k},
                                                             {"v", &p.v},
                                                             {"cu_seqlens_q", &p.cu_seqlens_q},
                                                             {"cu_seqlens_k", &p.cu_seqlens_k},
                                                             {"rab", &p.rab},
                                                             {"num_contexts", &p.num_contexts},
                                                             {"num_targets", &p.num_targets}};
    for (const auto& [name, t] : tensors) {
      Status s = check_cuda_pointer(p, name, *t);
      if (!s.ok()) return s;
    }
  }
#endif
  if (!dims.varlen) return Status::Ok();
  std::vector<int32_t> cu_q, cu_k, contexts, targets;
  bool available = true;
  Status s = read_int32s(p,
                         {{"cu_seqlens_q", &p.cu_seqlens_q, &cu_q},
                          {"cu_seqlens_k", &p.cu_seqlens_k, &cu_k},
                          {"num_contexts", &p.num_contexts, &contexts},
                          {"num_targets", &p.num_targets, &targets}},
                         &available);
  if (!s.ok() || !available) return s;
  s = check_cu_seqlens_contents("cu_seqlens_q", cu_q, dims.total_q, "q", p.max_seqlen_q, "max_seqlen_q");
  if (s.ok()) s = check_cu_seqlens_contents("cu_seqlens_k", cu_k, dims.total_k, "k", p.max_seqlen_k, "max_seqlen_k");
  if (!s.ok()) return s;
  for (int64_t i = 0; i < dims.b; ++i) {
    const int64_t sq = static_cast<int64_t>(cu_q[i + 1]) - cu_q[i];
    const int64_t n_c = contexts.empty() ? 0 : contexts[i];
    const int64_t n_t = targets.empty() ? 0 : targets[i];
    const int64_t sk = static_cast<int64_t>(cu_k[i + 1]) - cu_k[i];
    if (p.rab.defined() && sq > sk)
      return Status::Invalid("rab", "sequence " + num(i) + " has " + num(sq) + " queries > " + num(sk) +
                                        " keys, so its first query rows have no rab row (rows are key positions)");
    if (n_c < 0) return Status::Invalid("num_contexts", "entry " + num(i) + " is negative (" + num(n_c) + ")");
    if (n_t < 0) return Status::Invalid("num_targets", "entry " + num(i) + " is negative (" + num(n_t) + ")");
    if (n_t > sk)
      return Status::Invalid("num_targets",
                             "sequence " + num(i) + ": " + num(n_t) + " targets exceed its length " + num(sk));
    if (n_c + n_t > sk)
      return Status::Invalid("num_contexts", "sequence " + num(i) + ": " + num(n_c) + " contexts + " + num(n_t) +
                                                 " targets exceed its length " + num(sk));
  }
  return Status::Ok();
}

}  // namespace

namespace detail {

Status check_forward_arguments(const ForwardArgs& args, bool read_device_data) {
  const Problem& p = args.problem;
  Dims dims;
  Status s = check_problem(p, &dims);
  if (!s.ok()) return s;
  s = check_data_tensor(p, "out", args.out, dims.out_shape(), dims.out_names(), dims.dtype, true);
  if (!s.ok()) return s;
  if (args.lse.defined()) {
    if (p.score == ScoreFunction::kHstuSilu) return Status::Invalid("lse", "softmax only, but score is hstu (no LSE)");
    s = check_lse(p, args.lse, dims);
    if (!s.ok()) return s;
  }
  if (args.workspace == nullptr && args.workspace_bytes != 0)
    return Status::Invalid("workspace", "null with workspace_bytes = " + std::to_string(args.workspace_bytes));
#if CUTEATTN_WITH_CUDA
  if (p.device == DeviceKind::kCuda) {
    s = check_cuda_pointer(p, "out", args.out);
    if (s.ok()) s = check_cuda_pointer(p, "lse", args.lse);
    if (!s.ok()) return s;
  }
#endif
  return read_device_data ? check_device_data(p, dims) : Status::Ok();
}

}  // namespace detail

Status check_forward(const ForwardArgs& args) { return detail::check_forward_arguments(args, true); }

namespace detail {

Status check_backward_arguments(const BackwardArgs& args, bool read_device_data) {
  const Problem& p = args.problem;
  Dims dims;
  Status s = check_problem(p, &dims);
  if (!s.ok()) return s;
  const bool softmax = p.score == ScoreFunction::kSoftmax;
  if (softmax) {
    s = check_data_tensor(p, "out", args.out, dims.out_shape(), dims.out_names(), dims.dtype, false);
    if (!s.ok()) return s;
    if (!args.lse.defined()) return Status::Invalid("lse", "missing: the softmax backward needs the forward's LSE");
    s = check_lse(p, args.lse, dims);
  } else {
    if (args.out.defined())
      s = Status::Invalid("out", "softmax only, but score is hstu (the backward does not read it)");
    if (s.ok() && args.lse.defined()) s = Status::Invalid("lse", "softmax only, but score is hstu (no LSE)");
  }
  if (s.ok()) s = check_data_tensor(p, "dout", args.dout, dims.out_shape(), dims.out_names(), dims.dtype, false);
  if (s.ok()) s = check_data_tensor(p, "dq", args.dq, dims.q_shape(), dims.q_names(), dims.dtype, true);
  if (s.ok()) s = check_data_tensor(p, "dk", args.dk, dims.k_shape(), dims.k_names(), dims.dtype, true);
  if (s.ok()) s = check_data_tensor(p, "dv", args.dv, dims.v_shape(), dims.v_names(), dims.dtype, true);
  if (s.ok() && args.drab.defined()) {
    if (softmax)
      s = Status::Invalid("drab", "HSTU only, but score is softmax");
    else if (!p.rab.defined())
      s = Status::Invalid("drab", "given without rab");
    else
      s = check_rab_like(p, "drab", args.drab, dims);
    if (s.ok() && args.drab.shape[1] != p.rab.shape[1])
      s = Status::Invalid("drab", "shape " + shape_str(args.drab) + " does not match rab " + shape_str(p.rab));
    if (s.ok()) s = check_no_zero_stride("drab", args.drab);
  }
  if (s.ok() && args.workspace == nullptr && args.workspace_bytes != 0)
    s = Status::Invalid("workspace", "null with workspace_bytes = " + std::to_string(args.workspace_bytes));
  if (!s.ok()) return s;
#if CUTEATTN_WITH_CUDA
  if (p.device == DeviceKind::kCuda) {
    const std::pair<const char*, const Tensor*> tensors[] = {
        {"out", &args.out}, {"lse", &args.lse}, {"dout", &args.dout}, {"dq", &args.dq},
        {"dk", &args.dk},   {"dv", &args.dv},   {"drab", &args.drab}};
    for (const auto& [name, t] : tensors) {
      s = check_cuda_pointer(p, name, *t);
      if (!s.ok()) return s;
    }
  }
#endif
  return read_device_data ? check_device_data(p, dims) : Status::Ok();
}

}  // namespace detail

Status check_backward(const BackwardArgs& args) { return detail::check_backward_arguments(args, true); }

}  // namespace cuteattn
