// The argument checker (SEMANTICS.md section 3): one test per refused input, each asserting kInvalidArgument
// and a message that starts with the argument's name; then edge cases that must be accepted, and the Params
// that build_*_params makes of accepted arguments. Host buffers only; nothing here runs attention.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/params.h"
#include "cuteattn/attention.h"

namespace {

using namespace cuteattn;

// Zero-filled, 64-byte aligned host buffers that live as long as the store.
class Store {
 public:
  Tensor make(DType dtype, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    buffers_.emplace_back(static_cast<size_t>(n) * dtype_size(dtype) / sizeof(Block) + 1);
    return make_tensor(buffers_.back().data(), dtype, shape);
  }
  Tensor ints(const std::vector<int32_t>& values) {
    Tensor t = make(DType::kInt32, {static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), static_cast<int32_t*>(t.data));
    return t;
  }

 private:
  struct alignas(64) Block {
    unsigned char bytes[64];
  };
  std::deque<std::vector<Block>> buffers_;
};

struct FixedSpec {
  int64_t b = 2, sq = 8, sk = 16, h = 4, hk = 2, d = 64, dv = 32;
  DType dtype = DType::kFloat16;
};

ForwardArgs fixed_forward(Store& st, const FixedSpec& s = {}) {
  ForwardArgs a;
  a.problem.q = st.make(s.dtype, {s.b, s.sq, s.h, s.d});
  a.problem.k = st.make(s.dtype, {s.b, s.sk, s.hk, s.d});
  a.problem.v = st.make(s.dtype, {s.b, s.sk, s.hk, s.dv});
  a.out = st.make(s.dtype, {s.b, s.sq, s.h, s.dv});
  a.lse = st.make(DType::kFloat32, {s.b, s.h, s.sq});
  return a;
}

BackwardArgs backward_of(Store& st, const ForwardArgs& f) {
  BackwardArgs a;
  a.problem = f.problem;
  a.out = f.out;
  a.lse = f.lse;
  const Problem& p = f.problem;
  auto like = [&](const Tensor& t) {
    return t.rank == 4 ? st.make(t.dtype, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]})
                       : st.make(t.dtype, {t.shape[0], t.shape[1], t.shape[2]});
  };
  a.dout = like(f.out);
  a.dq = like(p.q);
  a.dk = like(p.k);
  a.dv = like(p.v);
  return a;
}

struct VarlenSpec {
  std::vector<int32_t> len_q = {3, 0, 5};
  std::vector<int32_t> len_k = {4, 0, 6};
  int64_t h = 4, hk = 2, d = 64, dv = 32;
  DType dtype = DType::kFloat16;
};

std::vector<int32_t> prefix(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), cu.begin() + 1);
  return cu;
}

ForwardArgs varlen_forward(Store& st, const VarlenSpec& s = {}) {
  const std::vector<int32_t> cu_q = prefix(s.len_q), cu_k = prefix(s.len_k);
  const int64_t tq = cu_q.back(), tk = cu_k.back();
  ForwardArgs a;
  Problem& p = a.problem;
  p.q = st.make(s.dtype, {tq, s.h, s.d});
  p.k = st.make(s.dtype, {tk, s.hk, s.d});
  p.v = st.make(s.dtype, {tk, s.hk, s.dv});
  p.cu_seqlens_q = st.ints(cu_q);
  p.cu_seqlens_k = st.ints(cu_k);
  p.max_seqlen_q = s.len_q.empty() ? 0 : *std::max_element(s.len_q.begin(), s.len_q.end());
  p.max_seqlen_k = s.len_k.empty() ? 0 : *std::max_element(s.len_k.begin(), s.len_k.end());
  a.out = st.make(s.dtype, {tq, s.h, s.dv});
  a.lse = st.make(DType::kFloat32, {s.h, tq});
  return a;
}

// HSTU: jagged, h_k == h, causal, no LSE.
ForwardArgs hstu_forward(Store& st, VarlenSpec s = {}) {
  s.hk = s.h;
  ForwardArgs a = varlen_forward(st, s);
  a.problem.score = ScoreFunction::kHstuSilu;
  a.problem.causal = true;
  a.lse = Tensor{};
  return a;
}

BackwardArgs hstu_backward(Store& st, const ForwardArgs& f) {
  BackwardArgs a = backward_of(st, f);
  a.out = Tensor{};
  a.lse = Tensor{};
  return a;
}

Tensor rab_for(Store& st, const ForwardArgs& f, int64_t heads) {
  const Problem& p = f.problem;
  return st.make(p.q.dtype, {p.cu_seqlens_q.shape[0] - 1, heads, p.max_seqlen_k, p.max_seqlen_k});
}

::testing::AssertionResult Refused(const Status& s, const std::string& argument) {
  if (s.code != StatusCode::kInvalidArgument)
    return ::testing::AssertionFailure() << "code " << static_cast<int>(s.code) << " (" << s.message
                                         << "), expected kInvalidArgument naming " << argument;
  if (s.message.rfind(argument + ": ", 0) != 0)
    return ::testing::AssertionFailure() << "message \"" << s.message << "\" does not start with \"" << argument
                                         << ": \"";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Accepted(const Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "refused: " << s.message;
}

// ---- q, k, v: presence, dtype, rank, sizes ----

TEST(RefuseQ, Missing) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.q = Tensor{};
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseQ, Int32Dtype) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.q.dtype = DType::kInt32;
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseQ, UnknownDtypeValue) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.q.dtype = static_cast<DType>(17);
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseQ, Rank3WithoutCuSeqlens) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.q = st.make(DType::kFloat16, {16, 4, 64});
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseQ, Rank4WithCuSeqlens) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.q = st.make(DType::kFloat16, {1, 8, 4, 64});
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseQ, RankOutOfRange) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.q.rank = 7;
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseQ, EmptyFixedBatch) {
  Store st;
  FixedSpec s;
  s.b = 0;
  Status status = check_forward(fixed_forward(st, s));
  EXPECT_TRUE(Refused(status, "q"));
  EXPECT_EQ(status.message, "q: batch size 0");
}

