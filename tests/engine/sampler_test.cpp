// Sampler semantics: greedy, seeded reproducibility, top-k / top-p / min-p cuts, penalties,
// min_tokens masking and top logprobs.
#include "worker/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace {

// Samples for `r` with `stop_ids` as its min_tokens-masked ids.
sched::SampledToken sample(std::span<float> logits, sched::Request r,
                           const std::vector<int32_t>& stop_ids, std::mt19937_64& rng) {
  r.sampling.all_stop_token_ids = stop_ids;
  return worker::sample_token(logits, r.sampling, {r.prompt_token_ids, r.output_token_ids}, rng);
}

sched::Request request_with(sched::SamplingParams p) {
  sched::Request r;
  r.request_id = "r";
  r.prompt_token_ids = {0, 1};
  r.sampling = p;
  return r;
}

TEST(SamplerTest, GreedyPicksTheArgmax) {
  sched::SamplingParams p;
  p.temperature = 0;
  auto r = request_with(p);
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f};
  std::mt19937_64 rng(1);
  EXPECT_EQ(sample(logits, r, {}, rng).token, 1);
}

TEST(SamplerTest, SeededSamplingIsReproducibleAndTopKLimitsTheSupport) {
  sched::SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 2;
  auto r = request_with(p);
  std::set<int32_t> seen;
  std::vector<int32_t> first, second;
  for (int run = 0; run < 2; ++run) {
    std::mt19937_64 rng(42);
    for (int i = 0; i < 200; ++i) {
      std::vector<float> logits = {1.0f, 1.1f, 0.9f, 1.05f};
      const int32_t t = sample(logits, r, {}, rng).token;
      (run == 0 ? first : second).push_back(t);
      seen.insert(t);
    }
  }
  EXPECT_EQ(first, second);
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3}));
}

TEST(SamplerTest, TopPAndMinPCutTheTail) {
  sched::SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.5;  // the first token alone holds > 50%
  auto r = request_with(p);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> logits = {3.0f, 1.0f, 1.0f, 1.0f};
    EXPECT_EQ(sample(logits, r, {}, rng).token, 0);
  }
  p.top_p = 1.0;
  p.min_p = 0.5;  // tokens below half the best probability are dropped
  r = request_with(p);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> logits = {2.0f, 1.9f, -5.0f, -5.0f};
    EXPECT_LT(sample(logits, r, {}, rng).token, 2);
  }
}

TEST(SamplerTest, PenaltiesAndMinTokens) {
  sched::SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 4.0;  // prompt tokens 0 and 1: 2.0 -> 0.5
  auto r = request_with(p);
  std::mt19937_64 rng(1);
  std::vector<float> logits = {0.0f, 2.0f, 1.0f, 0.5f};
  EXPECT_EQ(sample(logits, r, {}, rng).token, 2);

  p = {};
  p.temperature = 0;
  p.frequency_penalty = 1.0;
  r = request_with(p);
  r.output_token_ids = {2, 2};
  logits = {0.0f, 0.0f, 1.5f, 0.0f};
  EXPECT_EQ(sample(logits, r, {}, rng).token, 0);  // 1.5 - 2 < 0

  p = {};
  p.temperature = 0;
  p.min_tokens = 2;
  r = request_with(p);
  logits = {0.0f, 5.0f, 1.0f, 0.0f};
  const std::vector<int32_t> eos = {1};
  EXPECT_EQ(sample(logits, r, eos, rng).token, 2);  // EOS masked before min_tokens
}

TEST(SamplerTest, TopLogprobsAreNormalizedAndSorted) {
  sched::SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  auto r = request_with(p);
  std::mt19937_64 rng(1);
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  auto s = sample(logits, r, {}, rng);
  ASSERT_EQ(s.top_logprobs.size(), 2u);
  EXPECT_EQ(s.top_logprobs[0].first, 0);
  EXPECT_NEAR(s.top_logprobs[0].second, std::log(0.5), 1e-6);
  EXPECT_NEAR(s.top_logprobs[1].second, std::log(0.3), 1e-6);
  EXPECT_NEAR(s.logprob, std::log(0.5), 1e-6);
}

}  // namespace
