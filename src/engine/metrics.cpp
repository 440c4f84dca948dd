// Histogram bucketing.
#include "engine/metrics.h"

#include <algorithm>

namespace engine {

void Histogram::observe(double v) {
  const size_t i = std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin();
  ++counts[i];
  sum += v;
  ++count;
}

}  // namespace engine
