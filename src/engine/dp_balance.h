// The data-parallel balancer's choice of engine (vLLM's DPLBAsyncMPClient rule): the live engine
// with the least `waiting * 4 + running`; ties go to the first in scan order. Pure function of
// its arguments, so the rule is tested without processes or clocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace engine {

struct EngineLoad {
  bool alive = false;            // ready and not dead
  int64_t unfinished = 0;        // this front end's requests not yet finished there
  int64_t reported_running = 0;  // num_running of the engine's last stats report
};

// `first`: where the scan starts (callers advance it per pick, so that ties go round-robin).
// Returns -1 when no engine is alive.
int least_loaded_engine(const std::vector<EngineLoad>& engines, size_t first);

}  // namespace engine
