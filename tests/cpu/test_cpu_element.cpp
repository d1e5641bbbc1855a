// The host fp16 / bf16 conversions of src/cpu/element_cpu.h: exact round trips, round to nearest even,
// subnormals, overflow to infinity, NaN.
#include <cmath>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

#include "cpu/element_cpu.h"

namespace cuteattn::detail::cpu {
namespace {

TEST(ElementCpu, Fp16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = fp16_to_float(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f))));
      continue;
    }
    ASSERT_EQ(float_to_fp16(f), bits) << "fp16 bits " << h;
  }
}

TEST(ElementCpu, Bf16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = bf16_to_float(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(float_to_bf16(f), bits) << "bf16 bits " << h;
  }
}

// Midpoints between neighbours round to the even one; anything else to the nearest.
TEST(ElementCpu, RoundsToNearestEven) {
  for (uint32_t h = 0x0001u; h < 0x7bffu; h += 37) {
    const float a = fp16_to_float(static_cast<uint16_t>(h)), b = fp16_to_float(static_cast<uint16_t>(h + 1));
    const uint16_t even = (h & 1u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    EXPECT_EQ(float_to_fp16(a + 0.5f * (b - a)), even) << h;
    EXPECT_EQ(float_to_fp16(a + 0.25f * (b - a)), h) << h;
    EXPECT_EQ(float_to_fp16(a + 0.75f * (b - a)), h + 1) << h;
    EXPECT_EQ(float_to_fp16(-(a + 0.5f * (b - a))), even | 0x8000u) << h;
  }
  for (uint32_t h = 0x0001u; h < 0x7f7fu; h += 41) {
    const float a = bf16_to_float(static_cast<uint16_t>(h)), b = bf16_to_float(static_cast<uint16_t>(h + 1));
    const uint16_t even = (h & 1u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    EXPECT_EQ(float_to_bf16(a + 0.5f * (b - a)), even) << h;
    EXPECT_EQ(float_to_bf16(a + 0.25f * (b - a)), h) << h;
    EXPECT_EQ(float_to_bf16(a + 0.75f * (b - a)), h + 1) << h;
  }
}

TEST(ElementCpu, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bffu);
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bffu);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00u);
  EXPECT_EQ(float_to_fp16(1e10f), 0x7c00u);
  EXPECT_EQ(float_to_fp16(-inf), 0xfc00u);
  EXPECT_EQ(float_to_fp16(5.9604644775390625e-8f), 0x0001u);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(2.9802322387695312e-8f), 0x0000u);  // half of it: ties to even (0)
  EXPECT_EQ(float_to_fp16(4.5e-8f), 0x0001u);
  EXPECT_EQ(float_to_fp16(6.103515625e-05f), 0x0400u);        // smallest normal
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000u);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::nanf("")))));
  EXPECT_EQ(float_to_bf16(inf), 0x7f80u);
  EXPECT_EQ(float_to_bf16(3.4e38f), 0x7f80u);  // rounds past the largest finite bf16
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80u);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_EQ(round_to(DType::kFloat32, 0.1f), 0.1f);
  EXPECT_EQ(round_to(DType::kBFloat16, 1.0f + 1.0f / 256.0f), 1.0f);  // tie to even
}

}  // namespace
}  // namespace cuteattn::detail::cpu