TEST(RefuseQ, ZeroHeads) {
  Store st;
  FixedSpec s;
  s.h = 0;
  EXPECT_TRUE(Refused(check_forward(fixed_forward(st, s)), "q"));
}

TEST(RefuseQ, HeadDimZero) {
  Store st;
  FixedSpec s;
  s.d = 0;
  EXPECT_TRUE(Refused(check_forward(fixed_forward(st, s)), "q"));
}

TEST(RefuseQ, HeadDimAbove256) {
  Store st;
  FixedSpec s;
  s.d = 264;
  EXPECT_TRUE(Refused(check_forward(fixed_forward(st, s)), "q"));
}

TEST(RefuseQ, NegativeSize) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.q.shape[1] = -8;
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseQ, NegativeStride) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.q.stride[1] = -a.problem.q.stride[1];
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseQ, NullData) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.q.data = nullptr;
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseQ, ElementCountOverflowsInt64) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  Tensor& q = a.problem.q;
  q.shape[0] = int64_t{1} << 40;
  q.shape[1] = int64_t{1} << 20;
  q.stride[2] = q.shape[3];
  q.stride[1] = q.stride[2] * q.shape[2];
  q.stride[0] = q.stride[1] * q.shape[1];
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseQ, StridedSpanOverflowsInt64) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.q.stride[0] = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseQ, LastDimNotContiguous) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.q.stride[3] = 2;
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseK, Missing) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.k = Tensor{};
  EXPECT_TRUE(Refused(check_forward(a), "k"));
}

TEST(RefuseK, DtypeMismatch) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.k.dtype = DType::kBFloat16;
  Status s = check_forward(a);
  EXPECT_TRUE(Refused(s, "k"));
  EXPECT_EQ(s.message, "k: dtype bf16 does not match q (fp16)");
}

TEST(RefuseK, WrongRank) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.k = st.make(DType::kFloat16, {32, 2, 64});
  EXPECT_TRUE(Refused(check_forward(a), "k"));
}

TEST(RefuseK, BatchMismatch) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.k = st.make(DType::kFloat16, {3, 16, 2, 64});
  a.problem.v = st.make(DType::kFloat16, {3, 16, 2, 32});
  EXPECT_TRUE(Refused(check_forward(a), "k"));
}

TEST(RefuseK, HeadDimMismatch) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.k = st.make(DType::kFloat16, {2, 16, 2, 32});
  EXPECT_TRUE(Refused(check_forward(a), "k"));
}

TEST(RefuseK, HeadsNotDividingQueryHeads) {
  Store st;
  FixedSpec s;
  s.hk = 3;
  EXPECT_TRUE(Refused(check_forward(fixed_forward(st, s)), "k"));
}

TEST(RefuseK, ZeroHeads) {
  Store st;
  FixedSpec s;
  s.hk = 0;
  EXPECT_TRUE(Refused(check_forward(fixed_forward(st, s)), "k"));
}

TEST(RefuseK, LastDimNotContiguous) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.k.stride[3] = 3;
  EXPECT_TRUE(Refused(check_forward(a), "k"));
}

TEST(RefuseV, Missing) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.v = Tensor{};
  EXPECT_TRUE(Refused(check_forward(a), "v"));
}

TEST(RefuseV, DtypeMismatch) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.v.dtype = DType::kFloat32;
  EXPECT_TRUE(Refused(check_forward(a), "v"));
}

TEST(RefuseV, SeqlenMismatchWithK) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.v = st.make(DType::kFloat16, {2, 15, 2, 32});
  EXPECT_TRUE(Refused(check_forward(a), "v"));
}

TEST(RefuseV, HeadsMismatchWithK) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.v = st.make(DType::kFloat16, {2, 16, 4, 32});
  EXPECT_TRUE(Refused(check_forward(a), "v"));
}

TEST(RefuseV, HeadDimAbove256) {
  Store st;
  FixedSpec s;
  s.dv = 320;
  EXPECT_TRUE(Refused(check_forward(fixed_forward(st, s)), "v"));
}

TEST(RefuseV, VarlenRowsMismatchWithK) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.v = st.make(DType::kFloat16, {9, 2, 32});
  EXPECT_TRUE(Refused(check_forward(a), "v"));
}

TEST(RefuseV, LastDimNotContiguous) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.v.stride[3] = 0;
  EXPECT_TRUE(Refused(check_forward(a), "v"));
}

// ---- out and lse ----

TEST(RefuseOut, Missing) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.out = Tensor{};
  EXPECT_TRUE(Refused(check_forward(a), "out"));
}

TEST(RefuseOut, WrongHeadDim) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.out = st.make(DType::kFloat16, {2, 8, 4, 64});
  EXPECT_TRUE(Refused(check_forward(a), "out"));
}

TEST(RefuseOut, WrongDtype) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.out.dtype = DType::kBFloat16;
  EXPECT_TRUE(Refused(check_forward(a), "out"));
}

TEST(RefuseOut, LastDimNotContiguous) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.out.stride[3] = 2;
  EXPECT_TRUE(Refused(check_forward(a), "out"));
}

TEST(RefuseOut, OverlappingRows) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.out.stride[1] = 0;
  EXPECT_TRUE(Refused(check_forward(a), "out"));
}

TEST(RefuseLse, WrongDtype) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.lse.dtype = DType::kFloat16;
  EXPECT_TRUE(Refused(check_forward(a), "lse"));
}

