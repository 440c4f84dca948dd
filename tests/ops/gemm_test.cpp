// Linear kernels (streaming, BLAS, dispatch) against the double-accumulated reference.
#include "kernels/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/int8_linear.h"
#include "test_util.h"

namespace {

using tensor::DType;

struct Shape {
  int64_t m, n, k;
};

class GemmTest : public ::testing::TestWithParam<std::tuple<DType, Shape>> {};

TEST_P(GemmTest, FastPathsMatchReference) {
  auto [dtype, s] = GetParam();
  auto w = testutil::random_matrix(dtype, s.n, s.k, 7);
  auto x = testutil::random_vector(static_cast<size_t>(s.m * s.k), 11);
  std::vector<float> ref(s.m * s.n), y1(s.m * s.n, -1.0f), y2(s.m * s.n, -1.0f), y3(s.m * s.n);
  kernels::linear_reference(x.data(), s.m, w.view(), ref.data(), s.n);
  common::ThreadPool pool(2);
  for (const auto& path : testutil::supported_isa_paths()) {
    kernels::ScopedCpuFeatures isa(path.features);
    std::fill(y1.begin(), y1.end(), -1.0f);
    std::fill(y2.begin(), y2.end(), -1.0f);
    std::fill(y3.begin(), y3.end(), -1.0f);
    kernels::linear_streaming(x.data(), s.m, w.view(), y1.data(), s.n, pool);
    kernels::linear_blas(x.data(), s.m, w.view(), y2.data(), s.n, pool);
    kernels::linear(x.data(), s.m, w.view(), y3.data(), pool);
    std::vector<float> y4(y1.size(), -1.0f);
    kernels::linear_streaming_serial(x.data(), s.m, w.view(), y4.data(), s.n);
    EXPECT_EQ(y4, y1) << path.name << ": the serial streaming kernel differs from the pooled one";
    EXPECT_LT(testutil::max_rel_error(y1, ref), 1e-5) << path.name;
    EXPECT_LT(testutil::max_rel_error(y2, ref), 1e-5) << path.name;
    EXPECT_LT(testutil::max_rel_error(y3, ref), 1e-5) << path.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                       ::testing::Values(Shape{1, 1, 1}, Shape{1, 37, 19}, Shape{3, 64, 128},
                                         Shape{8, 130, 257}, Shape{9, 33, 64}, Shape{40, 300, 96},
                                         Shape{2, 7, 8}, Shape{7, 21, 33}, Shape{5, 6, 31},
                                         Shape{49, 40, 70}, Shape{97, 65, 300},
                                         Shape{130, 96, 64})));

// ActivationPrecision::kBf16: every path linear() takes (on AVX512_BF16 the vdpbf16ps kernel
// from kBf16DotMinRows rows with an even K and its GEMV form below; the rounded rows through the
// f32 kernels otherwise) must equal the reference on x rounded to bf16 up to summation order, on
// every ISA path here; the rounding itself must show (the unrounded reference is far off).
class GemmBf16ActivationsTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GemmBf16ActivationsTest, EveryPathMatchesTheReferenceOnRoundedActivations) {
  const Shape s = GetParam();
  auto w = testutil::random_matrix(DType::kBF16, s.n, s.k, 5);
  auto x = testutil::random_vector(static_cast<size_t>(s.m * s.k), 6);
  std::vector<float> rounded(x.size()), ref(s.m * s.n), unrounded(s.m * s.n);
  kernels::round_to_bf16(x.data(), static_cast<int64_t>(x.size()), rounded.data());
  kernels::linear_reference(rounded.data(), s.m, w.view(), ref.data(), s.n);
  kernels::linear_reference(x.data(), s.m, w.view(), unrounded.data(), s.n);
  EXPECT_GT(testutil::max_rel_error(unrounded, ref), 1e-4) << "rounding to bf16 left no trace";
  common::ThreadPool pool(2);
  const kernels::ScopedActivationPrecision precision(kernels::ActivationPrecision::kBf16);
  for (const auto& path : testutil::supported_isa_paths()) {
    kernels::ScopedCpuFeatures isa(path.features);
    std::vector<float> y(s.m * (s.n + 3), 99.0f);
    kernels::linear(x.data(), s.m, w.view(), y.data(), s.n + 3, pool);
    double worst = 0;
    for (int64_t t = 0; t < s.m; ++t) {
      for (int64_t j = 0; j < s.n; ++j) {
        const double want = ref[t * s.n + j];
        worst = std::max(worst, std::abs(y[t * (s.n + 3) + j] - want) / (1 + std::abs(want)));
      }
      for (int64_t j = s.n; j < s.n + 3; ++j) ASSERT_EQ(y[t * (s.n + 3) + j], 99.0f) << "past N";
    }
    EXPECT_LT(worst, 1e-5) << path.name;
    if (kernels::cpu_features().avx512_bf16 && s.k % 2 == 0) {
      std::vector<float> d(s.m * s.n, -1.0f);
      kernels::linear_bf16_dot(x.data(), s.m, w.view(), d.data(), s.n, pool);
      EXPECT_LT(testutil::max_rel_error(d, ref), 1e-5) << path.name << " linear_bf16_dot";
      // Packed once and run against the weight in two row ranges, into a wider y: the same bits.
      kernels::Bf16PairActivations packed;
      kernels::pack_bf16_pairs(x.data(), s.k, s.m, s.k, packed, pool);
      std::vector<float> p(s.m * (s.n + 2), 77.0f);
      const int64_t split = s.n / 3;
      kernels::linear_bf16_packed(packed, w.view().bf16(), split, p.data(), s.n + 2, pool);
      kernels::linear_bf16_packed_serial(packed, w.view().bf16(), split, s.n, p.data(), s.n + 2);
      for (int64_t t = 0; t < s.m; ++t) {
        for (int64_t j = 0; j < s.n; ++j)
          ASSERT_EQ(p[t * (s.n + 2) + j], d[t * s.n + j])
              << path.name << " packed " << t << "," << j;
        for (int64_t j = s.n; j < s.n + 2; ++j) ASSERT_EQ(p[t * (s.n + 2) + j], 77.0f) << "past N";
      }
    }
  }
}

