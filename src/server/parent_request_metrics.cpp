// ParentRequestMetrics implementation.
#include "server/parent_request_metrics.h"

namespace server {

ParentRequestMetrics::ParentRequestMetrics(int64_t max_model_len)
    : token_buckets_(engine::one_two_five_buckets(max_model_len)) {}

ParentRequestMetrics::Histograms ParentRequestMetrics::empty() const {
  return {engine::Histogram({1, 2, 5, 10, 20}), engine::Histogram(token_buckets_)};
}

void ParentRequestMetrics::observe(int engine_index, int n, int64_t max_num_generation_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_engine_.find(engine_index);
  if (it == by_engine_.end()) it = by_engine_.emplace(engine_index, empty()).first;
  it->second.params_n.observe(static_cast<double>(n));
  it->second.max_num_generation_tokens.observe(static_cast<double>(max_num_generation_tokens));
}

ParentRequestMetrics::Histograms ParentRequestMetrics::of_engine(int engine_index) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_engine_.find(engine_index);
  return it == by_engine_.end() ? empty() : it->second;
}

}  // namespace server