TEST(RefuseLse, WrongShape) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.lse = st.make(DType::kFloat32, {2, 8, 4});
  EXPECT_TRUE(Refused(check_forward(a), "lse"));
}

TEST(RefuseLse, VarlenFixedShape) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.lse = st.make(DType::kFloat32, {3, 4, 5});
  EXPECT_TRUE(Refused(check_forward(a), "lse"));
}

TEST(RefuseLse, NotContiguous) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.lse = st.make(DType::kFloat32, {2, 4, 16});
  a.lse.shape[2] = 8;  // a (2, 4, 8) view with row stride 16
  EXPECT_TRUE(Refused(check_forward(a), "lse"));
}

// ---- pointer and stride alignment (CUDA tensors only) ----

ForwardArgs cuda_fixed_forward(Store& st, const FixedSpec& s = {}) {
  ForwardArgs a = fixed_forward(st, s);
  a.problem.device = DeviceKind::kCuda;
  return a;
}

TEST(RefuseAlignment, QPointer) {
  Store st;
  ForwardArgs a = cuda_fixed_forward(st);
  a.problem.q.data = static_cast<char*>(a.problem.q.data) + 2;
  EXPECT_TRUE(Refused(check_forward(a), "q"));
}

TEST(RefuseAlignment, KPointer) {
  Store st;
  ForwardArgs a = cuda_fixed_forward(st);
  a.problem.k.data = static_cast<char*>(a.problem.k.data) + 8;
  EXPECT_TRUE(Refused(check_forward(a), "k"));
}

TEST(RefuseAlignment, VPointer) {
  Store st;
  ForwardArgs a = cuda_fixed_forward(st);
  a.problem.v.data = static_cast<char*>(a.problem.v.data) + 4;
  EXPECT_TRUE(Refused(check_forward(a), "v"));
}

TEST(RefuseAlignment, OutPointer) {
  Store st;
  ForwardArgs a = cuda_fixed_forward(st);
  a.out.data = static_cast<char*>(a.out.data) + 2;
  EXPECT_TRUE(Refused(check_forward(a), "out"));
}

TEST(RefuseAlignment, LsePointer) {
  Store st;
  ForwardArgs a = cuda_fixed_forward(st);
  a.lse.data = static_cast<char*>(a.lse.data) + 4;
  EXPECT_TRUE(Refused(check_forward(a), "lse"));
}

TEST(RefuseAlignment, HeadStrideOfOddHeadDim) {
  Store st;
  FixedSpec s;
  s.d = 60;  // 120-byte head stride in fp16
  EXPECT_TRUE(Refused(check_forward(cuda_fixed_forward(st, s)), "q"));
}

TEST(RefuseAlignment, RowStride) {
  Store st;
  ForwardArgs a = cuda_fixed_forward(st);
  a.problem.k.stride[1] += 4;
  EXPECT_TRUE(Refused(check_forward(a), "k"));
}

TEST(RefuseAlignment, GradientPointer) {
  Store st;
  ForwardArgs f = cuda_fixed_forward(st);
  BackwardArgs a = backward_of(st, f);
  a.dk.data = static_cast<char*>(a.dk.data) + 2;
  EXPECT_TRUE(Refused(check_backward(a), "dk"));
}

// ---- backend, device, enums, options ----

TEST(RefuseBackend, GpuBackendOnCpuTensors) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.backend = Backend::kSm80;
  EXPECT_TRUE(Refused(check_forward(a), "backend"));
  a.problem.backend = Backend::kSm90;
  EXPECT_TRUE(Refused(check_forward(a), "backend"));
}

TEST(RefuseBackend, CpuBackendOnCudaTensors) {
  Store st;
  ForwardArgs a = cuda_fixed_forward(st);
  a.problem.backend = Backend::kCpu;
  EXPECT_TRUE(Refused(check_forward(a), "backend"));
  a.problem.backend = Backend::kCpuReference;
  EXPECT_TRUE(Refused(check_forward(a), "backend"));
}

TEST(RefuseBackend, UnknownValue) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.backend = static_cast<Backend>(9);
  EXPECT_TRUE(Refused(check_forward(a), "backend"));
}

TEST(RefuseProblem, UnknownScore) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.score = static_cast<ScoreFunction>(5);
  EXPECT_TRUE(Refused(check_forward(a), "score"));
}

TEST(RefuseProblem, UnknownDevice) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.device = static_cast<DeviceKind>(3);
  EXPECT_TRUE(Refused(check_forward(a), "device"));
}

TEST(RefuseProblem, NegativeDeviceIndex) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.device_index = -1;
  EXPECT_TRUE(Refused(check_forward(a), "device_index"));
}

TEST(RefuseProblem, NegativeThreads) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.num_threads = -2;
  EXPECT_TRUE(Refused(check_forward(a), "num_threads"));
}

TEST(RefuseMask, WindowLeftBelowMinusOne) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.window_left = -2;
  EXPECT_TRUE(Refused(check_forward(a), "window_left"));
}

TEST(RefuseMask, WindowRightBelowMinusOne) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.window_right = -5;
  EXPECT_TRUE(Refused(check_forward(a), "window_right"));
}

TEST(RefuseMask, CausalWithPositiveWindowRight) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.causal = true;
  a.problem.window_right = 3;
  EXPECT_TRUE(Refused(check_forward(a), "window_right"));
}

TEST(RefuseMask, TargetGroupSizeZero) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.num_targets = st.ints({1, 0, 1});
  a.problem.target_group_size = 0;
  EXPECT_TRUE(Refused(check_forward(a), "target_group_size"));
}

TEST(RefuseSoftmax, NegativeSoftcap) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.softcap = -1.0f;
  EXPECT_TRUE(Refused(check_forward(a), "softcap"));
}

