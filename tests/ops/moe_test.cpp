// MoE router on hand-checked cases and expert dispatch against the per-token reference.
#include "kernels/moe.h"
#include "kernels/int8_linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "test_util.h"

namespace {

float logit(float p) {
  return std::log(p / (1 - p));
}  // sigmoid^-1

TEST(RouterTest, NoauxTcSelectsWithBiasAndWeighsWithoutIt) {
  // 8 experts in 4 groups of 2, keep 2 groups, top-2.
  kernels::RouterParams p;
  p.num_experts = 8;
  p.top_k = 2;
  p.num_groups = 4;
  p.topk_groups = 2;
  p.normalize = true;
  p.routed_scaling_factor = 2.5f;
  const float probs[8] = {0.9f, 0.1f, 0.5f, 0.5f, 0.2f, 0.2f, 0.6f, 0.6f};
  // The bias lifts group 2 (experts 4, 5) above the others for selection only.
  const float bias[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.7f, 0.7f, 0.0f, 0.0f};
  std::vector<float> logits(8);
  for (int e = 0; e < 8; ++e) logits[e] = logit(probs[e]);
  int32_t ids[2];
  float w[2];
  kernels::route_experts(logits.data(), 1, bias, p, ids, w);
  // Biased group scores: g0 = 1.0, g1 = 1.0, g2 = 1.8, g3 = 1.2 -> keep groups 2 and 3.
  // Best biased experts among {4,5,6,7}: 4 and 5 (0.9 each).
  EXPECT_EQ(std::set<int>({ids[0], ids[1]}), std::set<int>({4, 5}));
  // Weights come from the unbiased scores 0.2, 0.2, normalized then scaled.
  EXPECT_NEAR(w[0], 1.25f, 1e-5);
  EXPECT_NEAR(w[1], 1.25f, 1e-5);
}

TEST(RouterTest, GroupLimitMasksTheBestExpertOfADroppedGroup) {
  kernels::RouterParams p;
  p.num_experts = 4;
  p.top_k = 2;
  p.num_groups = 2;
  p.topk_groups = 1;
  p.normalize = false;
  p.routed_scaling_factor = 1.0f;
  // Expert 0 is the single best, but group 1 (experts 2, 3) has the larger top-2 sum.
  std::vector<float> logits = {logit(0.95f), logit(0.05f), logit(0.7f), logit(0.6f)};
  int32_t ids[2];
  float w[2];
  kernels::route_experts(logits.data(), 1, nullptr, p, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 3);
  EXPECT_NEAR(w[0], 0.7f, 1e-6);
  EXPECT_NEAR(w[1], 0.6f, 1e-6);
}

TEST(MoeDispatchTest, GroupedMatchesPerTokenReference) {
  const int64_t T = 13, H = 24, inter = 10;
  const int E = 6, k = 3;
  std::vector<tensor::WeightMatrix> storage;
  std::vector<kernels::ExpertWeights> experts;
  for (int e = 0; e < E; ++e) {
    storage.push_back(testutil::random_matrix(e % 2 ? tensor::DType::kBF16 : tensor::DType::kF32,
                                              2 * inter, H, 100 + e));
    storage.push_back(testutil::random_matrix(tensor::DType::kF32, H, inter, 200 + e));
  }
  for (int e = 0; e < E; ++e) experts.push_back({storage[2 * e].view(), storage[2 * e + 1].view()});
  auto x = testutil::random_vector(T * H, 1);
  std::vector<int32_t> ids(T * k);
  std::vector<float> w(T * k);
  for (int64_t i = 0; i < T * k; ++i) {
    ids[i] = static_cast<int32_t>((i * 5 + i / k) % E);
    w[i] = 0.1f * static_cast<float>(i % 7 + 1);
  }
  for (int64_t t = 0; t < T; ++t) {  // distinct experts per token
    ids[t * k + 0] = static_cast<int32_t>(t % E);
    ids[t * k + 1] = static_cast<int32_t>((t + 1) % E);
    ids[t * k + 2] = static_cast<int32_t>((t + 3) % E);
  }
  auto base = testutil::random_vector(T * H, 2);
  std::vector<float> fast = base, ref = base;
  common::ThreadPool pool(2);
  kernels::moe_dispatch(x.data(), T, H, ids.data(), w.data(), k, experts, fast.data(), pool);
  kernels::moe_dispatch_reference(x.data(), T, H, ids.data(), w.data(), k, experts, ref.data());
  EXPECT_LT(testutil::max_rel_error(fast, ref), 1e-5);
}

// Decode-sized batches run one expert per thread; prefill-sized ones one parallel region per
// projection. Decode-sized ones give the bits of a one-thread pool (F32, BF16 and W8A8 experts:
// chunkpipe's own kernels). Prefill-sized ones (T 40, 20 tokens an expert) reach OpenBLAS for
// the F32 experts, whose bits may depend on the rows one call covers (its Haswell kernels, which
// OpenBLAS 0.3.21 also picks on Zen 5, do), so a two-thread pool's split can move the last bits
// there. Every batch matches the reference.
TEST(MoeDispatchTest, ExpertPerThreadFormGivesTheSameBits) {
  const int64_t H = 40, inter = 12;
  const int E = 8, k = 4;
  std::vector<tensor::WeightMatrix> storage;
  for (int e = 0; e < E; ++e) {
    for (int part = 0; part < 2; ++part) {
      const int64_t rows = part == 0 ? 2 * inter : H, cols = part == 0 ? H : inter;
      if (e % 3 == 2) {
        auto f = testutil::random_vector(size_t(rows * cols), 300 + 2 * e + part);
        tensor::WeightMatrix q;
        kernels::quantize_weight_rows(f.data(), rows, cols, q);
        storage.push_back(std::move(q));
      } else {
        storage.push_back(testutil::random_matrix(
            e % 3 ? tensor::DType::kBF16 : tensor::DType::kF32, rows, cols, 400 + 2 * e + part));
      }
    }
  }
  std::vector<kernels::ExpertWeights> experts;
  for (int e = 0; e < E; ++e) experts.push_back({storage[2 * e].view(), storage[2 * e + 1].view()});
  for (int64_t T : {1, 2, 5, 40}) {
    auto x = testutil::random_vector(size_t(T * H), 7 + T);
    std::vector<int32_t> ids(size_t(T * k));
    std::vector<float> w(size_t(T * k));
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < k; ++j) {
        ids[size_t(t * k + j)] = static_cast<int32_t>((t * 3 + j * 2) % E);
        w[size_t(t * k + j)] = 0.1f * float(j + 1);
      }
    }
    auto base = testutil::random_vector(size_t(T * H), 9);
    std::vector<float> two = base, one = base, ref = base;
    common::ThreadPool pool2(2), pool1(1);
    kernels::moe_dispatch(x.data(), T, H, ids.data(), w.data(), k, experts, two.data(), pool2);
    kernels::moe_dispatch(x.data(), T, H, ids.data(), w.data(), k, experts, one.data(), pool1);
    kernels::moe_dispatch_reference(x.data(), T, H, ids.data(), w.data(), k, experts, ref.data());
    if (T < 40) {
      EXPECT_EQ(two, one) << "T=" << T;
    }
    EXPECT_LT(testutil::max_rel_error(two, ref), 1e-5) << "T=" << T;
    EXPECT_LT(testutil::max_rel_error(one, ref), 1e-5) << "T=" << T;
  }
}

}  // namespace
