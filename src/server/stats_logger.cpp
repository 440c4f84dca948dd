// The periodic stats line: token counters differenced over the interval, gauges as they are.
#include "server/stats_logger.h"

#include <cstdio>
#include <cstdlib>
#include <map>

#include "common/logging.h"

namespace server {

std::string engine_stats_line(const engine::EngineMetrics& before, const engine::EngineMetrics& now,
                              double seconds, bool was_busy) {
  const engine::Metrics& a = before.snapshot.totals;
  const engine::Metrics& b = now.snapshot.totals;
  const int64_t prompt = b.prompt_tokens - a.prompt_tokens;
  const int64_t generated = b.generation_tokens - a.generation_tokens;
  if (prompt == 0 && generated == 0 && !was_busy) return "";
  const double s = seconds > 0 ? seconds : 1.0;
  // Over about the last 1000 requests' lookups, as vLLM's CachingMetrics.
  const engine::MetricsSnapshot& n = now.snapshot;
  const double hit_rate =
      n.recent_prefix_cache_queries > 0
          ? 100.0 * double(n.recent_prefix_cache_hits) / double(n.recent_prefix_cache_queries)
          : 0.0;
  char line[320];
  std::snprintf(line, sizeof(line),
                "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: "
                "%.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, "
                "Prefix cache hit rate: %.1f%%",
                now.engine_index, double(prompt) / s, double(generated) / s,
                now.snapshot.num_running, now.snapshot.num_waiting,
                100.0 * now.snapshot.kv_cache_usage, hit_rate);
  return line;
}

StatsLogger::StatsLogger(const engine::EngineClient& engine, std::chrono::milliseconds interval)
    : engine_(engine), interval_(interval), thread_([this] { loop(); }) {}

StatsLogger::~StatsLogger() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::chrono::milliseconds StatsLogger::interval_from_env() {
  const char* v = std::getenv("VLLM_LOG_STATS_INTERVAL");
  char* end = nullptr;
  const double seconds = v ? std::strtod(v, &end) : 0.0;
  if (!v || end == v || *end != '\0' || !(seconds > 0) || seconds > 86400)
    return std::chrono::seconds(10);
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

void StatsLogger::loop() {
  using clock = std::chrono::steady_clock;
  std::vector<engine::EngineMetrics> last = engine_.engine_metrics();
  std::map<int, bool> busy;  // per engine: whether the last interval logged tokens
  auto last_at = clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, interval_, [this] { return stop_; })) {
    lock.unlock();
    std::vector<engine::EngineMetrics> now = engine_.engine_metrics();
    const auto at = clock::now();
    const double seconds = std::chrono::duration<double>(at - last_at).count();
    for (const engine::EngineMetrics& m : now) {
      engine::EngineMetrics before{m.engine_index, {}};
      for (const engine::EngineMetrics& l : last) {
        if (l.engine_index == m.engine_index) before = l;
      }
      const std::string line = engine_stats_line(before, m, seconds, busy[m.engine_index]);
      const engine::Metrics& a = before.snapshot.totals;
      const engine::Metrics& b = m.snapshot.totals;
      busy[m.engine_index] =
          b.prompt_tokens != a.prompt_tokens || b.generation_tokens != a.generation_tokens;
      if (!line.empty()) LOG(INFO) << line;
    }
    last = std::move(now);
    last_at = at;
    lock.lock();
  }
}

}  // namespace server