TEST(RefuseSoftmax, NanSoftcap) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.softcap = std::nanf("");
  EXPECT_TRUE(Refused(check_forward(a), "softcap"));
}

TEST(RefuseSoftmax, InfiniteScale) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.softmax_scale = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(Refused(check_forward(a), "softmax_scale"));
}

TEST(RefuseSoftmax, Rab) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.rab = rab_for(st, a, 1);
  EXPECT_TRUE(Refused(check_forward(a), "rab"));
}

TEST(RefuseSoftmax, NumContexts) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.causal = true;
  a.problem.num_contexts = st.ints({1, 0, 1});
  EXPECT_TRUE(Refused(check_forward(a), "num_contexts"));
}

TEST(RefuseSoftmax, NumTargets) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.causal = true;
  a.problem.num_targets = st.ints({1, 0, 1});
  EXPECT_TRUE(Refused(check_forward(a), "num_targets"));
}

TEST(RefuseSoftmax, Alpha) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.alpha = 0.5f;
  EXPECT_TRUE(Refused(check_forward(a), "alpha"));
}

TEST(RefuseSoftmax, ScalingSeqlen) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.scaling_seqlen = 100.0f;
  EXPECT_TRUE(Refused(check_forward(a), "scaling_seqlen"));
}

TEST(RefuseSoftmax, TargetGroupSize) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.target_group_size = 4;
  EXPECT_TRUE(Refused(check_forward(a), "target_group_size"));
}

// ---- varlen layout ----

TEST(RefuseVarlen, CuSeqlensQFloat) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.cu_seqlens_q.dtype = DType::kFloat32;
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_q"));
}

TEST(RefuseVarlen, CuSeqlensQRank2) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.cu_seqlens_q = st.make(DType::kInt32, {2, 2});
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_q"));
}

TEST(RefuseVarlen, CuSeqlensQSingleEntryIsEmptyBatch) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.cu_seqlens_q = st.ints({0});
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_q"));
}

TEST(RefuseVarlen, CuSeqlensKWrongLength) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.cu_seqlens_k = st.ints({0, 4, 10});
  Status s = check_forward(a);
  EXPECT_TRUE(Refused(s, "cu_seqlens_k"));
  EXPECT_EQ(s.message, "cu_seqlens_k: expected int32 with b+1 = 4 entries, got int32 of shape (3)");
}

TEST(RefuseVarlen, CuSeqlensKInt64Like) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.cu_seqlens_k.dtype = DType::kFloat16;
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_k"));
}

TEST(RefuseVarlen, CuSeqlensKMissing) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.cu_seqlens_k = Tensor{};
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_k"));
}

TEST(RefuseVarlen, CuSeqlensKWithoutQ) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.cu_seqlens_k = st.ints({0, 16, 32});
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_k"));
}

TEST(RefuseVarlen, CuSeqlensNotContiguous) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.cu_seqlens_q.stride[0] = 2;
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_q"));
}

TEST(RefuseVarlen, FirstEntryNotZero) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  static_cast<int32_t*>(a.problem.cu_seqlens_q.data)[0] = 1;
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_q"));
}

TEST(RefuseVarlen, Decreasing) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  int32_t* cu = static_cast<int32_t*>(a.problem.cu_seqlens_k.data);  // {0, 4, 4, 10}
  cu[1] = 5;
  cu[2] = 3;
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_k"));
}

TEST(RefuseVarlen, LastEntryNotTotal) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  static_cast<int32_t*>(a.problem.cu_seqlens_q.data)[3] = 7;
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_q"));
}

TEST(RefuseVarlen, LengthAboveMaxSeqlen) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.max_seqlen_k = 5;  // sequence 2 has 6 keys; 3 sequences * 5 >= 10 rows
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_k"));
}

TEST(RefuseVarlen, MaxSeqlenNegative) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.max_seqlen_q = -1;
  EXPECT_TRUE(Refused(check_forward(a), "max_seqlen_q"));
}

TEST(RefuseVarlen, MaxSeqlenZeroWithRows) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.max_seqlen_k = 0;
  EXPECT_TRUE(Refused(check_forward(a), "max_seqlen_k"));
}

TEST(RefuseVarlen, MaxSeqlenTooSmallForRows) {
  Store st;
  ForwardArgs a = varlen_forward(st);
  a.problem.max_seqlen_q = 2;  // 8 rows > 3 * 2
  EXPECT_TRUE(Refused(check_forward(a), "max_seqlen_q"));
}

TEST(RefuseVarlen, MaxSeqlenWithFixedLayout) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.max_seqlen_q = 8;
  EXPECT_TRUE(Refused(check_forward(a), "max_seqlen_q"));
}

// ---- HSTU ----

TEST(RefuseHstu, FixedLayout) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.score = ScoreFunction::kHstuSilu;
  a.lse = Tensor{};
  EXPECT_TRUE(Refused(check_forward(a), "cu_seqlens_q"));
}

TEST(RefuseHstu, GroupedKeyHeads) {
  Store st;
  ForwardArgs a = varlen_forward(st);  // h = 4, h_k = 2
  a.problem.score = ScoreFunction::kHstuSilu;
  a.lse = Tensor{};
  EXPECT_TRUE(Refused(check_forward(a), "k"));
}

TEST(RefuseHstu, Softcap) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.softcap = 30.0f;
  EXPECT_TRUE(Refused(check_forward(a), "softcap"));
}

TEST(RefuseHstu, SoftmaxScale) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.softmax_scale = 0.125f;
  EXPECT_TRUE(Refused(check_forward(a), "softmax_scale"));
}

TEST(RefuseHstu, Lse) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.lse = st.make(DType::kFloat32, {4, 8});
  EXPECT_TRUE(Refused(check_forward(a), "lse"));
}