// M around the 16-token blocks and kBf16DotMinRows, N around the six-row tiles and the 48-row
// chunks (a last chunk of 1, 4 and 47 rows), K around the 32-value packing step (odd K takes the
// rounded-f32 path); 100 × 4096 spans two L2 passes.
INSTANTIATE_TEST_SUITE_P(Shapes, GemmBf16ActivationsTest,
                         ::testing::Values(Shape{1, 37, 64}, Shape{7, 13, 34}, Shape{8, 6, 32},
                                           Shape{17, 19, 66}, Shape{33, 64, 130}, Shape{64, 7, 2},
                                           Shape{70, 25, 31}, Shape{100, 13, 4096},
                                           Shape{20, 49, 64}, Shape{81, 100, 34},
                                           Shape{130, 95, 66}));

TEST(GemmBf16ActivationsTest, RoundingMatchesTheScalarConversion) {
  std::vector<float> x = testutil::random_vector(1000, 9, 100.0f);
  const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                               0x7f800001u, 0xffbfffffu, 0x00000001u, 0x00018000u, 0x3f808000u,
                               0x3f818000u, 0x7f7fffffu, 0x3f80ffffu, 0xbf807fffu};
  for (uint32_t bits : specials) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    x.push_back(f);
  }
  std::vector<float> got(x.size());
  kernels::round_to_bf16(x.data(), static_cast<int64_t>(x.size()), got.data());
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t g;
    std::memcpy(&g, &got[i], sizeof(g));
    const uint32_t want = uint32_t{tensor::f32_to_bf16(x[i])} << 16;
    ASSERT_EQ(g, want) << "element " << i;
  }
}

// The largest error of got (row stride ldy) against ref ([m, n]) relative to Σ|x·w| per output:
// the cancellation in these sums would make a plain relative error measure the data, not the
// kernel (sgemm's own is ~1e-7 here).
double error_over_magnitude(const std::vector<float>& x, const tensor::WeightView& w,
                            const Shape& s, const std::vector<float>& got, int64_t ldy,
                            const std::vector<float>& ref) {
  double e = 0;
  for (int64_t t = 0; t < s.m; ++t) {
    for (int64_t j = 0; j < s.n; ++j) {
      double mag = 0;
      for (int64_t c = 0; c < s.k; ++c) mag += std::abs(double(x[t * s.k + c]) * w.at(j, c));
      e = std::max(e, std::abs(double(got[t * ldy + j]) - ref[t * s.n + j]) / (mag + 1e-30));
    }
  }
  return e;
}

