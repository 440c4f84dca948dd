// The CPP chunk predictor on the worked examples of cpp-design.md §5.4 (exact chunk sizes),
// the startup schedule, the profiling fallback and online calibration.
#include "sched/chunk_predictor.h"

#include <gtest/gtest.h>

#include <cmath>

namespace {

// A predictor fitted on exact samples of f(l) = a l² + b l + c at the startup schedule.
sched::ChunkSizePredictor fitted(double a, double b, double c, int64_t base, double sigma,
                                 int64_t min_chunk) {
  sched::ChunkSizePredictor p(base, 128, sigma, min_chunk, 30);
  std::vector<std::pair<int64_t, double>> samples;
  const auto sizes = sched::ChunkSizePredictor::profile_chunk_sizes(base);
  for (size_t i = 1; i < sizes.size(); ++i) {
    const double l = static_cast<double>(sizes[i]);
    samples.emplace_back(sizes[i], a * l * l + b * l + c);
  }
  std::vector<std::string> log;
  EXPECT_TRUE(p.fit_profile(samples, &log));
  return p;
}

TEST(ChunkPredictorTest, StartupScheduleIsBaseDownToBaseOver64) {
  const auto s = sched::ChunkSizePredictor::profile_chunk_sizes(32768);
  ASSERT_EQ(s.size(), 65u);
  EXPECT_EQ(s[0], 32768);  // warm-up, clamped to B
  EXPECT_EQ(s[1], 32768);
  EXPECT_EQ(s[2], 32256);
  EXPECT_EQ(s[64], 512);
}

TEST(ChunkPredictorTest, WorkedExampleA_UnitTestCoefficients) {
  auto p1 = fitted(1e-6, 0.01, 1.0, 8192, 1.0, 4096);
  EXPECT_NEAR(p1.a(), 1e-6, 1e-12);
  EXPECT_NEAR(p1.b(), 0.01, 1e-9);
  EXPECT_NEAR(p1.c(), 1.0, 1e-6);
  EXPECT_NEAR(p1.target_ms(), 149.03, 0.01);
  EXPECT_NEAR(*p1.solve(4096, p1.target_ms()), 6127.9, 0.1);
  EXPECT_NEAR(*p1.solve(16384, p1.target_ms()), 3239.2, 0.1);
  EXPECT_NEAR(*p1.solve(65536, p1.target_ms()), 1048.6, 0.1);
  auto p2 = fitted(1e-6, 0.01, 1.0, 8192, 0.8, 4096);
  auto p3 = fitted(1e-6, 0.01, 1.0, 8192, 1.0, 256);
  const int64_t history[] = {0, 4096, 16384, 65536};
  const int64_t sigma1_min4096[] = {8192, 6144, 4096, 4096};
  const int64_t sigma08_min4096[] = {8192, 6656, 4352, 4096};
  const int64_t sigma1_min256[] = {8192, 6144, 3328, 1152};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(p1.predict(history[i]), sigma1_min4096[i]) << "L=" << history[i];
    EXPECT_EQ(p2.predict(history[i]), sigma08_min4096[i]) << "L=" << history[i];
    EXPECT_EQ(p3.predict(history[i]), sigma1_min256[i]) << "L=" << history[i];
  }
}

TEST(ChunkPredictorTest, WorkedExampleB_128kPromptChunks) {
  auto p = fitted(2e-7, 0.05, 15.0, 32768, 1.0, 4096);
  EXPECT_NEAR(p.target_ms(), 1853.1, 0.1);
  std::vector<int64_t> chunks;
  std::vector<double> costs;
  for (int64_t done = 0; done < 131072;) {
    const int64_t n = std::min<int64_t>(*p.predict(done), 131072 - done);
    chunks.push_back(n);
    costs.push_back(p.predict_time(n, done));
    done += n;
  }
  EXPECT_EQ(chunks, (std::vector<int64_t>{32768, 27136, 23680, 21248, 19456, 6784}));
  const double expected_costs[] = {1853, 1860, 1864, 1863, 1864, 686};
  for (size_t i = 0; i < costs.size(); ++i)
    EXPECT_NEAR(costs[i], expected_costs[i], 1.0) << "chunk " << i;
  // Fixed 32K chunks grow: 1853 / 2283 / 2712 / 3142 ms.
  const double fixed[] = {1853, 2283, 2712, 3142};
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(p.predict_time(32768, 32768 * k), fixed[k], 1.0);
}