TEST(RefuseHstu, InfiniteAlpha) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.alpha = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(Refused(check_forward(a), "alpha"));
}

TEST(RefuseHstu, NegativeScalingSeqlen) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.scaling_seqlen = -3.0f;
  EXPECT_TRUE(Refused(check_forward(a), "scaling_seqlen"));
}

TEST(RefuseHstu, RabWrongHeads) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.rab = rab_for(st, a, 3);
  EXPECT_TRUE(Refused(check_forward(a), "rab"));
}

TEST(RefuseHstu, RabWrongSeqlen) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.rab = st.make(DType::kFloat16, {3, 1, 6, 5});
  EXPECT_TRUE(Refused(check_forward(a), "rab"));
}

TEST(RefuseHstu, RabWrongBatch) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.rab = st.make(DType::kFloat16, {2, 1, 6, 6});
  EXPECT_TRUE(Refused(check_forward(a), "rab"));
}

TEST(RefuseHstu, RabWrongDtype) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.rab = rab_for(st, a, 1);
  a.problem.rab.dtype = DType::kFloat32;
  EXPECT_TRUE(Refused(check_forward(a), "rab"));
}

TEST(RefuseHstu, RabLastDimNotContiguous) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.rab = rab_for(st, a, 4);
  a.problem.rab.stride[3] = 2;
  EXPECT_TRUE(Refused(check_forward(a), "rab"));
}

TEST(RefuseHstu, RabWithMoreQueriesThanKeys) {
  Store st;
  VarlenSpec s;
  s.len_q = {3, 0, 7};
  s.len_k = {4, 0, 6};
  ForwardArgs a = hstu_forward(st, s);
  ASSERT_TRUE(Accepted(check_forward(a)));
  a.problem.rab = rab_for(st, a, 1);
  EXPECT_TRUE(Refused(check_forward(a), "rab"));
}

TEST(RefuseHstu, ContextsWithoutCausal) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.causal = false;
  a.problem.num_contexts = st.ints({1, 0, 2});
  EXPECT_TRUE(Refused(check_forward(a), "num_contexts"));
}

TEST(RefuseHstu, TargetsWithoutCausal) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.causal = false;
  a.problem.num_targets = st.ints({1, 0, 2});
  EXPECT_TRUE(Refused(check_forward(a), "num_targets"));
}

TEST(RefuseHstu, TargetsWithLocalWindow) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.window_left = 2;
  a.problem.num_targets = st.ints({1, 0, 2});
  EXPECT_TRUE(Refused(check_forward(a), "num_targets"));
}

TEST(RefuseHstu, ContextsWithLocalWindow) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.window_left = 2;
  a.problem.num_contexts = st.ints({1, 0, 2});
  EXPECT_TRUE(Refused(check_forward(a), "num_contexts"));
}

TEST(RefuseHstu, TargetsWrongLength) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.num_targets = st.ints({1, 0});
  EXPECT_TRUE(Refused(check_forward(a), "num_targets"));
}

TEST(RefuseHstu, ContextsWrongDtype) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.num_contexts = st.ints({1, 0, 2});
  a.problem.num_contexts.dtype = DType::kFloat32;
  EXPECT_TRUE(Refused(check_forward(a), "num_contexts"));
}

TEST(RefuseHstu, NegativeContexts) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.num_contexts = st.ints({1, 0, -1});
  EXPECT_TRUE(Refused(check_forward(a), "num_contexts"));
}

TEST(RefuseHstu, NegativeTargets) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.num_targets = st.ints({-2, 0, 1});
  EXPECT_TRUE(Refused(check_forward(a), "num_targets"));
}

TEST(RefuseHstu, TargetsAboveLength) {
  Store st;
  ForwardArgs a = hstu_forward(st);  // k lengths {4, 0, 6}
  a.problem.num_targets = st.ints({0, 1, 0});
  EXPECT_TRUE(Refused(check_forward(a), "num_targets"));
}

TEST(RefuseHstu, ContextsPlusTargetsAboveLength) {
  Store st;
  ForwardArgs a = hstu_forward(st);  // k lengths {4, 0, 6}
  a.problem.num_contexts = st.ints({2, 0, 3});
  a.problem.num_targets = st.ints({2, 0, 4});
  EXPECT_TRUE(Refused(check_forward(a), "num_contexts"));
}

TEST(RefuseHstu, GroupSizeWithoutTargets) {
  Store st;
  ForwardArgs a = hstu_forward(st);
  a.problem.target_group_size = 2;
  EXPECT_TRUE(Refused(check_forward(a), "target_group_size"));
}

// ---- backward ----

TEST(RefuseBackward, OutMissing) {
  Store st;
  BackwardArgs a = backward_of(st, fixed_forward(st));
  a.out = Tensor{};
  EXPECT_TRUE(Refused(check_backward(a), "out"));
}

TEST(RefuseBackward, LseMissing) {
  Store st;
  BackwardArgs a = backward_of(st, fixed_forward(st));
  a.lse = Tensor{};
  EXPECT_TRUE(Refused(check_backward(a), "lse"));
}

TEST(RefuseBackward, LseWrongShape) {
  Store st;
  BackwardArgs a = backward_of(st, varlen_forward(st));
  a.lse = st.make(DType::kFloat32, {4, 9});
  EXPECT_TRUE(Refused(check_backward(a), "lse"));
}

TEST(RefuseBackward, DoutWrongShape) {
  Store st;
  BackwardArgs a = backward_of(st, fixed_forward(st));
  a.dout = st.make(DType::kFloat16, {2, 8, 4, 64});
  EXPECT_TRUE(Refused(check_backward(a), "dout"));
}

TEST(RefuseBackward, DoutMissing) {
  Store st;
  BackwardArgs a = backward_of(st, fixed_forward(st));
  a.dout = Tensor{};
  EXPECT_TRUE(Refused(check_backward(a), "dout"));
}