// The AMX-BF16 path on its own, in the three output layouts, bf16 and f32 weights (f32 read through
// a row-group map, as the MLA expansion reads W_UK inside kv_b_proj): activations and f32 weights
// split into bf16 terms must give f32-accurate sums (not bf16-rounded ones): within 1e-6 of
// Σ|x·w| per output, where sgemm measures 1-7e-7 and one bf16 rounding would be ~4e-3.
TEST(GemmAmxBf16Test, MatchesReferenceInBothLayouts) {
  if (!kernels::amx_bf16_active()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  common::ThreadPool pool(2);
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    for (const Shape s :
         {Shape{1, 1, 1}, Shape{33, 47, 95}, Shape{64, 64, 64}, Shape{200, 130, 520}}) {
      // Physical weight: groups of 3 rows, 2 of them logical rows of W (the third is skipped).
      const int64_t groups = (s.n + 1) / 2;
      auto phys = testutil::random_matrix(dtype, groups * 3, s.k, 3);
      auto w = testutil::random_matrix(dtype, s.n, s.k, 5);  // overwritten: W's logical rows
      kernels::AmxWeightRows rows;
      rows.group_rows = 2;
      rows.group_stride = 3;
      if (dtype == DType::kF32) {
        float* pw = phys.mutable_f32();
        // Values over many binades and with low mantissa bits set, beyond bf16.
        for (int64_t i = 0; i < groups * 3 * s.k; ++i)
          pw[i] *= std::ldexp(1.0f + 0x1.3579bp-20f, static_cast<int>(i % 11) - 5);
        rows.f32 = pw;
        for (int64_t i = 0; i < s.n; ++i)
          std::memcpy(w.mutable_f32() + i * s.k, pw + rows.physical_row(i) * s.k, size_t(s.k) * 4);
      } else {
        rows.bf16 = phys.view().bf16();
        for (int64_t i = 0; i < s.n; ++i)
          std::memcpy(w.mutable_bf16() + i * s.k, rows.bf16 + rows.physical_row(i) * s.k,
                      size_t(s.k) * 2);
      }
      auto x = testutil::random_vector(static_cast<size_t>(s.m * s.k), 4);
      // Values over many binades, where a bf16 rounding of x would show.
      for (size_t i = 0; i < x.size(); ++i) x[i] *= std::ldexp(1.0f, static_cast<int>(i % 13) - 6);
      std::vector<float> ref(s.m * s.n), y(s.m * s.n, -1.0f), yt(s.m * s.n, -1.0f), back(s.m * s.n);
      kernels::linear_reference(x.data(), s.m, w.view(), ref.data(), s.n);
      kernels::Bf16x3Activations split;
      kernels::split_bf16x3(x.data(), s.k, s.m, s.k, split, pool);
      kernels::linear_amx(split, rows, s.n, kernels::AmxOutput{y.data(), s.n}, pool);
      kernels::linear_amx(split, rows, s.n, kernels::AmxOutput{yt.data(), s.m, true}, pool);
      // Columns in groups of 24 (panels of 32 straddle them), each group [m, 24] rows, 5 apart.
      const int64_t gc = 24, gs = s.m * gc + 5, groups_out = (s.n + gc - 1) / gc;
      std::vector<float> yg(size_t(groups_out * gs), -1.0f), from_groups(s.m * s.n);
      kernels::linear_amx(split, rows, s.n, kernels::AmxOutput{yg.data(), gc, false, gc, gs}, pool);
      for (int64_t t = 0; t < s.m; ++t) {
        for (int64_t j = 0; j < s.n; ++j) {
          back[t * s.n + j] = yt[j * s.m + t];
          from_groups[t * s.n + j] = yg[j / gc * gs + t * gc + j % gc];
        }
      }
      const std::string name = std::string(dtype == DType::kF32 ? "f32 " : "bf16 ") +
                               std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                               std::to_string(s.k);
      EXPECT_LT(error_over_magnitude(x, w.view(), s, y, s.n, ref), 1e-6) << name;
      EXPECT_LT(error_over_magnitude(x, w.view(), s, back, s.n, ref), 1e-6) << name;
      EXPECT_EQ(from_groups, y) << name;
    }
  }
}

