// The tile kernels of the CPU tiled backend (src/cpu/tile_math.h): the GEMM against a plain triple loop for
// every row remainder, and exp2 against std::exp2.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cpu/tile_math.h"

namespace cuteattn::detail::cpu {
namespace {

TEST(TileMath, GemmMatchesPlainLoops) {
  std::mt19937_64 rng(test::test_seed());
  std::normal_distribution<float> normal;
  for (int64_t M : {1, 2, 5, 6, 7, 13, 64}) {
    for (int64_t N : {16, 48}) {
      for (int64_t K : {1, 3, 64, 130}) {
        const int64_t lda = K + 3, ldb = N + 5, ldc = N + 7;
        std::vector<float> A(M * lda), B(K * ldb), C(M * ldc);
        for (float& x : A) x = normal(rng);
        for (float& x : B) x = normal(rng);
        for (float& x : C) x = normal(rng);
        std::vector<float> expected = C;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double acc = expected[i * ldc + j];
            for (int64_t k = 0; k < K; ++k) acc += double(A[i * lda + k]) * double(B[k * ldb + j]);
            expected[i * ldc + j] = static_cast<float>(acc);
          }
        gemm_acc(M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const float tol = j < N ? 1e-5f * (1.0f + std::sqrt(static_cast<float>(K))) : 0.0f;  // padding untouched
            ASSERT_NEAR(C[i * ldc + j], expected[i * ldc + j], tol) << "M " << M << " N " << N << " K " << K;
          }
      }
    }
  }
}

TEST(TileMath, Exp2) {
  double worst = 0.0;
  for (float x = -126.0f; x <= 127.0f; x += 0.0137f) {
    const double rel = std::fabs(exp2_fast(x) / std::exp2(double(x)) - 1.0);
    worst = std::max(worst, rel);
  }
  EXPECT_LT(worst, 5e-7);
  EXPECT_EQ(exp2_fast(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp2_fast(-1000.0f), 0.0f);
  EXPECT_EQ(exp2_fast(0.0f), 1.0f);
  std::vector<float> row(16);
  for (int c = 0; c < 16; ++c) row[c] = c == 3 ? -std::numeric_limits<float>::infinity() : 0.25f * c;
  exp2_sub_inplace(row.data(), 16, 1.0f);
  for (int c = 0; c < 16; ++c) EXPECT_NEAR(row[c], c == 3 ? 0.0 : std::exp2(0.25 * c - 1.0), 1e-6 * row[c]);
  EXPECT_EQ(max_of(row.data(), 16), row[15]);
}

}  // namespace
}  // namespace cuteattn::detail::cpu
