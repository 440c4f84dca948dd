// Engine metrics in vLLM's vocabulary (vllm:* names): gauges, counters and histograms with
// vLLM's buckets. Plain data; EngineCore guards it with its mutex and hands out snapshots.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "sched/scheduler_output.h"

namespace engine {

struct Histogram {
  std::vector<double> bounds;    // upper bounds, ascending; +Inf implied
  std::vector<uint64_t> counts;  // per bucket (not cumulative), bounds.size() + 1 entries
  double sum = 0;
  uint64_t count = 0;

  Histogram() : counts(1, 0) {}
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v);
  // Adds o's observations. A histogram that has none takes o's bounds first; otherwise the
  // bounds must agree (false, nothing added, when they do not).
  bool merge(const Histogram& o);
};

// vLLM's buckets: TTFT; inter-token latency (also per-request TPOT); request phases (e2e,
// queue, prefill, decode, inference); and 1, 2, 5, 10, 20, 50, ... up to max_value, for token
// counts (vLLM's build_1_2_5_buckets).
std::vector<double> ttft_buckets();
std::vector<double> inter_token_latency_buckets();
std::vector<double> request_latency_buckets();
std::vector<double> one_two_five_buckets(int64_t max_value);

// Speculative decoding counters (vLLM's SpecDecodingStats): per request and step with drafts,
// one draft, its draft tokens, the accepted ones, and per draft position whether it was
// accepted (so the per-position counts never increase with the position).
struct SpecDecodingCounters {
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;  // num_speculative_tokens entries when enabled

  void observe(int64_t num_draft_tokens_of_step, int64_t num_accepted);
  SpecDecodingCounters& operator+=(const SpecDecodingCounters& o);
  // vLLM's periodic line ("SpecDecoding metrics: Mean acceptance length ...") for the counts
  // since `since`, over `seconds`.
  std::string log_line(const SpecDecodingCounters& since, double seconds) const;
};

struct Metrics {
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t external_prefix_cache_hits = 0;  // prompt tokens a KV connector loaded
  int64_t preemptions = 0;
  int64_t recomputed_requests = 0;  // finished by the recompute scheduler (PD decoder)
  int64_t dummy_batches = 0;  // DP lock step: forwards run only to join other ranks' collectives
  int64_t balance_paused_steps = 0;    // balance scheduling: steps that held waiting requests back
  sched::KvTransferStats kv_transfer;  // the KV connector's (pulls_in_flight: the latest)
  SpecDecodingCounters spec_decoding;  // empty accepted_per_pos: speculative decoding is off
  std::map<std::string, int64_t> request_success;  // finished_reason -> count
  Histogram ttft{ttft_buckets()};
  Histogram itl{inter_token_latency_buckets()};
  Histogram e2e{request_latency_buckets()};
  Histogram iteration_tokens{{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}};
  // Per finished request, as vLLM's FinishedRequestStats: arrival to first scheduled (queue),
  // first scheduled to first token (prefill), first to last token (decode), first scheduled
  // to last token (inference), and decode / (generated - 1) (mean time per output token).
  Histogram request_queue_time{request_latency_buckets()};
  Histogram request_prefill_time{request_latency_buckets()};
  Histogram request_decode_time{request_latency_buckets()};
  Histogram request_inference_time{request_latency_buckets()};
  Histogram request_time_per_output_token{inter_token_latency_buckets()};
  // Token counts per finished request; the engine sets their bounds from max_model_len.
  Histogram request_prompt_tokens, request_generation_tokens, request_params_max_tokens;

  // Every histogram above, in one fixed order (the wire's; a data-parallel sum's); `m` is a
  // Metrics or a const Metrics.
  template <typename M>
  static auto histograms(M& m) {
    return std::array{&m.ttft,
                      &m.itl,
                      &m.e2e,
                      &m.iteration_tokens,
                      &m.request_queue_time,
                      &m.request_prefill_time,
                      &m.request_decode_time,
                      &m.request_inference_time,
                      &m.request_time_per_output_token,
                      &m.request_prompt_tokens,
                      &m.request_generation_tokens,
                      &m.request_params_max_tokens};
  }
  // CPP: predicted vs measured time (last stage) of steps that carried prefill chunks.
  double cpp_predicted_ms_sum = 0;
  double cpp_measured_ms_sum = 0;
  int64_t cpp_steps = 0;
};

// vLLM's prefix-cache hit rate over recent requests (its CachingMetrics): per step, the
// lookups, prompt tokens looked up and tokens found; the oldest steps leave once the rest
// hold more than kMaxRecentRequests lookups (the newest step always stays).
class RecentPrefixCacheHits {
 public:
  static constexpr int64_t kMaxRecentRequests = 1000;
  void observe(int64_t requests, int64_t queries, int64_t hits);
  int64_t queries() const { return queries_; }
  int64_t hits() const { return hits_; }

 private:
  struct Step {
    int64_t requests, queries, hits;
  };
  std::deque<Step> steps_;
  int64_t requests_ = 0, queries_ = 0, hits_ = 0;
};

struct MetricsSnapshot {
  Metrics totals;
  // The prefix-cache lookups of about the last 1000 requests (RecentPrefixCacheHits): the
  // stats line's hit rate is hits / queries.
  int64_t recent_prefix_cache_queries = 0;
  int64_t recent_prefix_cache_hits = 0;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  double kv_cache_usage = 0;
  int64_t num_kv_blocks = 0;
  int block_size = 0;
  std::vector<double> stage_busy_seconds;  // pipeline stages (empty with one stage)
  // CPP: the fitted model and target (when a chunk predictor is configured and ready).
  bool cpp_ready = false;
  double cpp_a = 0, cpp_b = 0, cpp_c = 0, cpp_target_ms = 0;
};

// One engine's metrics, labelled by its data-parallel rank.
struct EngineMetrics {
  int engine_index = 0;
  MetricsSnapshot snapshot;
};

}  // namespace engine
