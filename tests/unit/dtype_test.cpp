// Scalar dtype conversions against values stated in deepseek-v3-model.md §3.
#include "tensor/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace {

TEST(DtypeTest, Fp8E4m3KnownValues) {
  EXPECT_EQ(tensor::fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(tensor::fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(tensor::fp8_e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(tensor::fp8_e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(tensor::fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(tensor::fp8_e4m3_to_f32(0x3C), 1.5f);
  EXPECT_TRUE(std::isnan(tensor::fp8_e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(tensor::fp8_e4m3_to_f32(0xFF)));
  EXPECT_EQ(tensor::fp8_e4m3_to_f32(0x80), 0.0f);
}

TEST(DtypeTest, Bf16RoundTripAndRounding) {
  for (float v : {0.0f, 1.0f, -2.5f, 3.140625f, std::ldexp(1.0f, -70), 65536.0f, -0.0078125f}) {
    EXPECT_EQ(tensor::bf16_to_f32(tensor::f32_to_bf16(v)), v);
  }
  // 1 + 2^-8 is halfway between two bf16 values; ties go to even (1.0).
  EXPECT_EQ(tensor::bf16_to_f32(tensor::f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(tensor::bf16_to_f32(tensor::f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))),
            1.0f + std::ldexp(1.0f, -6));
}

TEST(DtypeTest, F16KnownValues) {
  EXPECT_EQ(tensor::f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(tensor::f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(tensor::f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(tensor::f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(tensor::f16_to_f32(0x7C00)));
}

TEST(DtypeTest, SafetensorsNames) {
  EXPECT_EQ(tensor::dtype_from_safetensors("F8_E4M3"), tensor::DType::kF8E4M3);
  EXPECT_EQ(tensor::dtype_from_safetensors("BF16"), tensor::DType::kBF16);
  EXPECT_FALSE(tensor::dtype_from_safetensors("F64").has_value());
  EXPECT_EQ(tensor::dtype_size_bytes(tensor::DType::kF32), 4);
}

}  // namespace