TEST(ChunkPredictorTest, WorkedExampleC_TimeBudgetAcrossTwoPrefills) {
  auto p = fitted(2e-7, 0.05, 15.0, 32768, 1.0, 4096);
  double budget = p.target_ms();
  int64_t tokens = 32768;
  // R1: history 120000, 11072 tokens left; predicted 18304, clamped to what remains.
  EXPECT_EQ(p.predict(120000, budget), 18304);
  const int64_t r1 = std::min<int64_t>(*p.predict(120000, budget), 11072);
  EXPECT_EQ(r1, 11072);
  budget -= p.predict_time(r1, 120000);
  tokens -= r1;
  EXPECT_NEAR(p.predict_time(r1, 120000), 1110, 1.0);
  EXPECT_NEAR(budget, 744, 1.0);
  EXPECT_EQ(tokens, 21696);
  // R2: a new request predicted against the remaining budget.
  const int64_t r2 = *p.predict(0, budget);
  EXPECT_EQ(r2, 14080);
  budget -= p.predict_time(r2, 0);
  EXPECT_NEAR(budget, 0, 2.0);
}

TEST(ChunkPredictorTest, TooFewProfileSamplesFallBack) {
  sched::ChunkSizePredictor p(8192, 128, 1.0, 4096, 30);
  std::vector<std::string> log;
  EXPECT_FALSE(p.fit_profile({{8192, 100.0}, {4096, 50.0}, {2048, 25.0}}, &log));
  EXPECT_FALSE(p.ready());
  EXPECT_FALSE(p.predict(0).has_value());
  EXPECT_EQ(p.predict_time(100, 0), 0.0);
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), "[ProfilingChunk] Profiling failed: only 3/8 samples collected");
}

TEST(ChunkPredictorTest, OnlineCalibrationSetsTargetFitsHistoryAndFreezes) {
  auto p = fitted(2e-7, 0.05, 15.0, 32768, 1.0, 4096);
  std::vector<std::string> log;
  // True per-request cost t(C, H) = 3e-7·C·(C+H) + 0.04·(C+H) + 20.
  auto truth = [](int64_t c, int64_t h) {
    return 3e-7 * double(c) * double(c + h) + 0.04 * double(c + h) + 20;
  };
  const std::pair<int64_t, int64_t> steps[] = {{32768, 0},     {32768, 0},    {32768, 0},
                                               {16384, 32768}, {8192, 65536}, {20000, 10000},
                                               {4096, 90000},  {30000, 5000}, {12000, 40000}};
  for (const auto& [c, h] : steps) p.record_step({{c, h}}, truth(c, h), &log);
  EXPECT_NEAR(p.target_ms(), truth(32768, 0), 1e-9);  // the third zero-history step sets T
  EXPECT_TRUE(p.history_model_ready());
  EXPECT_NEAR(p.predict_time(10000, 50000), truth(10000, 50000), 0.5);
  // With the history model, a zero-history chunk that costs T is B tokens.
  EXPECT_NEAR(*p.solve(0, p.target_ms()), 32768, 1.0);
  // After 3 zero-history steps and more than max_fit_chunk samples, the model freezes and
  // timing switches off.
  sched::ChunkSizePredictor q(32768, 128, 1.0, 4096, 6);
  std::vector<std::pair<int64_t, double>> samples;
  for (int64_t l : sched::ChunkSizePredictor::profile_chunk_sizes(32768))
    samples.emplace_back(l, 2e-7 * l * l + 0.05 * l + 15);
  ASSERT_TRUE(q.fit_profile(samples, nullptr));
  int steps_timed = 0;
  for (int i = 0; i < 12 && q.need_timing(); ++i, ++steps_timed) {
    q.record_step({{32768 - 1000 * i, i < 3 ? 0 : 1000 * i}}, 1500.0 + 10 * i + (i % 3) * 7,
                  nullptr);
  }
  // max_fit_chunk + 1 = 7 recorded samples freeze the model; the next step turns timing off.
  EXPECT_EQ(steps_timed, 8);
  EXPECT_FALSE(q.need_timing());
}

}  // namespace

