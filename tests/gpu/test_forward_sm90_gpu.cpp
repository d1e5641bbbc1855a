// GPU tests of the sm90 forward kernel (TMA + wgmma, warp-specialised): O and LSE against the float64 CPU
// oracle under the FlashAttention tolerance rule (2x the error of a plain bf16/fp16 computation), every output
// element written over a NaN poison, for odd lengths, s_q != s_k, varlen with empty sequences, GQA, causal,
// sliding windows, softcap, rows without visible keys and every head-dim bucket of the build.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cuteattn/attention.h"
#include "gpu/device_case.h"

namespace cuteattn::test {
namespace {

bool is_hopper() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major == 9;
}

void check_forward(const CaseConfig& cfg) { check_forward_on_device(cfg, Backend::kSm90); }

CaseConfig fixed(DType dt, int64_t b, int64_t h, int64_t hk, int64_t d, int64_t sq, int64_t sk) {
  CaseConfig cfg;
  cfg.dtype = dt;
  cfg.batch = b;
  cfg.heads = h;
  cfg.heads_k = hk;
  cfg.head_dim = d;
  cfg.seqlen_q = sq;
  cfg.seqlen_k = sk;
  return cfg;
}

CaseConfig varlen(DType dt, std::vector<int32_t> lens_q, std::vector<int32_t> lens_k, int64_t h, int64_t hk,
                  int64_t d) {
  CaseConfig cfg;
  cfg.dtype = dt;
  cfg.seqlens_q = std::move(lens_q);
  cfg.seqlens_k = std::move(lens_k);
  cfg.batch = static_cast<int64_t>(cfg.seqlens_q.size());
  cfg.heads = h;
  cfg.heads_k = hk;
  cfg.head_dim = d;
  return cfg;
}

class Sm90Forward : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!is_hopper()) GTEST_SKIP() << "the sm90 kernels need a Hopper GPU";
  }
};

TEST_F(Sm90Forward, OddLengths) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t s : {1, 113, 1023}) check_forward(fixed(dt, 2, 3, 3, 128, s, s));
  }
  check_forward(fixed(DType::kBFloat16, 1, 1, 1, 128, 4224, 4224));
}

TEST_F(Sm90Forward, DifferentQueryAndKeyLengths) {
  check_forward(fixed(DType::kBFloat16, 2, 2, 2, 128, 113, 300));
  check_forward(fixed(DType::kFloat16, 1, 2, 2, 128, 257, 97));
  check_forward(fixed(DType::kBFloat16, 1, 2, 2, 128, 1, 4224));
}

TEST_F(Sm90Forward, Causal) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t s : {1, 113, 1023}) {
      CaseConfig cfg = fixed(dt, 1, 2, 2, 128, s, s);
      cfg.causal = true;
      check_forward(cfg);
    }
  }
  CaseConfig big = fixed(DType::kBFloat16, 1, 1, 1, 128, 4224, 4224);
  big.causal = true;
  check_forward(big);
  // Bottom-right aligned: with s_q > s_k the first s_q - s_k rows see no key (O = 0, LSE = -inf).
  CaseConfig cfg = fixed(DType::kBFloat16, 2, 2, 2, 128, 300, 113);
  cfg.causal = true;
  check_forward(cfg);
  cfg = fixed(DType::kBFloat16, 2, 2, 2, 128, 113, 700);
  cfg.causal = true;
  check_forward(cfg);
}

TEST_F(Sm90Forward, SlidingWindow) {
  CaseConfig cfg = fixed(DType::kBFloat16, 2, 2, 2, 128, 1023, 1023);
  cfg.window_left = 100;
  cfg.window_right = 37;
  check_forward(cfg);
  cfg.window_left = 300;
  cfg.window_right = -1;
  check_forward(cfg);
  cfg.window_left = -1;
  cfg.window_right = 5;
  check_forward(cfg);
  cfg = fixed(DType::kFloat16, 1, 2, 2, 128, 500, 777);
  cfg.window_left = 0;  // each row sees its own key only
  cfg.window_right = 0;
  check_forward(cfg);
}

TEST_F(Sm90Forward, Softcap) {
  CaseConfig cfg = fixed(DType::kBFloat16, 2, 2, 2, 128, 333, 333);
  cfg.softcap = 5.0f;
  check_forward(cfg);
  cfg.causal = true;
  cfg.softmax_scale = 0.3f;
  check_forward(cfg);
}

TEST_F(Sm90Forward, GroupedQueryAttention) {
  check_forward(fixed(DType::kBFloat16, 2, 8, 2, 128, 257, 257));
  CaseConfig cfg = fixed(DType::kFloat16, 1, 6, 1, 128, 300, 500);
  cfg.causal = true;
  check_forward(cfg);
}

TEST_F(Sm90Forward, VarlenWithEmptySequences) {
  for (bool causal : {false, true}) {
    CaseConfig cfg = varlen(DType::kBFloat16, {0, 113, 1, 0, 300, 1023}, {}, 4, 2, 128);
    cfg.causal = causal;
    check_forward(cfg);
    cfg = varlen(DType::kFloat16, {5, 0, 200, 129, 64}, {300, 7, 0, 129, 1000}, 2, 2, 128);
    cfg.causal = causal;
    check_forward(cfg);
  }
  CaseConfig cfg = varlen(DType::kBFloat16, {100, 250, 0, 77}, {}, 2, 1, 128);
  cfg.window_left = 50;
  cfg.window_right = 10;
  cfg.softcap = 10.0f;
  check_forward(cfg);
}

// Every other bucket of the build (d below a bucket is served zero-padded by that bucket).
TEST_F(Sm90Forward, HeadDims) {
  for (int64_t d : {64, 96, 192, 256, 80, 136}) {
    for (bool causal : {false, true}) {
      CaseConfig cfg = fixed(d % 64 == 0 ? DType::kBFloat16 : DType::kFloat16, 2, 2, 1, d, 300, 300);
      cfg.causal = causal;
      Case probe = Case::make(cfg, 1);
      DeviceCase dc(probe, Backend::kSm90, DeviceCase::Pass::kForward);
      ForwardArgs args = dc.forward_args();
      Backend chosen = Backend::kAuto;
      args.problem.backend = Backend::kAuto;
      ASSERT_TRUE(resolve_backend(args, &chosen).ok());
      if (chosen != Backend::kSm90) {
        ADD_FAILURE() << "head dim " << d << ": no sm90 kernel in this build (CUTEATTN_HDIMS); not tested";
        continue;
      }
      check_forward(cfg);
    }
  }
}

}  // namespace
}  // namespace cuteattn::test
