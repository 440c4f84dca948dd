// add_absorbed_projections: the per-head W_UKᵀ / W_UV copies decode streams, their layout and
// their dtype (BF16 only when every kv_b_proj value is exact in BF16).
#include <gtest/gtest.h>

#include <cstdint>

#include "model/weights.h"
#include "tensor/dtype.h"

namespace {

using tensor::DType;

constexpr int64_t kHeads = 3, kNope = 4, kV = 5, kRank = 6;

// kv_b_proj [heads·(nope+v), rank] with value(row, col); `exact` keeps every value in BF16.
model::AttentionWeights make_attention(bool exact) {
  model::AttentionWeights a;
  a.kv_b_proj = tensor::WeightMatrix(DType::kF32, kHeads * (kNope + kV), kRank);
  for (int64_t i = 0; i < a.kv_b_proj.rows() * kRank; ++i) {
    const float v = 0.25f * float(i % 97) - 7.0f;  // multiples of 1/4: exact in BF16
    a.kv_b_proj.mutable_f32()[i] = exact ? v : v + 1e-4f;
  }
  return a;
}

float at(const tensor::WeightMatrix& m, int64_t row, int64_t col) {
  return m.view().at(row, col);
}

TEST(AbsorbedProjectionsTest, BuildsPerHeadTransposedKeysAndValueRowsInBf16WhenExact) {
  model::AttentionWeights a = make_attention(true);
  model::add_absorbed_projections(a, kNope, kV);
  ASSERT_EQ(a.absorb_uk_t.dtype(), DType::kBF16);
  ASSERT_EQ(a.absorb_uv.dtype(), DType::kBF16);
  ASSERT_EQ(a.absorb_uk_t.rows(), kHeads * kRank);
  ASSERT_EQ(a.absorb_uk_t.cols(), kNope);
  ASSERT_EQ(a.absorb_uv.rows(), kHeads * kV);
  ASSERT_EQ(a.absorb_uv.cols(), kRank);
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t j = 0; j < kRank; ++j)
      for (int64_t d = 0; d < kNope; ++d)
        EXPECT_EQ(at(a.absorb_uk_t, h * kRank + j, d), at(a.kv_b_proj, h * (kNope + kV) + d, j))
            << "head " << h << " latent " << j << " nope " << d;
    for (int64_t d = 0; d < kV; ++d)
      for (int64_t j = 0; j < kRank; ++j)
        EXPECT_EQ(at(a.absorb_uv, h * kV + d, j), at(a.kv_b_proj, h * (kNope + kV) + kNope + d, j))
            << "head " << h << " value " << d << " latent " << j;
  }
}

TEST(AbsorbedProjectionsTest, KeepsF32WhenAValueIsNotExactInBf16) {
  model::AttentionWeights a = make_attention(false);
  model::add_absorbed_projections(a, kNope, kV);
  ASSERT_EQ(a.absorb_uk_t.dtype(), DType::kF32);
  ASSERT_EQ(a.absorb_uv.dtype(), DType::kF32);
  // Every value is carried unrounded.
  EXPECT_EQ(at(a.absorb_uk_t, kRank + 2, 3), at(a.kv_b_proj, (kNope + kV) + 3, 2));
  EXPECT_EQ(at(a.absorb_uv, 2 * kV + 4, 5), at(a.kv_b_proj, 2 * (kNope + kV) + kNope + 4, 5));
}

}  // namespace
