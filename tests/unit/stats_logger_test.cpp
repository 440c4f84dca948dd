// The periodic stats line: vLLM's wording, rates over the interval, the recent prefix-cache hit
// rate, and quiet when idle twice.
#include "server/stats_logger.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

namespace {

engine::EngineMetrics at(int64_t prompt, int64_t generated) {
  engine::EngineMetrics m;
  m.engine_index = 1;
  m.snapshot.totals.prompt_tokens = prompt;
  m.snapshot.totals.generation_tokens = generated;
  m.snapshot.totals.prefix_cache_queries = 900;  // since the start: not what the line shows
  m.snapshot.totals.prefix_cache_hits = 50;
  m.snapshot.recent_prefix_cache_queries = 200;
  m.snapshot.recent_prefix_cache_hits = 50;
  m.snapshot.num_running = 3;
  m.snapshot.num_waiting = 2;
  m.snapshot.kv_cache_usage = 0.125;
  return m;
}

TEST(StatsLoggerTest, LineFollowsVllm) {
  EXPECT_EQ(server::engine_stats_line(at(100, 40), at(1100, 240), 10.0, false),
            "Engine 001: Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 20.0 "
            "tokens/s, Running: 3 reqs, Waiting: 2 reqs, GPU KV cache usage: 12.5%, Prefix cache "
            "hit rate: 25.0%");
  EXPECT_EQ(server::engine_stats_line(at(5, 5), at(5, 5), 10.0, false), "")
      << "an idle interval after an idle one is not logged";
  EXPECT_NE(server::engine_stats_line(at(5, 5), at(5, 5), 10.0, true), "")
      << "the first idle interval after work is (its zero rates end the burst)";
}

// The hit rate covers about the last 1000 lookups, step by step, as vLLM's CachingMetrics.
TEST(StatsLoggerTest, HitRateCoversTheLastThousandRequests) {
  engine::RecentPrefixCacheHits w;
  w.observe(600, 6000, 6000);  // all hits
  w.observe(0, 0, 0);          // an idle step changes nothing
  EXPECT_EQ(w.queries(), 6000);
  w.observe(400, 4000, 0);  // 1000 lookups: the first step stays
  EXPECT_EQ(w.hits(), 6000);
  EXPECT_EQ(w.queries(), 10000);
  w.observe(1, 10, 0);  // 1001: the first step leaves
  EXPECT_EQ(w.hits(), 0);
  EXPECT_EQ(w.queries(), 4010);
  w.observe(5000, 50000, 25000);  // a step past the limit on its own stays, alone
  EXPECT_EQ(w.queries(), 50000);
  EXPECT_EQ(w.hits(), 25000);
}

TEST(StatsLoggerTest, IntervalFromTheEnvironment) {
  setenv("VLLM_LOG_STATS_INTERVAL", "2.5", 1);
  EXPECT_EQ(server::StatsLogger::interval_from_env(), std::chrono::milliseconds(2500));
  for (const char* bad : {"0", "-1", "ten", ""}) {
    setenv("VLLM_LOG_STATS_INTERVAL", bad, 1);
    EXPECT_EQ(server::StatsLogger::interval_from_env(), std::chrono::seconds(10)) << bad;
  }
  unsetenv("VLLM_LOG_STATS_INTERVAL");
  EXPECT_EQ(server::StatsLogger::interval_from_env(), std::chrono::seconds(10));
}

}  // namespace
