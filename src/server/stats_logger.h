// vLLM's periodic engine stats line ("Engine 000: Avg prompt throughput: ... tokens/s, ...
// Prefix cache hit rate: ...%"), logged every VLLM_LOG_STATS_INTERVAL seconds (10) unless
// --disable-log-stats. Idle intervals after an idle one are not logged, as vLLM demotes them
// to debug. Thread-safe: one thread of its own, joined by the destructor.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_client.h"

namespace server {

// One engine's line for the interval from `before` to `now` (`seconds` long), or "" when the
// interval and the one before it (`was_busy`) saw no tokens.
std::string engine_stats_line(const engine::EngineMetrics& before, const engine::EngineMetrics& now,
                              double seconds, bool was_busy);

class StatsLogger {
 public:
  StatsLogger(const engine::EngineClient& engine, std::chrono::milliseconds interval);
  ~StatsLogger();
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;

  // VLLM_LOG_STATS_INTERVAL in seconds (10 when unset or not a positive number).
  static std::chrono::milliseconds interval_from_env();

 private:
  void loop();

  const engine::EngineClient& engine_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace server
