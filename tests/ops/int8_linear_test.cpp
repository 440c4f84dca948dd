// W8A8 linear kernels: every ISA path bit-identical to the integer reference (dynamic and static
// activations, K tails of every vector width), quantization rules, and closeness to f32.
#include "kernels/int8_linear.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/gemm.h"
#include "test_util.h"

namespace {

using tensor::DType;

struct Shape {
  int64_t m, n, k;
};

tensor::WeightMatrix random_int8(int64_t n, int64_t k, uint32_t seed, bool static_act) {
  auto f = testutil::random_vector(size_t(n * k), seed, 1.0f / std::sqrt(float(k)));
  tensor::WeightMatrix w;
  kernels::quantize_weight_rows(f.data(), n, k, w);
  if (static_act) {
    // A static layer: deq_scale = s_in · s_w, quant_bias of either sign, a non-zero offset.
    const float s_in = 0.02f;
    for (int64_t r = 0; r < n; ++r) {
      w.mutable_row_scale()[r] *= s_in;
      w.mutable_row_bias()[r] = int32_t((r * 37) % 201) - 100;
    }
    w.finish_int8(true, s_in, 3.0f);
  }
  // Extreme weights: the -128 the format allows, and +127.
  if (n > 0 && k > 1) {
    w.mutable_i8()[0] = -128;
    w.mutable_i8()[k - 1] = 127;
    const auto v = w.view();
    w.finish_int8(v.quant.static_activation, v.quant.input_scale, v.quant.input_offset);
  }
  return w;
}

class Int8LinearTest : public ::testing::TestWithParam<std::tuple<bool, Shape>> {};

TEST_P(Int8LinearTest, EveryPathEqualsTheReferenceExactly) {
  auto [static_act, s] = GetParam();
  auto w = random_int8(s.n, s.k, 5, static_act);
  auto x = testutil::random_vector(size_t(s.m * s.k), 9, 2.0f);
  if (s.m * s.k > 0) x[0] = 1000.0f;  // saturates the static form
  std::vector<float> ref(size_t(s.m * s.n));
  kernels::linear_int8_reference(x.data(), s.m, w.view(), ref.data(), s.n);
  common::ThreadPool pool(2);
  for (const auto& path : testutil::supported_isa_paths()) {
    kernels::ScopedCpuFeatures isa(path.features);
    std::vector<float> y(size_t(s.m * s.n), -7.0f);
    kernels::linear(x.data(), s.m, w.view(), y.data(), pool);
    ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)))
        << path.name << " m=" << s.m << " n=" << s.n << " k=" << s.k;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Int8LinearTest,
    ::testing::Combine(::testing::Bool(),
                       ::testing::Values(Shape{1, 1, 1}, Shape{1, 37, 19}, Shape{3, 64, 128},
                                         Shape{5, 21, 64}, Shape{6, 19, 95}, Shape{8, 130, 257},
                                         Shape{9, 33, 31}, Shape{2, 7, 200}, Shape{70, 40, 72},
                                         Shape{32, 32, 64}, Shape{33, 50, 130}, Shape{96, 70, 257},
                                         Shape{64, 16, 3}, Shape{130, 33, 65}, Shape{16, 24, 100},
                                         Shape{17, 5, 64},
                                         // the VNNI tiles: 48-row chunks with tails, K % 4
                                         Shape{40, 100, 66}, Shape{36, 97, 13}, Shape{50, 130, 7},
                                         Shape{32, 9, 4},
                                         // decode shapes through the prefetching 64-byte passes
                                         // and both tails
                                         Shape{1, 9, 2069}, Shape{2, 6, 150}, Shape{1, 4, 64})));

TEST_P(Int8LinearTest, KernelsMatchTheDequantizedReference) {
  auto [static_act, s] = GetParam();
  auto w = random_int8(s.n, s.k, 6, static_act);
  auto x = testutil::random_vector(size_t(s.m * s.k), 10, 2.0f);
  std::vector<float> ref(size_t(s.m * s.n)), y(size_t(s.m * s.n));
  kernels::linear_int8_dequant_reference(x.data(), s.m, w.view(), ref.data(), s.n);
  common::ThreadPool pool(2);
  kernels::linear(x.data(), s.m, w.view(), y.data(), pool);
  EXPECT_LT(testutil::max_rel_error(y, ref), 1e-5);
}

TEST(Int8LinearTest, DynamicQuantizationIsPerTokenSymmetric) {
  const float x[2][4] = {{0.5f, -1.0f, 0.25f, 0.0f}, {0, 0, 0, 0}};
  int8_t q[8];
  float scale[2];
  kernels::quantize_activations(&x[0][0], 2, 4, {}, q, scale);
  EXPECT_FLOAT_EQ(scale[0], 1.0f / 127.0f);
  EXPECT_EQ(q[0], 64);  // 63.5 rounds to even
  EXPECT_EQ(q[1], -127);
  EXPECT_EQ(q[2], 32);  // 31.75
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(scale[1], 0.0f);  // an all-zero token stays zero
  for (int i = 4; i < 8; ++i) EXPECT_EQ(q[i], 0);
}