// The row-major AMX form (weights as A tiles, read in place) computes the packed form's
// products in the same order: bit for bit the same outputs, for every token count around the
// 16-token blocks and weight rows around the 32-row panels (short last panels are copied).
TEST(GemmAmxBf16Test, RowMajorFormEqualsPackedFormBitForBit) {
  if (!kernels::amx_bf16_active()) GTEST_SKIP() << "no AMX-BF16 on this machine";
  common::ThreadPool pool(2);
  for (const Shape s : {Shape{1, 32, 32}, Shape{5, 47, 64}, Shape{16, 64, 512}, Shape{17, 96, 96},
                        Shape{33, 100, 256}, Shape{70, 33, 128}, Shape{300, 64, 64}}) {
    auto w = testutil::random_matrix(DType::kBF16, s.n, s.k, 9);
    auto x = testutil::random_vector(static_cast<size_t>(s.m * s.k), 10);
    for (size_t i = 0; i < x.size(); ++i) x[i] *= std::ldexp(1.0f, static_cast<int>(i % 13) - 6);
    // Output rows wider than N, with a sentinel past each row's N values.
    const int64_t ldy = s.n + 3;
    std::vector<float> ref(s.m * s.n), packed(s.m * ldy, -7.0f), row_major(s.m * ldy, -7.0f);
    kernels::linear_reference(x.data(), s.m, w.view(), ref.data(), s.n);
    kernels::Bf16x3Activations split;
    kernels::split_bf16x3(x.data(), s.k, s.m, s.k, split, pool);
    kernels::linear_amx(split, kernels::AmxWeightRows{w.view().bf16(), nullptr}, s.n,
                        kernels::AmxOutput{packed.data(), ldy}, pool);
    kernels::linear_amx_row_major(x.data(), s.m, w.view(), row_major.data(), ldy, pool);
    const std::string name =
        std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
    EXPECT_EQ(row_major, packed) << name;  // the sentinels included
    for (int64_t t = 0; t < s.m; ++t) EXPECT_EQ(row_major[t * ldy + s.n], -7.0f) << name;
    EXPECT_LT(error_over_magnitude(x, w.view(), s, row_major, ldy, ref), 1e-6) << name;
  }
}

TEST(CpuFeaturesTest, ScopedFeaturesCapAndRestore) {
  const kernels::CpuFeatures before = kernels::cpu_features();
  {
    kernels::ScopedCpuFeatures isa({});
    EXPECT_EQ(kernels::cpu_features(), kernels::CpuFeatures{});
    EXPECT_EQ(kernels::describe(kernels::cpu_features()), "avx2 fma");
  }
  EXPECT_EQ(kernels::cpu_features(), before);
  {
    // A request for more than the machine has is cut to what it has.
    kernels::ScopedCpuFeatures isa({true, true, true, true, true, true});
    EXPECT_EQ(kernels::cpu_features(), kernels::detected_cpu_features());
  }
  EXPECT_NE(kernels::kernel_paths_line().find("linear int8"), std::string::npos);
  {
    kernels::ScopedCpuFeatures isa({});
    EXPECT_NE(kernels::kernel_paths_line().find("sampler exp avx2;"), std::string::npos)
        << kernels::kernel_paths_line();
  }
}

TEST(GemmTest, StridedOutput) {
  auto w = testutil::random_matrix(DType::kBF16, 24, 40, 3);
  auto x = testutil::random_vector(5 * 40, 4);
  common::ThreadPool pool(2);
  std::vector<float> ref(5 * 24), y(5 * 30, 99.0f);
  kernels::linear_reference(x.data(), 5, w.view(), ref.data(), 24);
  kernels::linear(x.data(), 5, w.view(), y.data(), 30, pool);
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 24; ++c) EXPECT_NEAR(y[r * 30 + c], ref[r * 24 + c], 1e-5);
    for (int c = 24; c < 30; ++c) EXPECT_EQ(y[r * 30 + c], 99.0f) << "wrote past N";
  }
}

// A decode step's outputs for one token must not depend on the other tokens of the step (the
// batch): for every row count that takes the streaming kernels, in both activation precisions,
// for BF16 and F32 weights, on every ISA path, each token's outputs are the bits that token
// alone gets. K covers whole 64-value steps, a last even block, masked odd and even blocks, and
// an odd or even number of whole 8- and 16-value blocks (the AVX2 f32 kernel's two chains); N
// whole tiles and a remainder.
TEST(GemmTest, DecodeOutputsDoNotDependOnTheBatch) {
  common::ThreadPool pool(2);
  const std::pair<int64_t, DType> cases[] = {
      {64, DType::kBF16},   {96, DType::kBF16}, {50, DType::kBF16}, {20, DType::kBF16},
      {2048, DType::kBF16}, {24, DType::kBF16}, {40, DType::kF32},  {83, DType::kF32},
      {48, DType::kF32},    {2048, DType::kF32}};
  for (const auto& [k, dtype] : cases) {
    for (const auto precision :
         {kernels::ActivationPrecision::kF32, kernels::ActivationPrecision::kBf16}) {
      const kernels::ScopedActivationPrecision scoped(precision);
      const int64_t n = 37, max_m = kernels::kBf16DotMinRows - 1;
      auto w = testutil::random_matrix(dtype, n, k, 21);
      auto x = testutil::random_vector(static_cast<size_t>(max_m * k), 22);
      for (const auto& path : testutil::supported_isa_paths()) {
        kernels::ScopedCpuFeatures isa(path.features);
        std::vector<float> alone(max_m * n);
        for (int64_t t = 0; t < max_m; ++t)
          kernels::linear(x.data() + t * k, 1, w.view(), alone.data() + t * n, pool);
        for (int64_t m = 2; m <= max_m; ++m) {
          std::vector<float> batch(m * n, -1.0f);
          kernels::linear(x.data(), m, w.view(), batch.data(), pool);
          for (int64_t i = 0; i < m * n; ++i)
            ASSERT_EQ(batch[i], alone[i])
                << path.name << " K " << k << " m " << m << " token " << i / n << " row " << i % n
                << " precision " << static_cast<int>(precision) << " dtype "
                << static_cast<int>(dtype);
        }
      }
    }
  }
}

