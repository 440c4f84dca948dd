// Scalar dtype conversions against values stated in deepseek-v3-model.md §3, and WeightView
// row ranges.
#include "tensor/dtype.h"
#include "tensor/weight_matrix.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

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

// The bisecting encoder picks what the search over all 127 codes picked (the checkpoint writer
// used that search): every code's value and both midpoints around it, and a sweep of values
// across the range, each with both signs.
TEST(DtypeTest, Fp8E4m3EncoderEqualsTheSearch) {
  auto search = [](float v) {
    const float a = std::abs(v);
    uint8_t best = 0;
    float best_err = INFINITY;
    for (int code = 0; code < 0x7F; ++code) {
      const float err = std::abs(tensor::fp8_e4m3_to_f32(static_cast<uint8_t>(code)) - a);
      if (err < best_err) {
        best_err = err;
        best = static_cast<uint8_t>(code);
      }
    }
    return static_cast<uint8_t>(best | (v < 0 ? 0x80 : 0));
  };
  std::vector<float> values = {0.0f, 448.0f, 449.0f, 1e-12f};
  for (int code = 0; code < 0x7F; ++code) {
    const float v = tensor::fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    values.push_back(v);
    if (code < 0x7E) {
      const float next = tensor::fp8_e4m3_to_f32(static_cast<uint8_t>(code + 1));
      values.push_back((v + next) / 2);  // a tie: the smaller code
      values.push_back(std::nextafter((v + next) / 2, 0.0f));
      values.push_back(std::nextafter((v + next) / 2, 1e9f));
    }
  }
  for (float v = 1e-4f; v < 448.0f; v *= 1.0137f) values.push_back(v);
  for (float v : values) {
    EXPECT_EQ(tensor::f32_to_fp8_e4m3(v), search(v)) << v;
    EXPECT_EQ(tensor::f32_to_fp8_e4m3(-v), search(-v)) << -v;
  }
  EXPECT_EQ(tensor::f32_to_fp8_e4m3(1.0f), 0x38);
  EXPECT_EQ(tensor::f32_to_fp8_e4m3(-448.0f), 0xFE);
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

namespace {

// WeightView::row_range: the same elements as the whole view's rows, and for I8 the same
// per-row scale, bias and sum.
TEST(WeightViewTest, RowRangeReadsTheSameRowsAndRowParameters) {
  for (tensor::DType d : {tensor::DType::kF32, tensor::DType::kBF16, tensor::DType::kI8}) {
    tensor::WeightMatrix m(d, 4, 3);
    for (int64_t i = 0; i < 12; ++i) {
      if (d == tensor::DType::kF32) m.mutable_f32()[i] = float(i) - 5.5f;
      if (d == tensor::DType::kBF16) m.mutable_bf16()[i] = tensor::f32_to_bf16(float(i) - 5.5f);
      if (d == tensor::DType::kI8) m.mutable_i8()[i] = int8_t(i * 7 - 40);
    }
    if (d == tensor::DType::kI8) {
      for (int64_t r = 0; r < 4; ++r) {
        m.mutable_row_scale()[r] = 0.5f + float(r);
        m.mutable_row_bias()[r] = int32_t(10 * r);
      }
      m.finish_int8(true, 0.25f, 3.0f);
    }
    const tensor::WeightView all = m.view(), part = all.row_range(1, 2);
    ASSERT_EQ(part.rows, 2);
    ASSERT_EQ(part.cols, 3);
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(part.at(r, c), all.at(r + 1, c)) << int(d);
      if (d == tensor::DType::kI8) {
        EXPECT_EQ(part.quant.row_scale[r], all.quant.row_scale[r + 1]);
        EXPECT_EQ(part.quant.row_bias[r], all.quant.row_bias[r + 1]);
        EXPECT_EQ(part.quant.row_sum[r], all.quant.row_sum[r + 1]);
      }
    }
  }
}

}  // namespace
