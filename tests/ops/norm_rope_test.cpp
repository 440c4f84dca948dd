// RMSNorm, SwiGLU, YaRN RoPE and exp kernels against their references and the documented
// numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/activation.h"
#include "kernels/exp_row.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/vec_exp.h"
#include "test_util.h"

namespace {

TEST(NormTest, RmsNormMatchesReference) {
  for (int64_t n : {1, 7, 16, 100, 7168}) {
    const int64_t rows = 3, stride = n + 5;
    auto x = testutil::random_vector(rows * stride, 1);
    auto w = testutil::random_vector(n, 2);
    std::vector<float> a(rows * n), b(rows * n);
    kernels::rms_norm(x.data(), rows, n, stride, w.data(), 1e-6f, a.data(), n);
    kernels::rms_norm_reference(x.data(), rows, n, stride, w.data(), 1e-6f, b.data(), n);
    EXPECT_LT(testutil::max_rel_error(a, b), 2e-6) << "n=" << n;
  }
}

TEST(ActivationTest, SiluMulMatchesReference) {
  auto gu = testutil::random_vector(4 * 2 * 50, 3, 3.0f);
  std::vector<float> a(4 * 50), b(4 * 50);
  kernels::silu_mul(gu.data(), 4, 50, a.data());
  kernels::silu_mul_reference(gu.data(), 4, 50, b.data());
  EXPECT_LT(testutil::max_rel_error(a, b), 1e-6);
}

kernels::YarnConfig v3_yarn() {
  kernels::YarnConfig y;
  y.enabled = true;
  y.factor = 40;
  y.original_max_position_embeddings = 4096;
  y.beta_fast = 32;
  y.beta_slow = 1;
  y.mscale = 1.0;
  y.mscale_all_dim = 1.0;
  return y;
}

TEST(RopeTest, YarnParamsOfDeepSeekV3) {
  auto p = kernels::compute_rope_params(64, 10000.0, 192, v3_yarn());
  ASSERT_EQ(p.inv_freq.size(), 32u);
  // deepseek-v3-model.md §5: indices < 10 keep the base frequency, >= 23 are divided by 40.
  const double expected[] = {
      1,           0.749894,    0.562341,   0.421697,  0.316228,    0.237137,    0.177828,
      0.133352,    0.1,         0.0749894,  0.0562341, 0.0390069,   0.0268794,   0.0183781,
      0.012448,    0.00833451,  0.0055,     0.003562,  0.00224937,  0.00137051,  0.000790569,
      0.00041499,  0.000177828, 3.3338e-05, 2.5e-05,   1.87474e-05, 1.40585e-05, 1.05424e-05,
      7.90569e-06, 5.92843e-06, 4.4457e-06, 3.3338e-06};
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(p.inv_freq[i], expected[i], expected[i] * 1e-4) << i;
  EXPECT_NEAR(p.softmax_scale, 0.135233779, 1e-8);
  EXPECT_DOUBLE_EQ(p.cos_sin_scale, 1.0);
}

TEST(RopeTest, FastMatchesReferenceAndRotatesInterleavedPairs) {
  auto p = kernels::compute_rope_params(16, 10000.0, 48, v3_yarn());
  const int heads = 3;
  const int64_t T = 5, head_stride = 20, token_stride = heads * head_stride;
  std::vector<int32_t> positions = {0, 1, 17, 4095, 163839};
  auto x = testutil::random_vector(T * token_stride, 5);
  auto a = x, b = x;
  kernels::apply_rope(a.data(), T, heads, token_stride, head_stride, positions.data(), p);
  kernels::apply_rope_reference(b.data(), T, heads, token_stride, head_stride, positions.data(), p);
  EXPECT_LT(testutil::max_rel_error(a, b), 1e-6);
  // Position 0 is the identity; floats past the rope dims are untouched.
  for (int i = 0; i < 16; ++i) EXPECT_EQ(a[i], x[i]);
  for (int i = 16; i < 20; ++i) EXPECT_EQ(a[token_stride + i], x[token_stride + i]);
  // Pair (0, 1) at position 1 rotates by inv_freq[0] = 1 radian.
  const float c = std::cos(1.0f), s = std::sin(1.0f);
  EXPECT_NEAR(a[token_stride], x[token_stride] * c - x[token_stride + 1] * s, 1e-6);
  EXPECT_NEAR(a[token_stride + 1], x[token_stride] * s + x[token_stride + 1] * c, 1e-6);
}

// exp8 (softmax rows) against std::exp: within 2 ulp over the range softmax feeds it, 0 below.
TEST(VecExpTest, MatchesStdExp) {
  std::vector<float> xs;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) xs.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-8f, -1e-8f, 0.5f, -0.5f, 88.0f}) xs.push_back(x);
  xs.resize((xs.size() + 7) / 8 * 8, 0.0f);
  double worst = 0;
  for (size_t i = 0; i < xs.size(); i += 8) {
    alignas(32) float out[8];
    _mm256_store_ps(out, kernels::exp8(_mm256_loadu_ps(&xs[i])));
    for (int j = 0; j < 8; ++j) {
      const double want = std::exp(double(xs[i + j]));
      worst = std::max(worst, std::abs(out[j] - want) / want);
    }
  }
  EXPECT_LT(worst, 2.5e-7);
  alignas(32) float out[8];
  _mm256_store_ps(out, kernels::exp8(_mm256_set1_ps(-200.0f)));
  EXPECT_EQ(out[0], 0.0f);
}

