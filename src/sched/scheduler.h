// Scheduler: decides each step which requests run and how many of their tokens, within
// --max-num-batched-tokens and --max-num-seqs. No prefill/decode modes: chunked prefill is the
// normal case. Preempts (by recompute) the newest running request when KV blocks run out.
// Not thread-safe: one thread calls schedule() / update().
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/chunk_predictor.h"
#include "sched/request.h"

namespace sched {

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;
  int32_t max_num_seqs = 256;
  int64_t max_model_len = 4096;
  // CPP: charge a new request's first chunk with its prefix-cache hits as history (better
  // than vllm-ascend, which charges history 0). Off reproduces upstream.
  bool charge_prefix_hits = false;
};

// One request's share of a step. The worker reads tokens [num_computed_tokens,
// num_computed_tokens + num_scheduled_tokens) of the request with its block table.
struct ScheduledRequest {
  Request* request;
  int64_t num_computed_tokens;  // before this step (the request's counter is already advanced)
  int64_t num_scheduled_tokens;
  // True when this chunk reaches the request's last known token: its logits are sampled.
  bool samples;
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> scheduled;
  int64_t total_num_scheduled_tokens = 0;
  int32_t num_preempted = 0;
  bool empty() const { return scheduled.empty(); }
};

struct SchedulerStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int64_t num_preemptions = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, kv::KvCacheManager* kv_cache);

  // Dynamic chunk sizing for prefills (CPP). The predictor must outlive the scheduler; null
  // (the default) gives fixed chunks bounded by the token budget.
  void set_chunk_predictor(ChunkSizePredictor* predictor) { predictor_ = predictor; }

  void add_request(std::unique_ptr<Request> request);
  // Removes a request wherever it is and frees its blocks; returns it (nullptr if unknown).
  std::unique_ptr<Request> abort_request(const std::string& request_id);

  SchedulerOutput schedule();
  // Applies a step's results: appends `sampled` tokens (one per scheduled request whose
  // `samples` is true, in order; -1 for none) and caches full blocks. num_computed_tokens was
  // advanced at schedule time, so the next chunk of a prompt can be scheduled while this one is
  // still in flight (pipeline parallelism).
  // Finished requests (decided by the caller through finish_request) leave the running set.
  void update(const SchedulerOutput& output, const std::vector<int32_t>& sampled);
  // Marks a running request finished and frees its blocks; returns it.
  std::unique_ptr<Request> finish_request(const std::string& request_id, FinishReason reason);

  bool has_unfinished_requests() const { return !waiting_.empty() || !running_.empty(); }
  SchedulerStats stats() const;
  const kv::KvCacheManager& kv_cache() const { return *kv_; }

 private:
  void preempt(Request* r);
  // CPP: the chunk for a prefill of `r` given the remaining time budget; nullopt = stop
  // scheduling prefills this step. `n` is the upstream (fixed) size.
  std::optional<int64_t> dynamic_chunk(const Request& r, int64_t history, int64_t n,
                                       double time_budget, double target) const;
  ChunkSizePredictor* predictor_ = nullptr;

  SchedulerConfig config_;
  kv::KvCacheManager* kv_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
  int64_t num_preemptions_ = 0;
};

}  // namespace sched