// The vectorized quantizer against the rule written out per element, over rows long enough for
// the vector loop and its tail, dynamic and static (with saturation and ties).
TEST(Int8LinearTest, QuantizationFollowsTheRuleElementByElement) {
  const int64_t m = 3, k = 53;
  auto x = testutil::random_vector(size_t(m * k), 17, 3.0f);
  x[5] = 2.5f;   // a tie under the static scale below
  x[6] = 90.0f;  // saturates
  for (bool is_static : {false, true}) {
    tensor::Int8Quant quant;
    quant.static_activation = is_static;
    quant.input_scale = 0.5f;
    quant.input_offset = is_static ? 2.0f : 0.0f;
    std::vector<int8_t> q(size_t(m * k));
    std::vector<float> scale(static_cast<size_t>(m));
    kernels::quantize_activations(x.data(), m, k, quant, q.data(), scale.data());
    for (int64_t r = 0; r < m; ++r) {
      float amax = 0;
      for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::abs(x[size_t(r * k + c)]));
      const float inv = is_static ? 1.0f / 0.5f : 127.0f / amax;
      const float off = is_static ? 2.0f : 0.0f;
      EXPECT_EQ(scale[size_t(r)], is_static ? 1.0f : amax / 127.0f);
      for (int64_t c = 0; c < k; ++c) {
        const float v = std::nearbyint(x[size_t(r * k + c)] * inv + off);
        EXPECT_EQ(q[size_t(r * k + c)], int8_t(std::clamp(v, -128.0f, 127.0f)))
            << (is_static ? "static" : "dynamic") << " row " << r << " col " << c;
      }
    }
  }
}

TEST(Int8LinearTest, StaticQuantizationUsesScaleOffsetAndClamps) {
  tensor::Int8Quant quant;
  quant.static_activation = true;
  quant.input_scale = 0.5f;
  quant.input_offset = -3.0f;
  const float x[4] = {1.0f, 100.0f, -100.0f, 0.26f};
  int8_t q[4];
  float scale;
  kernels::quantize_activations(x, 1, 4, quant, q, &scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(q[0], -1);    // 2 - 3
  EXPECT_EQ(q[1], 127);   // 197 clamps
  EXPECT_EQ(q[2], -128);  // -203 clamps
  EXPECT_EQ(q[3], -2);    // 0.52 - 3 = -2.48
}

TEST(Int8LinearTest, WeightQuantizationErrorIsAtMostHalfAStep) {
  const int64_t n = 16, k = 300;
  auto f = testutil::random_vector(size_t(n * k), 3);
  tensor::WeightMatrix w;
  kernels::quantize_weight_rows(f.data(), n, k, w);
  const auto v = w.view();
  for (int64_t r = 0; r < n; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::abs(f[r * k + c]));
    EXPECT_FLOAT_EQ(v.quant.row_scale[r], amax / 127.0f);
    int32_t sum = 0;
    for (int64_t c = 0; c < k; ++c) {
      EXPECT_LE(std::abs(v.at(r, c) - f[r * k + c]), v.quant.row_scale[r] * 0.5001f);
      sum += v.i8()[r * k + c];
    }
    EXPECT_EQ(v.quant.row_sum[r], sum);
  }
}

TEST(Int8LinearTest, CloseToTheF32Product) {
  const int64_t m = 8, n = 96, k = 512;
  auto f = testutil::random_vector(size_t(n * k), 21, 1.0f / std::sqrt(float(k)));
  tensor::WeightMatrix wq, wf(DType::kF32, n, k);
  std::memcpy(wf.mutable_f32(), f.data(), f.size() * sizeof(float));
  kernels::quantize_weight_rows(f.data(), n, k, wq);
  auto x = testutil::random_vector(size_t(m * k), 22);
  std::vector<float> yq(size_t(m * n)), yf(size_t(m * n));
  common::ThreadPool pool(2);
  kernels::linear(x.data(), m, wq.view(), yq.data(), pool);
  kernels::linear_reference(x.data(), m, wf.view(), yf.data(), n);
  double num = 0, den = 0;
  for (size_t i = 0; i < yq.size(); ++i) {
    num += (yq[i] - yf[i]) * (yq[i] - yf[i]);
    den += yf[i] * yf[i];
  }
  // Two 8-bit roundings of normal data: about 1% relative error, far from 0 or 100%.
  EXPECT_LT(std::sqrt(num / den), 0.03);
  EXPECT_GT(std::sqrt(num / den), 1e-4);
}

}  // namespace