#include <nlohmann/json.hpp>

#include "sched/profiling_chunk_config.h"

namespace {

common::Result<sched::ProfilingChunkConfig> parse(const std::string& inner, int pp, int64_t batched,
                                                  std::vector<std::string>* warnings = nullptr) {
  auto j =
      nlohmann::json::parse(R"({"scheduler_config": {"profiling_chunk_config": )" + inner + "}}");
  return sched::parse_profiling_chunk_config(j, pp, batched, warnings);
}

TEST(ProfilingChunkConfigTest, DefaultsAndLegacyKey) {
  auto c = parse(R"({"enabled": true})", 2, 32768);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->enabled);
  EXPECT_DOUBLE_EQ(c->smooth_factor, 1.0);
  EXPECT_EQ(c->min_chunk, 4096);
  EXPECT_TRUE(c->need_timing);
  EXPECT_EQ(c->max_fit_chunk, 30);
  std::vector<std::string> warnings;
  auto legacy = sched::parse_profiling_chunk_config(
      nlohmann::json::parse(
          R"({"profiling_chunk_config": {"enabled": true, "mode": "upstream", "smooth_factor": 0.8}})"),
      2, 32768, &warnings);
  ASSERT_TRUE(legacy.ok());
  EXPECT_DOUBLE_EQ(legacy->smooth_factor, 0.8);
  EXPECT_EQ(warnings.size(), 1u);
}

TEST(ProfilingChunkConfigTest, ValidationMessages) {
  EXPECT_NE(parse(R"({"enabled": true})", 1, 32768)
                .status()
                .message()
                .find("profiling_chunk_config requires pipeline parallelism (pp > 1)."),
            std::string::npos);
  EXPECT_EQ(parse(R"({"enabled": true, "smooth_factor": 0})", 2, 32768).status().message(),
            "smooth_factor must be in (0, 1], got 0.0");
  EXPECT_EQ(parse(R"({"enabled": true, "smooth_factor": 1.5})", 2, 32768).status().message(),
            "smooth_factor must be in (0, 1], got 1.5");
  EXPECT_EQ(parse(R"({"enabled": true, "max_fit_chunk": 5})", 2, 32768).status().message(),
            "Recommend to use at least 30 data points for fitting, got 5");
  std::vector<std::string> warnings;
  auto clamped = parse(R"({"enabled": true, "min_chunk": 4096})", 2, 1024, &warnings);
  ASSERT_TRUE(clamped.ok());
  EXPECT_EQ(clamped->min_chunk, 1024);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("Clamping min_chunk to 1024"), std::string::npos);
  auto off = parse(R"({"enabled": false, "need_timing": true})", 1, 32768, &warnings);
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->need_timing);
}

}  // namespace

namespace {

TEST(ProfilingChunkConfigTest, ModeKeySelectsPlannedByDefaultOrUpstream) {
  auto c = parse(R"({"enabled": true})", 2, 32768);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->mode, sched::ProfilingChunkConfig::kPlanned);
  EXPECT_EQ(c->timing_stage, "max");  // the slowest stage paces a planned pipeline
  auto u = parse(R"({"enabled": true, "mode": "upstream"})", 2, 32768);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->mode, sched::ProfilingChunkConfig::kUpstream);
  EXPECT_EQ(u->timing_stage, "last");  // vllm-ascend's behaviour
  EXPECT_EQ(parse(R"({"enabled": true, "mode": "dynamic"})", 2, 32768).status().message(),
            "profiling_chunk_config.mode must be \"planned\" or \"upstream\", got \"dynamic\"");
  EXPECT_EQ(parse(R"({"enabled": true, "mode": 1})", 2, 32768).status().message(),
            "profiling_chunk_config.mode must be \"planned\" or \"upstream\", got 1");
  // Upstream-only keys in planned mode are accepted with a warning that says so.
  std::vector<std::string> warnings;
  ASSERT_TRUE(parse(R"({"enabled": true, "overhead_aware": true})", 2, 32768, &warnings).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("apply to mode \"upstream\""), std::string::npos);
}