void expect_exp_shifted_matches_std_exp();

// exp_shifted (the sampler's weights, in double) against std::exp: within 2 ulp of it from
// overflow down through the subnormals, exactly 1 at the shift, 0 for -inf, NaN and past the
// last subnormal; the tail past the last group of lanes gets the same function. On every ISA
// path, each giving the AVX2 path's bits.
TEST(ExpRowTest, ExpShiftedMatchesStdExp) {
  for (const auto& path : testutil::supported_isa_paths()) {
    SCOPED_TRACE(path.name);
    kernels::ScopedCpuFeatures isa(path.features);
    expect_exp_shifted_matches_std_exp();
  }
}

TEST(ExpRowTest, EveryPathGivesTheSameBits) {
  auto x = testutil::random_vector(4099, 3, 60.0f);
  for (float v : {-760.0f, -745.0f, -744.5f, -708.5f, 709.5f, 720.0f}) x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> avx2(x.size()), got(x.size());
  double avx2_sum;
  {
    kernels::ScopedCpuFeatures isa({});
    kernels::exp_shifted(x.data(), n, 1.5f, 1.0 / 0.7, avx2.data());
    avx2_sum = kernels::sum_exp_shifted(x.data(), n, 30.0);
  }
  for (const auto& path : testutil::supported_isa_paths()) {
    SCOPED_TRACE(path.name);
    kernels::ScopedCpuFeatures isa(path.features);
    kernels::exp_shifted(x.data(), n, 1.5f, 1.0 / 0.7, got.data());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], avx2[i]) << "exp at " << x[i];
    EXPECT_NEAR(kernels::sum_exp_shifted(x.data(), n, 30.0), avx2_sum, 1e-13 * avx2_sum);
  }
}

void expect_exp_shifted_matches_std_exp() {
  std::vector<float> xs;
  for (float x = -760.0f; x <= 720.0f; x += 0.173f) xs.push_back(x);
  for (float x = -3.0f; x <= 0.0f; x += 1.0f / 1024) xs.push_back(x);
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, 1e-8f, -1e-8f, -745.0f, -744.5f, -708.5f, 709.5f, -inf, inf})
    xs.push_back(x);
  xs.push_back(std::nanf(""));
  for (double scale : {1.0, 1.0 / 0.6, 0.5}) {
    for (size_t n : {xs.size(), xs.size() - 1, size_t{3}, size_t{1}}) {
      const std::vector<float> in(xs.end() - std::ptrdiff_t(n), xs.end());
      std::vector<double> got(n), want(n);
      kernels::exp_shifted(in.data(), int64_t(n), 0.0f, scale, got.data());
      kernels::exp_shifted_reference(in.data(), int64_t(n), 0.0f, scale, want.data());
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        const bool same =
            got[i] == want[i] ||
            (std::isfinite(want[i]) &&
             std::abs(got[i] - want[i]) <= 2 * std::max(std::abs(want[i]) * 2.220446049250313e-16,
                                                        std::numeric_limits<double>::denorm_min()));
        if (!same && bad++ < 5)
          ADD_FAILURE() << "exp(" << in[i] << " * " << scale << "): " << got[i] << " against "
                        << want[i];
      }
      EXPECT_EQ(bad, 0u) << "n=" << n << " scale=" << scale;
    }
  }
  // The shift is subtracted in f32 first, as the sampler's scalar loop did; the top is exactly 1.
  const float row[5] = {3.5f, -inf, 1.25f, std::nanf(""), 3.5f};
  double out[5];
  kernels::exp_shifted(row, 5, 3.5f, 1.0 / 0.7, out);
  EXPECT_EQ(out[0], 1.0);
  EXPECT_EQ(out[1], 0.0);
  EXPECT_EQ(out[3], 0.0);
  EXPECT_EQ(out[4], 1.0);
  EXPECT_NEAR(out[2], std::exp(double(1.25f - 3.5f) / 0.7), 1e-16);
}

// sum_exp_shifted (log-softmax denominators): the reference's sum up to the order of the
// additions (1e-12 over 129k terms), NaN skipped, for lengths that end inside a group of lanes,
// on every ISA path.
TEST(ExpRowTest, SumExpShiftedMatchesReference) {
  auto x = testutil::random_vector(129280, 5, 8.0f);
  x[17] = std::nanf("");
  x[18] = -std::numeric_limits<float>::infinity();
  for (const auto& path : testutil::supported_isa_paths()) {
    SCOPED_TRACE(path.name);
    kernels::ScopedCpuFeatures isa(path.features);
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{19}, int64_t{4097}, int64_t{129280}}) {
      const double shift = 7.5;
      const double got = kernels::sum_exp_shifted(x.data(), n, shift);
      const double want = kernels::sum_exp_shifted_reference(x.data(), n, shift);
      EXPECT_NEAR(got, want, 1e-12 * want) << "n=" << n;
      EXPECT_GT(want, 0.0);
    }
  }
}

}  // namespace
