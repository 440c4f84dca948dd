// Histogram bucketing.
#include "engine/metrics.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace engine {

void Histogram::observe(double v) {
  const size_t i = std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin();
  ++counts[i];
  sum += v;
  ++count;
}

bool Histogram::merge(const Histogram& o) {
  if (count == 0 && bounds != o.bounds) *this = Histogram(o.bounds);
  if (bounds != o.bounds) return false;
  for (size_t i = 0; i < counts.size(); ++i) counts[i] += o.counts[i];
  sum += o.sum;
  count += o.count;
  return true;
}

std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
          1,     2.5,   5,    7.5,  10,   20,   40,   80,  160,  640, 2560};
}

std::vector<double> inter_token_latency_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
          0.75, 1,     2.5,  5,     7.5, 10,   20,  40,  80};
}

std::vector<double> request_latency_buckets() {
  return {0.3, 0.5, 0.8, 1,  1.5, 2,   2.5, 5,   10,   15,  20,
          30,  40,  50,  60, 120, 240, 480, 960, 1920, 7680};
}

std::vector<double> one_two_five_buckets(int64_t max_value) {
  std::vector<double> out;
  for (int64_t scale = 1; scale <= max_value && scale <= INT64_MAX / 10; scale *= 10)
    for (int64_t m : {1, 2, 5})
      if (m * scale <= max_value) out.push_back(double(m * scale));
  return out;
}

void RecentPrefixCacheHits::observe(int64_t requests, int64_t queries, int64_t hits) {
  if (requests == 0) return;  // an empty step would push useful ones out of the window
  steps_.push_back({requests, queries, hits});
  requests_ += requests, queries_ += queries, hits_ += hits;
  while (steps_.size() > 1 && requests_ > kMaxRecentRequests) {
    const Step& old = steps_.front();
    requests_ -= old.requests, queries_ -= old.queries, hits_ -= old.hits;
    steps_.pop_front();
  }
}

void SpecDecodingCounters::observe(int64_t num_draft_tokens_of_step, int64_t num_accepted) {
  ++num_drafts;
  num_draft_tokens += num_draft_tokens_of_step;
  num_accepted_tokens += num_accepted;
  for (int64_t p = 0; p < num_accepted && p < static_cast<int64_t>(accepted_per_pos.size()); ++p)
    ++accepted_per_pos[p];
}

SpecDecodingCounters& SpecDecodingCounters::operator+=(const SpecDecodingCounters& o) {
  num_drafts += o.num_drafts;
  num_draft_tokens += o.num_draft_tokens;
  num_accepted_tokens += o.num_accepted_tokens;
  if (accepted_per_pos.size() < o.accepted_per_pos.size())
    accepted_per_pos.resize(o.accepted_per_pos.size(), 0);
  for (size_t p = 0; p < o.accepted_per_pos.size(); ++p)
    accepted_per_pos[p] += o.accepted_per_pos[p];
  return *this;
}

std::string SpecDecodingCounters::log_line(const SpecDecodingCounters& since,
                                           double seconds) const {
  const int64_t drafts = num_drafts - since.num_drafts;
  const int64_t drafted = num_draft_tokens - since.num_draft_tokens;
  const int64_t accepted = num_accepted_tokens - since.num_accepted_tokens;
  const double per_s = seconds > 0 ? 1.0 / seconds : 0.0;
  char head[320];
  std::snprintf(head, sizeof(head),
                "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f "
                "tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %lld tokens, Drafted: "
                "%lld tokens, Per-position acceptance rate: ",
                drafts > 0 ? 1.0 + double(accepted) / double(drafts) : 0.0, accepted * per_s,
                drafted * per_s, static_cast<long long>(accepted), static_cast<long long>(drafted));
  std::string line = head;
  for (size_t p = 0; p < accepted_per_pos.size(); ++p) {
    const int64_t before = p < since.accepted_per_pos.size() ? since.accepted_per_pos[p] : 0;
    char rate[32];
    std::snprintf(rate, sizeof(rate), "%s%.3f", p ? ", " : "",
                  drafts > 0 ? double(accepted_per_pos[p] - before) / double(drafts) : 0.0);
    line += rate;
  }
  char tail[64];
  std::snprintf(tail, sizeof(tail), ", Avg Draft acceptance rate: %.1f%%",
                drafted > 0 ? 100.0 * double(accepted) / double(drafted) : 0.0);
  return line + tail;
}

}  // namespace engine
