// Sampler semantics: greedy, seeded reproducibility, top-k / top-p / min-p cuts (and their
// support against a sorting reference), penalties, min_tokens masking, allowed_token_ids and
// bad words, and top logprobs.
#include "worker/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <span>

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

// The support by sorting, as vLLM v1 states it: min-p drops weights below min_p of the best;
// top-k keeps what is not below the k-th largest logit; top-p keeps a token (best first, ties by
// id) while the mass above it is below top_p of what is left.
std::vector<double> sorted_reference(std::span<const float> logits,
                                     const sched::SamplingParams& p) {
  const size_t V = logits.size();
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> w(V);
  for (size_t i = 0; i < V; ++i) w[i] = std::exp((logits[i] - top) / p.temperature);
  for (double& x : w)
    if (x < p.min_p) x = 0;
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
  if (p.top_k > 0 && size_t(p.top_k) < V) {
    std::vector<float> by_logit(logits.begin(), logits.end());
    std::sort(by_logit.begin(), by_logit.end(), std::greater<>());
    const float kth = by_logit[size_t(p.top_k - 1)];
    for (size_t i = 0; i < V; ++i)
      if (logits[i] < kth) w[i] = 0;
  }
  if (p.top_p < 1.0) {
    double total = 0;
    for (double x : w) total += x;
    double above = 0;
    for (int32_t id : order) {
      const double x = w[id];
      if (above >= p.top_p * total) w[id] = 0;
      above += x;
    }
  }
  return w;
}

TEST(SamplerTest, SupportMatchesTheSortingReference) {
  std::mt19937_64 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Peaked (a real model), flat (random weights), and coarse (many exact ties) logits.
  const std::vector<std::pair<const char*, std::function<float(int)>>> shapes = {
      {"peaked", [&](int i) { return normal(gen) * 4.0f + (i % 97 == 0 ? 12.0f : 0.0f); }},
      {"flat", [&](int) { return normal(gen) * 0.05f; }},
      {"coarse", [&](int) { return std::round(normal(gen) * 2.0f) / 2.0f; }},
  };
  struct Setting {
    double temperature, top_p, min_p;
    int32_t top_k;
  };
  const Setting settings[] = {{0.6, 0.95, 0, 0},   {1.0, 0.5, 0, 0},     {1.3, 0.999, 0, 0},
                              {0.7, 0.9, 0.05, 0}, {1.0, 1.0, 0.2, 0},   {1.0, 0.8, 0, 50},
                              {0.8, 1.0, 0, 7},    {1.0, 0.3, 0.01, 300}};
  int compared = 0;
  for (const auto& [name, logit] : shapes) {
    for (int V : {1, 2, 17, 4096, 129280}) {
      std::vector<float> logits(static_cast<size_t>(V));
      for (int i = 0; i < V; ++i) logits[size_t(i)] = logit(i);
      for (const Setting& s : settings) {
        sched::SamplingParams p;
        p.temperature = s.temperature;
        p.top_p = s.top_p;
        p.min_p = s.min_p;
        p.top_k = s.top_k;
        const std::vector<double> want = sorted_reference(logits, p);
        const std::vector<double> got = worker::sampling_weights(logits, p);
        ASSERT_EQ(got.size(), want.size());
        // The support must be the same token for token; the weights agree up to how each
        // side rounds the division by the temperature.
        size_t kept = 0, differ = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          kept += want[i] > 0;
          differ += (got[i] > 0) != (want[i] > 0) || std::abs(got[i] - want[i]) > 1e-12 * want[i];
        }
        EXPECT_EQ(differ, 0u) << name << " V=" << V << " T=" << s.temperature
                              << " top_p=" << s.top_p << " min_p=" << s.min_p
                              << " top_k=" << s.top_k << ": " << kept << " kept";
        EXPECT_GT(kept, 0u);
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 3 * 5 * 8);
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

TEST(SamplerTest, AllowedTokenIdsLimitTheSupport) {
  sched::SamplingParams p;
  p.temperature = 1.0;
  p.allowed_token_ids = {2, 5};
  auto r = request_with(p);
  std::mt19937_64 rng(3);
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) {
    std::vector<float> logits = {9.0f, 8.0f, 0.0f, 7.0f, 6.0f, 0.5f, 5.0f};
    seen.insert(sample(logits, r, {}, rng).token);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{2, 5})) << "only the allowed ids, and both of them";
  p.temperature = 0;
  r = request_with(p);
  std::vector<float> logits = {9.0f, 8.0f, 0.0f, 7.0f, 6.0f, 0.5f, 5.0f};
  EXPECT_EQ(sample(logits, r, {}, rng).token, 5);
  EXPECT_TRUE(std::isinf(logits[0]) && logits[0] < 0) << "the others are masked in place";
  // Masks that leave nothing (the only allowed id is EOS, under min_tokens): a uniform choice
  // among the allowed ids, not NaN weights.
  p.temperature = 1.0;
  p.allowed_token_ids = {1};
  p.min_tokens = 3;
  r = request_with(p);
  logits = {0.0f, 5.0f, 1.0f, 0.0f};
  EXPECT_EQ(sample(logits, r, {1}, rng).token, 1);
}

