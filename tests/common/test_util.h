// Host-only utilities shared by the CPU and GPU test suites (no CUDA in here).
//
//  - HostTensor: a contiguous host buffer of one dtype (fp16/bf16/fp32/int32) with float get/set.
//  - Case / CaseConfig: one attention problem with random normal inputs and NaN-poisoned outputs, in the
//    fixed or varlen layout, and the Problem/ForwardArgs/BackwardArgs that point at its host buffers.
//    GPU tests copy the buffers to the device and swap the data pointers of the returned args.
//  - softmax_fixed / softmax_varlen / hstu_varlen / with: the CaseConfig builders every suite uses.
//  - plain_forward / plain_backward: the unfused low-precision computation (every intermediate rounded to
//    the case dtype, as an unfused PyTorch bf16/fp16 evaluation does), the yardstick of the tolerance rule;
//    plain_*_tf32: the same for fp32 inputs with tf32 tensor-core matmuls (the GPU fp32 kernels).
//  - check_close: err(ours vs float64 reference) <= factor * err(plain vs reference) + atol, every element
//    written (no NaN left from the poison), with a readable failure message.
//
// Typical use:
//   Case c = Case::make(cfg, test_seed());             // inputs in cfg.dtype, outputs poisoned
//   run_forward(c, Backend::kCpu);                     // or: copy to the GPU, run, copy out/lse/... back into c
//   run_backward(c, Backend::kCpu);
//   expect_matches(c, make_references(c, /*backward=*/true), /*backward=*/true);
#pragma once

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuteattn/attention.h"

namespace cuteattn::test {

// A contiguous host tensor.
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;

  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape);

  bool empty() const { return shape.empty(); }
  int64_t numel() const;
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  // Row-major view (rank = shape.size()); an empty HostTensor gives an absent Tensor (rank 0).
  Tensor view();

  float get(int64_t i) const;  // int32 tensors convert their value
  void set(int64_t i, float value);
  int32_t get_int(int64_t i) const;
};

// A seed unique to the running gtest test (hash of "Suite.Name"), so every test draws its own inputs.
uint64_t test_seed();

HostTensor random_normal(DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng, float stddev = 1.0f);
HostTensor int_tensor(const std::vector<int32_t>& values);
// The same values in another dtype (rounded to nearest even when narrowing).
HostTensor cast(const HostTensor& t, DType dtype);
void poison(HostTensor& t);                  // every element NaN
int64_t count_nan(const HostTensor& t);      // elements still NaN (not written)

struct ErrorStats {
  double max_abs = 0.0;  // max |a - b|
  double max_rel = 0.0;  // max |a - b| / max(|b|, 1e-6)
  double max_ref = 0.0;  // max |b|
  int64_t mismatched_nonfinite = 0;  // positions where exactly one side is non-finite, or both are but differ
};
ErrorStats compare(const HostTensor& a, const HostTensor& b);

// Tolerance factors of the FlashAttention rule.
constexpr double kForwardFactor = 2.0;
constexpr double kGradFactor = 3.0;
constexpr double kHstuFactor = 5.0;  // HSTU gradients and dRab

// err(ours, ref) <= factor * err(plain, ref) + atol, and no NaN in ours. atol < 0 picks the default:
// 1e-5 * max(1, max|ref|) for fp16/bf16 and fp32 alike (the plain error carries the dtype's share).
::testing::AssertionResult check_close(const std::string& what, const HostTensor& ours, const HostTensor& plain,
                                       const HostTensor& ref, double factor, double atol = -1.0);

// One attention problem. Fixed layout unless seqlens_q is given (then varlen; seqlens_k empty = seqlens_q).
struct CaseConfig {
  ScoreFunction score = ScoreFunction::kSoftmax;
  DType dtype = DType::kBFloat16;
  int64_t batch = 1, heads = 1, heads_k = 1, head_dim = 64, head_dim_v = 0;  // head_dim_v 0 = head_dim
  int64_t seqlen_q = 0, seqlen_k = 0;                                         // fixed layout
  std::vector<int32_t> seqlens_q, seqlens_k;                                  // varlen layout
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  float softmax_scale = 0.0f, softcap = 0.0f;
  float alpha = 1.0f, scaling_seqlen = 0.0f;
  int64_t rab_heads = 0;  // 0: no rab; 1 or heads
  bool drab = false;      // request dRab in the backward
  std::vector<int32_t> num_contexts, num_targets;
  int64_t target_group_size = 1;
  int num_threads = 0;
  // Varlen: the max_seqlen arguments; 0 or anything below the longest sequence means the longest sequence.
  // Larger values are legal (they only bound the lengths) and set the rab/dRab rows' length.
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  // The dK check's atol (< 0: check_close's default). For a dK whose reference is zero by exact cancellation
  // (one key: P = 1, dP = D), where the plain computation cancels exactly too and ours keeps the fp32 rounding
  // of two dot products summed in different orders, over every query row.
  double dk_atol = -1.0;