TEST(RefuseBackward, DqWrongDtype) {
  Store st;
  BackwardArgs a = backward_of(st, fixed_forward(st));
  a.dq.dtype = DType::kFloat32;
  EXPECT_TRUE(Refused(check_backward(a), "dq"));
}

TEST(RefuseBackward, DkWrongShape) {
  Store st;
  BackwardArgs a = backward_of(st, fixed_forward(st));
  a.dk = st.make(DType::kFloat16, {2, 16, 4, 64});  // GQA: dk has the k heads, not the q heads
  EXPECT_TRUE(Refused(check_backward(a), "dk"));
}

TEST(RefuseBackward, DvMissing) {
  Store st;
  BackwardArgs a = backward_of(st, fixed_forward(st));
  a.dv = Tensor{};
  EXPECT_TRUE(Refused(check_backward(a), "dv"));
}

TEST(RefuseBackward, DqLastDimNotContiguous) {
  Store st;
  BackwardArgs a = backward_of(st, fixed_forward(st));
  a.dq.stride[3] = 2;
  EXPECT_TRUE(Refused(check_backward(a), "dq"));
}

TEST(RefuseBackward, DvOverlapping) {
  Store st;
  BackwardArgs a = backward_of(st, fixed_forward(st));
  a.dv.stride[2] = 0;
  EXPECT_TRUE(Refused(check_backward(a), "dv"));
}

TEST(RefuseBackward, SoftmaxDrab) {
  Store st;
  ForwardArgs f = varlen_forward(st);
  BackwardArgs a = backward_of(st, f);
  a.drab = rab_for(st, f, 1);
  EXPECT_TRUE(Refused(check_backward(a), "drab"));
}

TEST(RefuseBackward, HstuDrabWithoutRab) {
  Store st;
  ForwardArgs f = hstu_forward(st);
  BackwardArgs a = hstu_backward(st, f);
  a.drab = rab_for(st, f, 1);
  EXPECT_TRUE(Refused(check_backward(a), "drab"));
}

TEST(RefuseBackward, HstuDrabShapeOfOtherHeads) {
  Store st;
  ForwardArgs f = hstu_forward(st);
  f.problem.rab = rab_for(st, f, 1);
  BackwardArgs a = hstu_backward(st, f);
  a.drab = rab_for(st, f, 4);
  EXPECT_TRUE(Refused(check_backward(a), "drab"));
}

TEST(RefuseBackward, HstuDrabWrongDtype) {
  Store st;
  ForwardArgs f = hstu_forward(st);
  f.problem.rab = rab_for(st, f, 4);
  BackwardArgs a = hstu_backward(st, f);
  a.drab = rab_for(st, f, 4);
  a.drab.dtype = DType::kBFloat16;
  EXPECT_TRUE(Refused(check_backward(a), "drab"));
}

TEST(RefuseBackward, HstuOut) {
  Store st;
  ForwardArgs f = hstu_forward(st);
  BackwardArgs a = hstu_backward(st, f);
  a.out = f.out;
  EXPECT_TRUE(Refused(check_backward(a), "out"));
}

TEST(RefuseBackward, HstuLse) {
  Store st;
  ForwardArgs f = hstu_forward(st);
  BackwardArgs a = hstu_backward(st, f);
  a.lse = st.make(DType::kFloat32, {4, 8});
  EXPECT_TRUE(Refused(check_backward(a), "lse"));
}

TEST(RefuseForward, WorkspaceBytesWithoutPointer) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.workspace_bytes = 16;
  EXPECT_TRUE(Refused(check_forward(a), "workspace"));
}

// CPU backends need no scratch: they report 0 bytes and ignore a workspace they are given.
TEST(Accept, ForwardWorkspaceOnCpu) {
  Store st;
  ForwardArgs a = fixed_forward(st);
  a.problem.causal = true;
  EXPECT_EQ(forward_workspace_bytes(a), 0u);
  Tensor scratch = st.make(DType::kFloat32, {4});
  a.workspace = scratch.data;
  a.workspace_bytes = 16;
  EXPECT_TRUE(check_forward(a).ok());
}

TEST(RefuseBackward, WorkspaceBytesWithoutPointer) {
  Store st;
  BackwardArgs a = backward_of(st, fixed_forward(st));
  a.workspace_bytes = 1024;
  EXPECT_TRUE(Refused(check_backward(a), "workspace"));
}

TEST(RefuseBackward, SharesProblemChecks) {
  Store st;
  BackwardArgs a = backward_of(st, varlen_forward(st));
  static_cast<int32_t*>(a.problem.cu_seqlens_q.data)[1] = 9;  // {0, 9, 3, 8}: decreasing
  EXPECT_TRUE(Refused(check_backward(a), "cu_seqlens_q"));
  a = backward_of(st, fixed_forward(st));
  a.problem.window_left = -3;
  EXPECT_TRUE(Refused(check_backward(a), "window_left"));
}

// ---- accepted edge cases ----

TEST(Accept, FixedBasic) {
  Store st;
  ForwardArgs f = fixed_forward(st);
  EXPECT_TRUE(Accepted(check_forward(f)));
  EXPECT_TRUE(Accepted(check_backward(backward_of(st, f))));
}

TEST(Accept, LseIsOptionalInForward) {
  Store st;
  ForwardArgs f = fixed_forward(st);
  f.lse = Tensor{};
  EXPECT_TRUE(Accepted(check_forward(f)));
}

TEST(Accept, FixedZeroLengthQueries) {
  Store st;
  FixedSpec s;
  s.sq = 0;
  EXPECT_TRUE(Accepted(check_forward(fixed_forward(st, s))));
}

