// Monotonic wall-clock helpers for logs and benchmarks. Stateless; thread-safe.
#pragma once

#include <chrono>

namespace common {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

}  // namespace common
