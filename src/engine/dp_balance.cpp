// See dp_balance.h.
#include "engine/dp_balance.h"

#include <algorithm>

namespace engine {

int least_loaded_engine(const std::vector<EngineLoad>& engines, size_t first) {
  const size_t n = engines.size();
  int best = -1;
  int64_t best_score = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (first + k) % n;
    const EngineLoad& e = engines[i];
    if (!e.alive) continue;
    // The last report splits the exact count of unfinished requests into running and waiting:
    // those sent since the report count as waiting.
    const int64_t running = std::min(e.reported_running, e.unfinished);
    const int64_t waiting = e.unfinished - running;
    const int64_t score = waiting * 4 + running;
    if (best < 0 || score < best_score) best = int(i), best_score = score;
  }
  return best;
}

}  // namespace engine
