// Host conversions between float and the 16-bit element types (fp16, bf16), round to nearest even,
// and typed load/store of one element of a tensor whose dtype is known only at run time.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuteattn/types.h"

namespace cuteattn::detail::cpu {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
    return bits_float(float_bits(mag) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;               // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;              // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                                    // below the smallest normal 2^-14
    // Adding 0.5 (2^-1) puts the subnormal bits at the bottom of the mantissa with the FPU rounding to even.
    const float shifted = bits_float(abs) + 0.5f;
    return sign | static_cast<uint16_t>(float_bits(shifted) - float_bits(0.5f));
  }
  const uint32_t rounding = 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((abs - (112u << 23) + rounding) >> 13);
}

// Load/store element `index` of a buffer of the given floating dtype.
inline float load_element(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

inline void store_element(void* base, DType dtype, int64_t index, float value) {
  switch (dtype) {
    case DType::kFloat16: static_cast<uint16_t*>(base)[index] = float_to_fp16(value); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[index] = float_to_bf16(value); break;
    default: static_cast<float*>(base)[index] = value; break;
  }
}

// Round a float to the nearest value representable in `dtype` (identity for fp32).
inline float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::kFloat16: return fp16_to_float(float_to_fp16(value));
    case DType::kBFloat16: return bf16_to_float(float_to_bf16(value));
    default: return value;
  }
}

// Contiguous row conversions, the per-tile load/store of the tiled backend.
inline void load_row(const void* base, DType dtype, int64_t offset, int64_t n, float* dst) {
  switch (dtype) {
    case DType::kFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t c = 0; c < n; ++c) dst[c] = fp16_to_float(src[c]);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t c = 0; c < n; ++c) dst[c] = bf16_to_float(src[c]);
      break;
    }
    default: std::memcpy(dst, static_cast<const float*>(base) + offset, n * sizeof(float)); break;
  }
}

inline void store_row(void* base, DType dtype, int64_t offset, int64_t n, const float* src) {
  switch (dtype) {
    case DType::kFloat16: {
      uint16_t* dst = static_cast<uint16_t*>(base) + offset;
      for (int64_t c = 0; c < n; ++c) dst[c] = float_to_fp16(src[c]);
      break;
    }
    case DType::kBFloat16: {
      uint16_t* dst = static_cast<uint16_t*>(base) + offset;
      for (int64_t c = 0; c < n; ++c) dst[c] = float_to_bf16(src[c]);
      break;
    }
    default: std::memcpy(static_cast<float*>(base) + offset, src, n * sizeof(float)); break;
  }
}

}  // namespace cuteattn::detail::cpu