TEST(Accept, FixedZeroLengthKeys) {
  Store st;
  FixedSpec s;
  s.sk = 0;
  ForwardArgs f = fixed_forward(st, s);
  EXPECT_TRUE(Accepted(check_forward(f)));
  EXPECT_TRUE(Accepted(check_backward(backward_of(st, f))));
}

TEST(Accept, VarlenWithZeroLengthSequences) {
  Store st;
  ForwardArgs f = varlen_forward(st);  // the middle sequence is empty
  EXPECT_TRUE(Accepted(check_forward(f)));
  EXPECT_TRUE(Accepted(check_backward(backward_of(st, f))));
}

TEST(Accept, VarlenAllSequencesEmpty) {
  Store st;
  VarlenSpec s;
  s.len_q = {0, 0, 0, 0};
  s.len_k = {0, 0, 0, 0};
  ForwardArgs f = varlen_forward(st, s);
  EXPECT_EQ(f.problem.max_seqlen_q, 0);
  EXPECT_TRUE(Accepted(check_forward(f)));
  EXPECT_TRUE(Accepted(check_backward(backward_of(st, f))));
}

TEST(Accept, VarlenEmptyQueriesWithKeys) {
  Store st;
  VarlenSpec s;
  s.len_q = {0, 0};
  s.len_k = {5, 1};
  EXPECT_TRUE(Accepted(check_forward(varlen_forward(st, s))));
}

TEST(Accept, DifferentValueHeadDim) {
  Store st;
  FixedSpec s;
  s.d = 192;
  s.dv = 128;
  EXPECT_TRUE(Accepted(check_forward(fixed_forward(st, s))));
  s.d = 64;
  s.dv = 256;
  EXPECT_TRUE(Accepted(check_forward(fixed_forward(st, s))));
}

TEST(Accept, GroupedQuery8To1) {
  Store st;
  FixedSpec s;
  s.h = 16;
  s.hk = 2;
  ForwardArgs f = fixed_forward(st, s);
  EXPECT_TRUE(Accepted(check_forward(f)));
  EXPECT_TRUE(Accepted(check_backward(backward_of(st, f))));
  VarlenSpec v;
  v.h = 8;
  v.hk = 1;
  EXPECT_TRUE(Accepted(check_forward(varlen_forward(st, v))));
}

TEST(Accept, HeadDimBounds) {
  Store st;
  FixedSpec s;
  s.d = 256;
  s.dv = 256;
  EXPECT_TRUE(Accepted(check_forward(fixed_forward(st, s))));
  s.d = 1;
  s.dv = 1;
  s.dtype = DType::kFloat32;
  EXPECT_TRUE(Accepted(check_forward(fixed_forward(st, s))));  // CPU tensors need no alignment
}

TEST(Accept, AlignedCudaProblemPassesStaticChecks) {
  // Plain host memory with device kCuda: every static check passes. A CUDA build then asks the driver where
  // q lives and refuses it (or reports the CUDA error of a machine without a GPU).
  Store st;
  Status s = check_forward(cuda_fixed_forward(st));
#if CUTEATTN_WITH_CUDA
  EXPECT_TRUE(s.code == StatusCode::kCudaError || Refused(s, "q")) << s.message;
#else
  EXPECT_TRUE(Accepted(s));
#endif
}

TEST(Accept, StridedViewsWithContiguousLastDim) {
  Store st;
  ForwardArgs f = fixed_forward(st);
  f.problem.q = st.make(DType::kFloat16, {2, 8, 4, 128});
  f.problem.q.shape[3] = 64;  // every row is half of a wider buffer
  f.problem.k = st.make(DType::kFloat16, {2, 2, 16, 64});
  std::swap(f.problem.k.shape[1], f.problem.k.shape[2]);  // (b, h_k, s_k, d) storage seen as (b, s_k, h_k, d)
  std::swap(f.problem.k.stride[1], f.problem.k.stride[2]);
  EXPECT_TRUE(Accepted(check_forward(f)));
}

TEST(Accept, SoftmaxMasks) {
  Store st;
  ForwardArgs f = fixed_forward(st);
  f.problem.causal = true;
  f.problem.window_left = 3;
  EXPECT_TRUE(Accepted(check_forward(f)));
  f.problem.causal = false;
  f.problem.window_left = 0;
  f.problem.window_right = 5;
  f.problem.softcap = 30.0f;
  f.problem.softmax_scale = 0.2f;
  EXPECT_TRUE(Accepted(check_forward(f)));
}

TEST(Accept, HstuFull) {
  Store st;
  ForwardArgs f = hstu_forward(st);  // k lengths {4, 0, 6}
  f.problem.rab = rab_for(st, f, 1);
  f.problem.num_contexts = st.ints({1, 0, 2});
  f.problem.num_targets = st.ints({3, 0, 4});
  f.problem.target_group_size = 2;
  f.problem.alpha = 1.0f / 64;
  f.problem.scaling_seqlen = 100.0f;
  EXPECT_TRUE(Accepted(check_forward(f)));
  BackwardArgs b = hstu_backward(st, f);
  b.drab = rab_for(st, f, 1);
  EXPECT_TRUE(Accepted(check_backward(b)));
}

TEST(Accept, HstuWithoutMaskAndWithWindow) {
  Store st;
  ForwardArgs f = hstu_forward(st);
  f.problem.causal = false;
  f.problem.rab = rab_for(st, f, 4);
  EXPECT_TRUE(Accepted(check_forward(f)));
  f.problem.window_left = 2;
  f.problem.window_right = 1;
  EXPECT_TRUE(Accepted(check_forward(f)));
}

TEST(Accept, CausalWithWindowRightZero) {
  Store st;
  ForwardArgs f = fixed_forward(st);
  f.problem.causal = true;
  f.problem.window_right = 0;
  EXPECT_TRUE(Accepted(check_forward(f)));
}