TEST(SamplerTest, BadWordsMaskTheirLastTokenAfterTheirPrefix) {
  sched::SamplingParams p;
  p.temperature = 0;
  p.bad_words_token_ids = {{3}, {1, 2}};  // 3 always; 2 only right after a 1
  auto r = request_with(p);
  std::mt19937_64 rng(1);
  std::vector<float> logits = {0.0f, 0.5f, 2.0f, 3.0f};
  EXPECT_EQ(sample(logits, r, {}, rng).token, 2) << "no 1 before: 2 stays allowed";
  r.output_token_ids = {0, 1};
  logits = {0.0f, 0.5f, 2.0f, 3.0f};
  EXPECT_EQ(sample(logits, r, {}, rng).token, 1) << "after a 1, both 3 and 2 are banned";
  r.output_token_ids = {1, 0};
  logits = {0.0f, 0.5f, 2.0f, 3.0f};
  EXPECT_EQ(sample(logits, r, {}, rng).token, 2) << "the prefix must end the output";
  // The prompt is not the output: a prefix only in the prompt bans nothing.
  r.prompt_token_ids = {0, 1};
  r.output_token_ids = {};
  logits = {0.0f, 0.5f, 2.0f, 3.0f};
  EXPECT_EQ(sample(logits, r, {}, rng).token, 2);
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

// --logprobs-mode, against log-softmax by hand. Raw modes ignore the processors (here
// logit_bias); processed ones report the distribution the token came from: a greedy request's
// processed logits, a random one's logits / temperature with -inf outside top-k.
TEST(SamplerTest, LogprobsModesFollowVllm) {
  using Mode = sched::LogprobsMode;
  const std::vector<float> raw = {1.0f, 2.0f, 3.0f, 0.0f};
  auto log_softmax = [](const std::vector<double>& v, size_t i) {
    double z = 0;
    for (double x : v) z += std::exp(x);
    return v[i] - std::log(z);
  };
  const std::vector<double> raw_d(raw.begin(), raw.end());
  const std::vector<double> biased = {11.0, 2.0, 3.0, 0.0};
  auto run = [&](Mode mode, double temperature, int32_t top_k) {
    sched::SamplingParams p;
    p.temperature = temperature;
    p.top_k = top_k;
    p.logprobs = 2;
    p.logprobs_mode = mode;
    p.logit_bias = {{0, 10.0f}};
    std::vector<float> logits = raw;
    std::mt19937_64 rng(5);
    return sample(logits, request_with(p), {}, rng);
  };
  auto top_ids = [](const sched::SampledToken& s) {
    std::vector<int32_t> ids;
    for (const auto& [id, lp] : s.top_logprobs) ids.push_back(id);
    return ids;
  };
  // Greedy: token 0 (biased to 11) is chosen in every mode.
  sched::SampledToken s = run(Mode::kRawLogprobs, 0, 0);
  ASSERT_EQ(s.token, 0);
  EXPECT_NEAR(s.logprob, log_softmax(raw_d, 0), 1e-5);
  EXPECT_EQ(top_ids(s), (std::vector<int32_t>{2, 1}));
  EXPECT_NEAR(s.top_logprobs[0].second, log_softmax(raw_d, 2), 1e-5);
  s = run(Mode::kRawLogits, 0, 0);
  EXPECT_EQ(s.logprob, 1.0f);
  EXPECT_EQ(top_ids(s), (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(s.top_logprobs[0].second, 3.0f);
  s = run(Mode::kProcessedLogprobs, 0, 0);
  EXPECT_NEAR(s.logprob, log_softmax(biased, 0), 1e-5);
  EXPECT_EQ(top_ids(s), (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(s.top_logprobs[1].second, log_softmax(biased, 2), 1e-5);
  s = run(Mode::kProcessedLogits, 0, 0);
  EXPECT_EQ(s.logprob, 11.0f);
  EXPECT_EQ(s.top_logprobs[1].second, 3.0f);
  // Random at temperature 0.5 with top_k 2: the support is {0, 2}, as logit / 0.5.
  for (int trial = 0; trial < 2; ++trial) {
    s = run(Mode::kProcessedLogits, 0.5, 2);
    ASSERT_TRUE(s.token == 0 || s.token == 2) << s.token;
    EXPECT_EQ(s.logprob, s.token == 0 ? 22.0f : 6.0f);
    EXPECT_EQ(top_ids(s), (std::vector<int32_t>{0, 2}));
    EXPECT_EQ(s.top_logprobs[1].second, 6.0f);
  }
  s = run(Mode::kProcessedLogprobs, 0.5, 2);
  const std::vector<double> drawn = {22.0, -INFINITY, 6.0, -INFINITY};
  EXPECT_NEAR(s.logprob, log_softmax(drawn, size_t(s.token)), 1e-5);
  const sched::SampledToken wide = run(Mode::kProcessedLogprobs, 0.5, 0);  // no top_k: 4 tokens
  EXPECT_GT(wide.top_logprobs[1].second, -INFINITY);
  sched::SamplingParams three;
  three.logprobs = 3;
  three.top_k = 2;
  three.logprobs_mode = Mode::kProcessedLogprobs;
  std::vector<float> logits = raw;
  std::mt19937_64 rng(5);
  s = sample(logits, request_with(three), {}, rng);
  ASSERT_EQ(s.top_logprobs.size(), 3u);
  EXPECT_EQ(s.top_logprobs[2].second, -INFINITY) << "outside top_k";
  // Raw modes at temperature 1: the token's raw logprob, whatever was drawn.
  s = run(Mode::kRawLogprobs, 1.0, 0);
  EXPECT_NEAR(s.logprob, log_softmax(raw_d, size_t(s.token)), 1e-5);
}

// Prompt scoring against a naive reference: softmax in double, rank by counting, top by sort.
TEST(SamplerTest, ScoreTokenMatchesTheNaiveReference) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 0.25f, -3.0f, 1.0f};
  double z = 0;
  for (float v : logits) z += std::exp(double(v));
  for (int32_t token = 0; token < int32_t(logits.size()); ++token) {
    const sched::SampledToken s = worker::score_token(logits, token, 3);
    EXPECT_EQ(s.token, token);
    EXPECT_NEAR(s.logprob, std::log(std::exp(double(logits[token])) / z), 1e-6);
    int higher = 0;
    for (float v : logits) higher += v > logits[token];
    EXPECT_EQ(s.rank, higher + 1) << token;
    ASSERT_EQ(s.top_logprobs.size(), 3u);
    // Ties keep the lower id first: 1 and 3 share the top logit.
    EXPECT_EQ(s.top_logprobs[0].first, 1);
    EXPECT_EQ(s.top_logprobs[1].first, 3);
    EXPECT_EQ(s.top_logprobs[2].first, 6);
    EXPECT_NEAR(s.top_logprobs[2].second, std::log(std::exp(1.0) / z), 1e-6);
  }
  EXPECT_TRUE(worker::score_token(logits, 2, 0).top_logprobs.empty());
}

// Top logprobs over a whole vocabulary against a sort: coarse logits (many exact ties, kept in
// id order), NaN (never listed above a number) and -inf entries, and a row with +inf entries,
// which share all the mass.
TEST(SamplerTest, TopLogprobsMatchASortOfTheVocabulary) {
  std::mt19937_64 gen(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(4096);
  for (float& x : logits) x = std::round(normal(gen) * 2.0f) / 2.0f;
  logits[7] = std::nanf("");
  logits[8] = -std::numeric_limits<float>::infinity();
  double z = 0;
  for (float v : logits)
    if (!std::isnan(v)) z += std::exp(double(v));
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto key = [&](int32_t i) {
    return std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i];
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return key(a) > key(b); });
  const sched::SampledToken s = worker::score_token(logits, 7, 20);
  EXPECT_EQ(s.logprob, -std::numeric_limits<float>::infinity()) << "NaN scores -inf";
  ASSERT_EQ(s.top_logprobs.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(s.top_logprobs[i].first, order[i]) << i;
    EXPECT_NEAR(s.top_logprobs[i].second, double(logits[size_t(order[i])]) - std::log(z), 1e-5);
  }
  const sched::SampledToken all = worker::score_token(std::span(logits).first(5), 0, 20);
  EXPECT_EQ(all.top_logprobs.size(), 5u) << "no more than the vocabulary";

  logits[100] = logits[3000] = std::numeric_limits<float>::infinity();
  const sched::SampledToken inf = worker::score_token(logits, 3000, 3);
  EXPECT_NEAR(inf.logprob, std::log(0.5), 1e-6);
  ASSERT_EQ(inf.top_logprobs.size(), 3u);
  EXPECT_EQ(inf.top_logprobs[0].first, 100);
  EXPECT_EQ(inf.top_logprobs[1].first, 3000);
  EXPECT_EQ(inf.top_logprobs[2].second, -std::numeric_limits<float>::infinity());
}

}  // namespace

namespace spec {

// The critical values of chi-square at p = 0.01 by degrees of freedom (1..40).
constexpr double kChi2Critical01[] = {
    6.635,  9.210,  11.345, 13.277, 15.086, 16.812, 18.475, 20.090, 21.666, 23.209,
    24.725, 26.217, 27.688, 29.141, 30.578, 32.000, 33.409, 34.805, 36.191, 37.566,
    38.932, 40.289, 41.638, 42.980, 44.314, 45.642, 46.963, 48.278, 49.588, 50.892,
    52.191, 53.486, 54.776, 56.061, 57.342, 58.619, 59.893, 61.162, 62.428, 63.691};

// Two-sample chi-square on histograms of equal totals; true when they agree at p > 0.01.
bool histograms_agree(const std::map<int, int>& a, const std::map<int, int>& b, double* stat) {
  std::set<int> bins;
  for (const auto& [k, v] : a) bins.insert(k);
  for (const auto& [k, v] : b) bins.insert(k);
  *stat = 0;
  for (int k : bins) {
    const double x = a.count(k) ? a.at(k) : 0, y = b.count(k) ? b.at(k) : 0;
    *stat += (x - y) * (x - y) / (x + y);
  }
  const size_t df = bins.size() - 1;
  return df == 0 || (df <= 40 && *stat < kChi2Critical01[df - 1]);
}

// A two-position "model" over a vocabulary of 6: fixed first logits, and second logits that
// depend on the first token.
std::vector<float> first_logits() {
  return {1.2f, 0.3f, -0.5f, 0.9f, 0.0f, -1.5f};
}
std::vector<float> second_logits(int32_t first) {
  std::vector<float> l(6);
  for (int v = 0; v < 6; ++v) l[v] = 0.4f * float((v * 3 + first) % 6) - 0.2f * float(first == v);
  return l;
}

}  // namespace spec

// Speculative decoding's rejection sampling gives the plain sampler's distribution: the joint
// histogram of two tokens, drawn plainly or as (verify a draft, then the next token), agrees by a
// chi-square test at p > 0.01, for several drafts and sampling settings (fixed seeds, not timing).
TEST(SamplerTest, SpeculativeVerificationKeepsTheDistribution) {
  std::vector<sched::SamplingParams> settings(4);
  settings[0].temperature = 1.0;
  settings[1].temperature = 0.7;
  settings[1].top_k = 4;
  settings[2].temperature = 1.3;
  settings[2].top_p = 0.8;
  settings[3].temperature = 1.0;
  settings[3].repetition_penalty = 1.5;
  settings[3].min_p = 0.1;
  const int kDraws = 20000;
  int checked = 0;
  for (size_t s = 0; s < settings.size(); ++s) {
    for (int32_t draft : {0, 2, 5}) {  // likely, unlikely, and (with cuts) outside the support
      sched::Request r = request_with(settings[s]);
      std::map<int, int> plain, speculative;
      std::mt19937_64 rng(1234 + s * 10 + draft), rng_spec(99 + s * 10 + draft);
      int accepted = 0;
      for (int i = 0; i < kDraws; ++i) {
        auto l1 = spec::first_logits();
        const int32_t a = sample(l1, r, {}, rng).token;
        auto l2 = spec::second_logits(a);
        sched::Request r2 = r;
        r2.output_token_ids = {a};
        const int32_t b = sample(l2, r2, {}, rng).token;
        ++plain[a * 6 + b];

        auto v1 = spec::first_logits();
        const worker::VerifiedToken v = worker::verify_draft(
            v1, r.sampling, {r.prompt_token_ids, r.output_token_ids}, draft, rng_spec);
        accepted += v.accepted;
        EXPECT_EQ(v.accepted, v.sampled.token == draft);
        auto w2 = spec::second_logits(v.sampled.token);
        sched::Request r3 = r;
        r3.output_token_ids = {v.sampled.token};
        const int32_t c = sample(w2, r3, {}, rng_spec).token;
        ++speculative[v.sampled.token * 6 + c];
      }
      double stat = 0;
      EXPECT_TRUE(spec::histograms_agree(plain, speculative, &stat))
          << "setting " << s << " draft " << draft << ": chi-square " << stat;
      // The acceptance rate is p(draft) itself.
      EXPECT_EQ(accepted > 0, plain.lower_bound(draft * 6) != plain.lower_bound(draft * 6 + 6))
          << "setting " << s << " draft " << draft;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
}

// Greedy verification accepts exactly the argmax and otherwise returns it.
TEST(SamplerTest, GreedyVerificationAcceptsOnlyTheArgmax) {
  sched::SamplingParams p;
  p.temperature = 0;
  auto r = request_with(p);
  std::mt19937_64 rng(5);
  for (int32_t draft : {0, 1, 3}) {
    std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f};
    const auto v =
        worker::verify_draft(logits, p, {r.prompt_token_ids, r.output_token_ids}, draft, rng);
    EXPECT_EQ(v.sampled.token, 1);
    EXPECT_EQ(v.accepted, draft == 1);
  }
}

// A numerically broken row (NaN or infinite logits, as a corrupt checkpoint or an overflow
// gives) still yields a token of the vocabulary with a logprob that is a number: NaN never
// wins, +inf logits share the mass, and an all-NaN row is a uniform choice.
TEST(SamplerTest, NonFiniteLogitsStillGiveAToken) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Row {
    std::vector<float> logits;
    std::set<int32_t> possible;
  };
  const std::vector<Row> rows = {{{nan, nan, nan, nan}, {0, 1, 2, 3}},
                                 {{1.0f, nan, 2.0f, 0.5f}, {0, 2, 3}},
                                 {{inf, 1.0f, inf, 0.0f}, {0, 2}},
                                 {{-inf, -inf, -inf, 1.0f}, {3}},
                                 {{nan, inf, -inf, 0.0f}, {1}}};
  int checked = 0;
  for (const double temperature : {0.0, 1.0})
    for (const double top_p : {1.0, 0.5})
      for (const int32_t top_k : {0, 2})
        for (const double min_p : {0.0, 0.1})
          for (const Row& row : rows) {
            sched::SamplingParams p;
            p.temperature = temperature;
            p.top_p = top_p;
            p.top_k = top_k;
            p.min_p = min_p;
            p.logprobs = 2;
            const auto r = request_with(p);
            std::mt19937_64 rng(3);
            for (int draw = 0; draw < 20; ++draw) {
              std::vector<float> logits = row.logits;
              const auto s = sample(logits, r, {}, rng);
              EXPECT_TRUE(row.possible.count(s.token))
                  << "token " << s.token << " from row " << &row - rows.data() << " T "
                  << temperature << " top_p " << top_p << " top_k " << top_k;
              EXPECT_FALSE(std::isnan(s.logprob));
              ++checked;
            }
          }
  EXPECT_EQ(checked, 16 * 5 * 20);
  // Prompt logprobs score raw logits: every figure must still be a number or -inf (all of
  // them -inf on the all-NaN row, which has no distribution to score against).
  for (const Row& row : rows)
    for (int32_t token = 0; token < 4; ++token) {
      const auto s = worker::score_token(row.logits, token, 2);
      const bool all_nan = &row == &rows[0];
      EXPECT_FALSE(std::isnan(s.logprob)) << "token " << token;
      EXPECT_EQ(s.logprob > -inf, !all_nan && row.possible.count(token) > 0) << "token " << token;
      ASSERT_EQ(s.top_logprobs.size(), 2u);
      EXPECT_TRUE(row.possible.count(s.top_logprobs[0].first));
      for (const auto& [id, lp] : s.top_logprobs) EXPECT_FALSE(std::isnan(lp)) << id;
    }
}