// A token's outputs are the same bits whatever the batch beside it (1 to 300 rows, across every
// kernel switch: streaming, tiled, int8) and the thread count (1-3), on every ISA path here, for
// f32 and bf16 activations on F32 and BF16 weights and for W8A8's int8 weights (dynamic
// per-token int8 activations). K covers every K % 16 case of the kernels. One switch changes
// the bits: on AVX512_BF16 with bf16 activations, fewer than kBf16DotMinRows rows run the GEMV
// form (lanes along K, 32 partial sums per output) and more the dot form (one chain over K per
// output); each form is invariant, and the two agree to rounding (checked below; ARCHITECTURE,
// "Batch invariance").
TEST(GemmTest, ATokensOutputsDoNotDependOnTheBatchOrTheThreads) {
  const int64_t batches[] = {1, 2, 3, 7, 11, 12, 16, 64, 300};
  const int64_t n = 70, max_m = 300;
  std::vector<std::unique_ptr<common::ThreadPool>> pools;
  for (int t = 1; t <= 3; ++t) pools.push_back(std::make_unique<common::ThreadPool>(t));
  for (const int64_t k : {int64_t{512}, int64_t{300}, int64_t{264}, int64_t{129}}) {
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kI8}) {
      tensor::WeightMatrix w;
      if (dtype == DType::kI8) {
        auto f = testutil::random_matrix(DType::kF32, n, k, 31);
        kernels::quantize_weight_rows(f.mutable_f32(), n, k, w);
      } else {
        w = testutil::random_matrix(dtype, n, k, 31);
      }
      const auto x = testutil::random_vector(static_cast<size_t>(max_m * k), 32);
      for (const auto precision :
           {kernels::ActivationPrecision::kF32, kernels::ActivationPrecision::kBf16}) {
        if (precision == kernels::ActivationPrecision::kBf16 && dtype != DType::kBF16) continue;
        const kernels::ScopedActivationPrecision scoped(precision);
        for (const auto& path : testutil::supported_isa_paths()) {
          kernels::ScopedCpuFeatures isa(path.features);
          // The two bf16 forms of AVX512_BF16 (without AMX, whose tiles take the rounded rows).
          const bool two_forms = precision == kernels::ActivationPrecision::kBf16 &&
                                 kernels::cpu_features().avx512_bf16 &&
                                 !kernels::amx_bf16_active() && k % 2 == 0;
          std::vector<float> alone(max_m * n), whole(max_m * n);
          for (int64_t t = 0; t < max_m; ++t)
            kernels::linear(x.data() + t * k, 1, w.view(), alone.data() + t * n, *pools[0]);
          kernels::linear(x.data(), max_m, w.view(), whole.data(), *pools[0]);
          if (two_forms) {
            EXPECT_LT(testutil::max_rel_error(whole, alone), 1e-5) << path.name << " K " << k;
          } else {
            ASSERT_EQ(whole, alone) << path.name << " K " << k << " " << tensor::dtype_name(dtype);
          }
          for (auto& pool_ptr : pools) {
            common::ThreadPool& pool = *pool_ptr;
            for (const int64_t m : batches) {
              const std::vector<float>& expected =
                  two_forms && m >= kernels::kBf16DotMinRows ? whole : alone;
              std::vector<float> batch(m * n, -1.0f);
              // Each batch starts at a different token, so every token meets new neighbours.
              const int64_t first = (max_m - m) / 2;
              kernels::linear(x.data() + first * k, m, w.view(), batch.data(), pool);
              for (int64_t i = 0; i < m * n; ++i) {
                ASSERT_EQ(batch[i], expected[first * n + i])
                    << path.name << " K " << k << " dtype " << tensor::dtype_name(dtype)
                    << " precision " << static_cast<int>(precision) << " threads "
                    << pool.num_threads() << " batch " << m << " token " << first + i / n
                    << " output " << i % n;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