// ---- the Params of accepted arguments ----

TEST(BuildParams, FixedLayout) {
  Store st;
  FixedSpec s;
  ForwardArgs f = fixed_forward(st, s);
  f.problem.causal = true;
  f.problem.window_left = 5;
  f.problem.num_threads = 3;
  const detail::Params p = detail::build_forward_params(f);
  EXPECT_FALSE(p.varlen);
  EXPECT_EQ(p.dtype, DType::kFloat16);
  EXPECT_EQ(p.batch, s.b);
  EXPECT_EQ(p.heads, s.h);
  EXPECT_EQ(p.heads_k, s.hk);
  EXPECT_EQ(p.head_dim, s.d);
  EXPECT_EQ(p.head_dim_v, s.dv);
  EXPECT_EQ(p.seqlen_q, s.sq);
  EXPECT_EQ(p.seqlen_k, s.sk);
  EXPECT_EQ(p.total_q, s.b * s.sq);
  EXPECT_EQ(p.total_k, s.b * s.sk);
  EXPECT_EQ(p.q.ptr, f.problem.q.data);
  EXPECT_EQ(p.q.batch_stride, s.sq * s.h * s.d);
  EXPECT_EQ(p.q.row_stride, s.h * s.d);
  EXPECT_EQ(p.q.head_stride, s.d);
  EXPECT_EQ(p.v.row_stride, s.hk * s.dv);
  EXPECT_EQ(p.o.ptr, f.out.data);
  EXPECT_EQ(p.o.batch_stride, s.sq * s.h * s.dv);
  EXPECT_EQ(p.lse, f.lse.data);
  EXPECT_TRUE(p.causal);
  EXPECT_EQ(p.window_left, 5);
  EXPECT_EQ(p.window_right, 0);
  EXPECT_FLOAT_EQ(p.scale, 1.0f / std::sqrt(static_cast<float>(s.d)));
  EXPECT_EQ(p.num_threads, 3);
  EXPECT_EQ(p.cu_seqlens_q, nullptr);
  EXPECT_EQ(p.rab, nullptr);
}

TEST(BuildParams, VarlenLayoutAndExplicitScale) {
  Store st;
  ForwardArgs f = varlen_forward(st);
  f.problem.softmax_scale = 0.5f;
  f.problem.window_right = 2;
  const detail::Params p = detail::build_forward_params(f);
  EXPECT_TRUE(p.varlen);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.seqlen_q, 5);
  EXPECT_EQ(p.seqlen_k, 6);
  EXPECT_EQ(p.total_q, 8);
  EXPECT_EQ(p.total_k, 10);
  EXPECT_EQ(p.cu_seqlens_q, f.problem.cu_seqlens_q.data);
  EXPECT_EQ(p.cu_seqlens_k, f.problem.cu_seqlens_k.data);
  EXPECT_EQ(p.q.batch_stride, 0);
  EXPECT_EQ(p.q.row_stride, 4 * 64);
  EXPECT_EQ(p.q.head_stride, 64);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, 2);
  EXPECT_FLOAT_EQ(p.scale, 0.5f);
}

TEST(BuildParams, HstuBackward) {
  Store st;
  ForwardArgs f = hstu_forward(st);
  f.problem.rab = rab_for(st, f, 4);
  f.problem.num_targets = st.ints({1, 0, 2});
  f.problem.target_group_size = 2;
  f.problem.alpha = 0.25f;
  BackwardArgs b = hstu_backward(st, f);
  b.drab = rab_for(st, f, 4);
  b.deterministic = true;
  const detail::Params p = detail::build_backward_params(b);
  EXPECT_EQ(p.score, ScoreFunction::kHstuSilu);
  EXPECT_FLOAT_EQ(p.alpha, 0.25f);
  EXPECT_FLOAT_EQ(p.inv_scaling_seqlen, 1.0f / 5.0f);  // max_seqlen_q
  EXPECT_EQ(p.num_targets, f.problem.num_targets.data);
  EXPECT_EQ(p.num_contexts, nullptr);
  EXPECT_EQ(p.target_group_size, 2);
  EXPECT_EQ(p.rab, f.problem.rab.data);
  EXPECT_EQ(p.rab_heads, 4);
  EXPECT_EQ(p.rab_batch_stride, 4 * 6 * 6);
  EXPECT_EQ(p.rab_head_stride, 6 * 6);
  EXPECT_EQ(p.rab_row_stride, 6);
  EXPECT_EQ(p.drab, b.drab.data);
  EXPECT_EQ(p.drab_row_stride, 6);
  EXPECT_EQ(p.dq.ptr, b.dq.data);
  EXPECT_EQ(p.dk.row_stride, 4 * 64);
  EXPECT_EQ(p.dv.head_stride, 32);
  EXPECT_EQ(p.dout.ptr, b.dout.data);
  EXPECT_EQ(p.o.ptr, nullptr);
  EXPECT_EQ(p.lse, nullptr);
  EXPECT_TRUE(p.deterministic);
}

TEST(BuildParams, ExplicitScalingSeqlenAndEmptyBatch) {
  Store st;
  ForwardArgs f = hstu_forward(st);
  f.problem.scaling_seqlen = 8.0f;
  EXPECT_FLOAT_EQ(detail::build_forward_params(f).inv_scaling_seqlen, 0.125f);
  VarlenSpec s;
  s.len_q = {0, 0};
  s.len_k = {0, 0};
  ForwardArgs empty = hstu_forward(st, s);
  ASSERT_TRUE(Accepted(check_forward(empty)));
  EXPECT_TRUE(std::isfinite(detail::build_forward_params(empty).inv_scaling_seqlen));
}

}  // namespace