  bool varlen() const { return !seqlens_q.empty(); }
  std::string describe() const;
};

// A GoogleTest parameter name for case `index` of a list: the index, then describe() with a minus sign before a
// digit as 'm' and every run of other characters than letters and digits as one '_' (e.g.
// "7_softmax_fp32_b1_h2_2_d80_80_varlen_q_100_k_146_window_43_m1").
std::string case_test_name(const CaseConfig& cfg, size_t index);
// How GoogleTest prints a case (test listings, failures of parameterised tests): describe().
void PrintTo(const CaseConfig& cfg, std::ostream* os);

// ---- CaseConfig builders shared by the CPU and GPU suites ----

CaseConfig softmax_fixed(DType dtype, int64_t batch, int64_t heads, int64_t heads_k, int64_t head_dim,
                         int64_t seqlen_q, int64_t seqlen_k);
// lengths_k empty: the key lengths are the query lengths.
CaseConfig softmax_varlen(DType dtype, std::vector<int32_t> lengths_q, std::vector<int32_t> lengths_k, int64_t heads,
                          int64_t heads_k, int64_t head_dim);
// Jagged layout, h_k = h, keys = queries.
CaseConfig hstu_varlen(DType dtype, std::vector<int32_t> lengths, int64_t heads, int64_t head_dim, bool causal,
                       float alpha);
// `c` changed by `f`, for case lists: with(softmax_fixed(...), [](CaseConfig& c) { c.causal = true; }).
template <typename F>
CaseConfig with(CaseConfig c, F&& f) {
  f(c);
  return c;
}

struct Case {
  CaseConfig cfg;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  HostTensor q, k, v, rab, cu_seqlens_q, cu_seqlens_k, num_contexts, num_targets;  // inputs
  HostTensor dout;                                                                 // backward input
  HostTensor out, lse, dq, dk, dv, drab;  // outputs (poisoned by make / fresh_copy / fp32_copy)

  // Random normal q, k, v, rab, dout; outputs allocated and poisoned. lse only for softmax.
  static Case make(const CaseConfig& cfg, uint64_t seed);
  // Same inputs, outputs poisoned again.
  Case fresh_copy() const;
  // Inputs converted to fp32 (the float64 oracle then sees exactly the rounded values), outputs fp32, poisoned.
  Case fp32_copy() const;
  // Poisons every output (forward and backward).
  void poison_outputs();

  Problem problem(Backend backend);
  ForwardArgs forward_args(Backend backend);
  // Softmax: reads out and lse as the forward wrote them.
  BackwardArgs backward_args(Backend backend);
};

// The unfused low-precision computation in the case dtype (see the file comment). Writes out (and lse for
// softmax), respectively dq, dk, dv (and drab when requested). plain_backward recomputes the forward itself.
void plain_forward(Case& c);
void plain_backward(Case& c);
// The plain computation of fp32 inputs on tensor cores with tf32 math (PyTorch's allow_tf32): every matmul
// operand (q, k, v, dout, P, dS) rounded to tf32 (10-bit mantissa, to nearest with ties away from zero, as
// cvt.rna.tf32.f32), fp32 accumulation, fp32 softmax. The yardstick of the GPU fp32 cases; fp32 cases only.
void plain_forward_tf32(Case& c);
void plain_backward_tf32(Case& c);

// Runs the forward / backward of `c` on the CPU with `backend` (kCpu or kCpuReference); a non-ok status fails
// the test (ADD_FAILURE) and returns false. run_backward reads c.out and c.lse as the forward left them.
bool run_forward(Case& c, Backend backend);
bool run_backward(Case& c, Backend backend);

// The yardsticks of one case: `ref` = the float64 oracle on fp32 copies of the inputs, `plain` = the unfused
// low-precision computation. With backward, the gradients too.
struct References {
  Case ref, plain;
};
References make_references(const Case& c, bool backward);
// The same with `plain` from plain_forward_tf32 / plain_backward_tf32 (GPU fp32 cases).
References make_references_tf32(const Case& c, bool backward);

// The tolerance rule for every output of `ours` (filled by any backend; GPU tests copy their results into
// it): out 2x, gradients 3x (5x for HSTU), dRab 5x, each + the default atol; LSE within 1e-4 * (1 + max|LSE|)
// with the same -inf rows. Reports through EXPECT_*.
void expect_matches(const Case& ours, const References& refs, bool backward);

}  // namespace cuteattn::test
