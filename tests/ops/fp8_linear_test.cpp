// FP8 e4m3 weights held as stored, with 128-row x 2^n-column block scales: every linear path on
// every kernel path this machine has gives each output the bits the AVX2 F32 kernels give on
// the dequantized weights (fp8 · scale in f32), for decode- and prefill-sized batches, shapes
// with K tails and partial scale blocks, and every finite code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/gemm.h"
#include "test_util.h"

namespace {

using tensor::DType;
using tensor::WeightMatrix;

// A random FP8 matrix (NaN codes left out) with scales of several magnitudes, and its F32
// dequantization.
struct Fp8Pair {
  WeightMatrix fp8, f32;
};
Fp8Pair random_fp8(int64_t rows, int64_t cols, int64_t block_rows, int block_cols_log2,
                   uint32_t seed) {
  std::mt19937 rng(seed);
  Fp8Pair p{WeightMatrix(DType::kF8E4M3, rows, cols), WeightMatrix(DType::kF32, rows, cols)};
  uint8_t* codes = p.fp8.mutable_bytes();
  for (int64_t i = 0; i < rows * cols; ++i) {
    uint8_t c = static_cast<uint8_t>(rng() & 0xff);
    if ((c & 0x7f) == 0x7f) c = 0x3f;
    codes[i] = c;
  }
  float* scale = p.fp8.mutable_fp8_scale(block_rows, block_cols_log2);
  const int64_t bc = int64_t{1} << block_cols_log2;
  const int64_t count = (rows + block_rows - 1) / block_rows * ((cols + bc - 1) / bc);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int64_t i = 0; i < count; ++i)
    scale[i] = std::ldexp(mantissa(rng), -int(10 + rng() % 8)) * (i % 3 == 0 ? 1.0f : 0.7f);
  const tensor::WeightView v = p.fp8.view();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      p.f32.mutable_f32()[r * cols + c] =
          tensor::fp8_e4m3_to_f32(codes[r * cols + c]) * v.fp8.row(r)[c >> block_cols_log2];
  return p;
}

common::ThreadPool& pool() {
  static common::ThreadPool p(2);
  return p;
}

struct Shape {
  int64_t n, k, block_rows;
  int block_cols_log2;
};

class Fp8LinearTest : public ::testing::TestWithParam<Shape> {};

TEST_P(Fp8LinearTest, EveryPathGivesTheAvx2F32KernelsBitsOnTheDequantizedWeights) {
  const Shape s = GetParam();
  const Fp8Pair w = random_fp8(s.n, s.k, s.block_rows, s.block_cols_log2, 7);
  const int64_t max_m = 97;
  const auto x = testutil::random_vector(size_t(max_m * s.k), 11);
  // The AVX2 F32 kernels on the dequantized weights, one token at a time.
  std::vector<float> want(size_t(max_m * s.n));
  {
    kernels::ScopedCpuFeatures avx2({});
    for (int64_t r = 0; r < max_m; ++r)
      kernels::linear(x.data() + r * s.k, 1, w.f32.view(), want.data() + r * s.n, pool());
  }
  std::vector<float> ref(size_t(max_m * s.n));
  kernels::linear_reference(x.data(), max_m, w.f32.view(), ref.data(), s.n);
  for (const auto& path : testutil::supported_isa_paths()) {
    kernels::ScopedCpuFeatures isa(path.features);
    // Every batch size, both kernels and linear()'s choice between them: each token's outputs
    // are the same bits whatever the rows beside it and the machine.
    for (int64_t m : {1, 2, 3, 4, 5, 7, 16, 17, 40, 97}) {
      std::vector<float> got(size_t(m * s.n));
      const size_t bytes = got.size() * sizeof(float);
      kernels::linear(x.data(), m, w.fp8.view(), got.data(), pool());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), bytes)) << path.name << " linear m " << m;
      kernels::linear_streaming(x.data(), m, w.fp8.view(), got.data(), s.n, pool());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), bytes))
          << path.name << " streaming m " << m;
      kernels::linear_tiled(x.data(), m, w.fp8.view(), got.data(), s.n, pool());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), bytes)) << path.name << " tiled m " << m;
      // And within rounding of the kernels this path runs on the F32 weights.
      std::vector<float> f32(got.size()), exact(ref.begin(), ref.begin() + int64_t(got.size()));
      kernels::linear(x.data(), m, w.f32.view(), f32.data(), pool());
      EXPECT_LT(testutil::max_rel_error(got, f32), 1e-5) << path.name << " m " << m;
      EXPECT_LT(testutil::max_rel_error(got, exact), 1e-5) << path.name << " m " << m;
    }
  }
}

// Row block sizes that the N does and does not fill, K tails of 8-15 and 1-7 values past the last
// whole vector, and 16- to 128-column scale blocks.
INSTANTIATE_TEST_SUITE_P(Shapes, Fp8LinearTest,
                         ::testing::Values(Shape{200, 256, 128, 7}, Shape{300, 392, 128, 7},
                                           Shape{97, 333, 128, 7}, Shape{64, 160, 16, 4},
                                           Shape{130, 1040, 64, 6}));

TEST(Fp8LinearTest, EveryFiniteCodeWidensExactly) {
  // Row r, column c holds code c (NaN codes replaced by 0); one-hot activations read each back.
  const int64_t n = 3, k = 256;
  WeightMatrix w(DType::kF8E4M3, n, k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      w.mutable_bytes()[r * k + c] = (c & 0x7f) == 0x7f ? 0 : static_cast<uint8_t>(c);
  float* scale = w.mutable_fp8_scale(128, 7);
  scale[0] = 1.0f;
  scale[1] = 0.375f;  // the second 128 columns: negative codes, and not a power of two
  for (const auto& path : testutil::supported_isa_paths()) {
    kernels::ScopedCpuFeatures isa(path.features);
    for (int64_t c = 0; c < k; ++c) {
      std::vector<float> x(static_cast<size_t>(k), 0.0f), y(static_cast<size_t>(n));
      x[size_t(c)] = 1.0f;
      kernels::linear(x.data(), 1, w.view(), y.data(), pool());
      const float want =
          (c & 0x7f) == 0x7f ? 0.0f : tensor::fp8_e4m3_to_f32(uint8_t(c)) * scale[c / 128];
      for (int64_t r = 0; r < n; ++r) ASSERT_EQ(y[size_t(r)], want) << path.name << " code " << c;
      ASSERT_EQ(w.view().at(1, c), want);
    }
  }
}

TEST(Fp8LinearTest, RowRangeKeepsTheBlockScales) {
  const Fp8Pair w = random_fp8(384, 256, 128, 7, 3);
  const tensor::WeightView part = w.fp8.view().row_range(128, 200);
  for (int64_t r = 0; r < 200; r += 37)
    for (int64_t c = 0; c < 256; c += 41) EXPECT_EQ(part.at(r, c), w.f32.view().at(128 + r, c));
}

}  // namespace