TEST(ProfilingChunkConfigTest, TimingStageExtension) {
  auto c = parse(R"({"enabled": true, "mode": "upstream"})", 2, 32768);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->timing_stage, "last");  // upstream behaviour by default
  auto m = parse(R"({"enabled": true, "timing_stage": "max"})", 2, 32768);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->timing_stage, "max");
  EXPECT_EQ(parse(R"({"enabled": true, "timing_stage": "first"})", 2, 32768).status().message(),
            "profiling_chunk_config.timing_stage must be \"last\" or \"max\", got \"first\"");
}

TEST(ProfilingChunkConfigTest, MergeTailExtension) {
  auto c = parse(R"({"enabled": true})", 2, 32768);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->merge_tail, 0);  // upstream: tails are never merged
  auto m = parse(R"({"enabled": true, "merge_tail": 256})", 2, 32768);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->merge_tail, 256);
  for (const char* bad :
       {R"({"enabled": true, "merge_tail": -1})", R"({"enabled": true, "merge_tail": "big"})"}) {
    EXPECT_EQ(parse(bad, 2, 32768).status().message(),
              "profiling_chunk_config.merge_tail must be a non-negative integer")
        << bad;
  }
}

TEST(ProfilingChunkConfigTest, OverheadAwareExtension) {
  auto c = parse(R"({"enabled": true})", 2, 32768);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->overhead_aware);  // upstream by default
  auto m = parse(R"({"enabled": true, "overhead_aware": true})", 2, 32768);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->overhead_aware);
  EXPECT_EQ(parse(R"({"enabled": true, "overhead_aware": 1})", 2, 32768).status().message(),
            "profiling_chunk_config.overhead_aware must be a boolean");
}

TEST(ProfilingChunkConfigTest, MinPredictedGain) {
  auto c = parse(R"({"enabled": true})", 2, 32768);
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->min_predicted_gain, 0.03);
  auto z = parse(R"({"enabled": true, "min_predicted_gain": 0})", 2, 32768);
  ASSERT_TRUE(z.ok());
  EXPECT_DOUBLE_EQ(z->min_predicted_gain, 0.0);
  EXPECT_EQ(parse(R"({"enabled": true, "min_predicted_gain": "5%"})", 2, 32768).status().message(),
            "profiling_chunk_config.min_predicted_gain must be a number");
  EXPECT_EQ(parse(R"({"enabled": true, "min_predicted_gain": 1})", 2, 32768).status().message(),
            "min_predicted_gain must be in [0, 1), got 1.0");
}

TEST(ProfilingChunkConfigTest, ChunkAlignExtension) {
  auto c = parse(R"({"enabled": true})", 2, 32768);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->chunk_align, 0);  // upstream: max(block_size, 64)
  auto m = parse(R"({"enabled": true, "chunk_align": 16})", 2, 32768);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->chunk_align, 16);
  EXPECT_EQ(parse(R"({"enabled": true, "chunk_align": -16})", 2, 32768).status().message(),
            "profiling_chunk_config.chunk_align must be a non-negative integer");
}

// Example (a) at L = 16384 with min_chunk 256: the raw root 3239.2 rounds up to 3328 with
// upstream's 128-token alignment and to 3248 with 16.
TEST(ChunkSizePredictorTest, ChunkAlignRoundsUpToTheGivenStep) {
  sched::ChunkSizePredictor p(8192, 128, 1.0, 256, 30);
  std::vector<std::pair<int64_t, double>> samples;
  for (int64_t l : sched::ChunkSizePredictor::profile_chunk_sizes(8192))
    samples.emplace_back(l, 1e-6 * double(l) * double(l) + 0.01 * double(l) + 1.0);
  ASSERT_TRUE(p.fit_profile(samples, nullptr));
  EXPECT_EQ(p.predict(16384), 3328);
  p.set_chunk_align(16);
  EXPECT_EQ(p.predict(16384), 3248);
}

}  // namespace
