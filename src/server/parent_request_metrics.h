// ParentRequestMetrics: vLLM's two histograms counted once per parent request (a prompt with
// its n choices) when its last choice finishes, under the engine whose output finished it:
// the n parameter and the most tokens any of its choices generated. The API server fills
// them, as vLLM's front end does, because a parent's choices may run on different engines.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "engine/metrics.h"

namespace server {

class ParentRequestMetrics {
 public:
  // Token buckets 1, 2, 5, ... up to max_model_len, as the engine's.
  explicit ParentRequestMetrics(int64_t max_model_len);

  void observe(int engine_index, int n, int64_t max_num_generation_tokens);

  struct Histograms {
    engine::Histogram params_n;
    engine::Histogram max_num_generation_tokens;
  };
  // Empty histograms (with their bounds) for an engine that finished no parent yet.
  Histograms of_engine(int engine_index) const;

 private:
  Histograms empty() const;

  const std::vector<double> token_buckets_;
  mutable std::mutex mu_;
  std::map<int, Histograms> by_engine_;
};

}  // namespace server
