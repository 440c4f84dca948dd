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
#include "sched/request.h"

namespace sched {

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;
  int32_t max_num_seqs = 256;
  int64_t max_model_len = 4096;
};

// One request's share of a step. The worker reads tokens [num_computed_tokens,
// num_computed_tokens + num_scheduled_tokens) of the request with its block table.
struct ScheduledRequest {
  Request* request;
  int64_t num_computed_tokens;
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

  void add_request(std::unique_ptr<Request> request);
  // Removes a request wherever it is and frees its blocks; returns it (nullptr if unknown).
  std::unique_ptr<Request> abort_request(const std::string& request_id);

  SchedulerOutput schedule();
  // Applies a step's results: advances num_computed_tokens, appends `sampled` tokens (one per
  // scheduled request whose `samples` is true, in order; -1 for none) and caches full blocks.
  // Finished requests (decided by the caller through finish_request) leave the running set.
  void update(const SchedulerOutput& output, const std::vector<int32_t>& sampled);
  // Marks a running request finished and frees its blocks; returns it.
  std::unique_ptr<Request> finish_request(const std::string& request_id, FinishReason reason);

  bool has_unfinished_requests() const { return !waiting_.empty() || !running_.empty(); }
  SchedulerStats stats() const;
  const kv::KvCacheManager& kv_cache() const { return *kv_; }

 private:
  void preempt(Request* r);

  SchedulerConfig config_;
  kv::KvCacheManager* kv_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
  int64_t num_preemptions_ = 0;
};

}  // namespace sched
