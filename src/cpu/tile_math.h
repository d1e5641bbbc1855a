// Float tile kernels of the CPU tiled backend, on 8-float vectors (GCC/Clang vector extensions): a
// register-blocked GEMM on row-major tiles, and the exp2 / max / sum row operations of the online softmax.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

// Without AVX, GCC notes (at the end of each translation unit) that 32-byte vectors are passed differently;
// these helpers are inline-only, so the note does not apply.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace cuteattn::detail::cpu {

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
inline v8f splat8(float x) { return v8f{x, x, x, x, x, x, x, x}; }

// c + a * b, fused where the target has FMA (GCC does not contract in ISO C++ mode).
inline v8f fma8(v8f a, v8f b, v8f c) {
#if defined(__AVX2__) && defined(__FMA__)
  return reinterpret_cast<v8f>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b),
                                                reinterpret_cast<__m256>(c)));
#else
  return c + a * b;
#endif
}

// C[kMr x 16] += A[kMr x K] * B[K x 16]: 2*kMr accumulators stay in registers, A is broadcast one
// element at a time and B is read one 16-float row per step.
template <int kMr>
inline void gemm_micro(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                       int64_t ldc) {
  v8f c0[kMr], c1[kMr];
  for (int r = 0; r < kMr; ++r) {
    c0[r] = load8(C + r * ldc);
    c1[r] = load8(C + r * ldc + 8);
  }
  for (int64_t k = 0; k < K; ++k) {
    const v8f b0 = load8(B + k * ldb), b1 = load8(B + k * ldb + 8);
    for (int r = 0; r < kMr; ++r) {
      const v8f a = splat8(A[r * lda + k]);
      c0[r] = fma8(a, b0, c0[r]);
      c1[r] = fma8(a, b1, c1[r]);
    }
  }
  for (int r = 0; r < kMr; ++r) {
    store8(C + r * ldc, c0[r]);
    store8(C + r * ldc + 8, c1[r]);
  }
}

// C[M x N] += A[M x K] * B[K x N], row-major with leading dimensions; N must be a multiple of 16.
inline void gemm_acc(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                     float* C, int64_t ldc) {
  for (int64_t j = 0; j < N; j += 16) {
    int64_t i = 0;
    for (; i + 6 <= M; i += 6) gemm_micro<6>(K, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc);
    const float* a = A + i * lda;
    float* c = C + i * ldc + j;
    switch (M - i) {
      case 5: gemm_micro<5>(K, a, lda, B + j, ldb, c, ldc); break;
      case 4: gemm_micro<4>(K, a, lda, B + j, ldb, c, ldc); break;
      case 3: gemm_micro<3>(K, a, lda, B + j, ldb, c, ldc); break;
      case 2: gemm_micro<2>(K, a, lda, B + j, ldb, c, ldc); break;
      case 1: gemm_micro<1>(K, a, lda, B + j, ldb, c, ldc); break;
      default: break;
    }
  }
}

inline int64_t round_up16(int64_t n) { return (n + 15) / 16 * 16; }

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols.
inline void transpose(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

// 2^x within a few float ulps; x <= -127 (and -inf) gives 0. Round-to-nearest split
// x = k + f, |f| <= 1/2, then a degree-7 Taylor polynomial of e^(f ln 2) (truncation error < 6e-9), and 2^k
// built in the exponent bits. Written on 8-float vectors because the compiler will not if-convert the clamps.
inline v8f exp2_v8(v8f x) {
  x = x < splat8(-127.0f) ? splat8(-127.0f) : x;
  x = x > splat8(127.0f) ? splat8(127.0f) : x;
  const v8i k = __builtin_convertvector(x + 127.5f, v8i) - 127;  // x + 127.5 > 0: truncation is floor
  const v8f f = (x - __builtin_convertvector(k, v8f)) * 0.6931471805599453f;
  v8f poly = splat8(1.0f / 5040.0f);
  poly = fma8(poly, f, splat8(1.0f / 720.0f));
  poly = fma8(poly, f, splat8(1.0f / 120.0f));
  poly = fma8(poly, f, splat8(1.0f / 24.0f));
  poly = fma8(poly, f, splat8(1.0f / 6.0f));
  poly = fma8(poly, f, splat8(0.5f));
  poly = fma8(poly, f, splat8(1.0f));
  poly = fma8(poly, f, splat8(1.0f));
  const v8i bits = (k + 127) << 23;  // k = -127 gives the bit pattern of 0.0f
  return reinterpret_cast<v8f>(bits) * poly;
}

inline float exp2_fast(float x) { return exp2_v8(splat8(x))[0]; }

// x[c] = 2^(x[c] - sub) for c < n; n must be a multiple of 8.
inline void exp2_sub_inplace(float* x, int64_t n, float sub) {
  for (int64_t c = 0; c < n; c += 8) store8(x + c, exp2_v8(load8(x + c) - sub));
}

// max / sum of x[0..n); n must be a multiple of 8.
inline float max_of(const float* x, int64_t n) {
  v8f m = splat8(-__builtin_inff());
  for (int64_t c = 0; c < n; c += 8) {
    const v8f v = load8(x + c);
    m = v > m ? v : m;
  }
  float r = m[0];
  for (int l = 1; l < 8; ++l) r = m[l] > r ? m[l] : r;
  return r;
}
inline float sum_of(const float* x, int64_t n) {
  v8f s = v8f{};
  for (int64_t c = 0; c < n; c += 8) s += load8(x + c);
  float r = 0.0f;
  for (int l = 0; l < 8; ++l) r += s[l];
  return r;
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace cuteattn::detail::cpu
