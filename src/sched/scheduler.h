// Scheduler: decides each step which requests run and how many of their tokens, within
// --max-num-batched-tokens and --max-num-seqs. No prefill/decode modes: chunked prefill is the
// normal case. Preempts (by recompute) the newest running request when KV blocks run out, or
// under the priority policy the one served last (largest priority, then latest arrival).
// Not thread-safe: one thread calls schedule() / update().
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/chunk_predictor.h"
#include "sched/kv_connector.h"
#include "sched/request.h"
#include "sched/scheduler_output.h"

namespace sched {

// vLLM's --scheduling-policy. Priority: waiting and running requests are served in the order of
// (priority, arrival), the smaller first, and preemption takes the last in that order.
enum class SchedulingPolicy { kFcfs, kPriority };

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;
  int32_t max_num_seqs = 256;
  int64_t max_model_len = 4096;
  // CPP: charge a new request's first chunk with its prefix-cache hits as history (better
  // than vllm-ascend, which charges history 0). Off reproduces upstream.
  bool charge_prefix_hits = false;
  // vllm-ascend's recompute scheduler (a PD decoder): when a running request's slots do not
  // fit, the newest running request is finished with stop_reason "recomputed" (the proxy
  // re-prefills it elsewhere) instead of being preempted and re-prefilled here, and no waiting
  // request is admitted in that step. A request that is not Request::recomputable (one of
  // several choices) is preempted as usual.
  bool recompute_scheduler_enable = false;
  // kv_load_failure_policy "recompute": a request whose remote KV failed to load computes its
  // prompt here; false ("fail", vLLM's default) finishes it with an error.
  bool recompute_kv_load_failures = false;
  // Speculative decoding: k, the drafts a request may carry into a step. A sampling chunk
  // reserves k lookahead slots beyond its tokens (the drafter writes there); 0: off.
  int32_t num_lookahead_tokens = 0;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // vLLM's --long-prefill-token-threshold: a request computes at most this many tokens a step
  // (0: no cap beyond the step's budget).
  int64_t long_prefill_token_threshold = 0;
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
  // A KV connector (sched/kv_connector.h) that must outlive the scheduler; null: none.
  void set_kv_connector(KvConnectorScheduler* connector) { connector_ = connector; }

  void add_request(std::unique_ptr<Request> request);
  // Removes a request wherever it is and frees its blocks; returns it (nullptr if unknown).
  std::unique_ptr<Request> abort_request(const std::string& request_id);

  // The next step. Each request's entry carries only what the workers do not hold yet; the
  // ids of requests finished since the last step ride along for the workers to drop.
  // allow_poll: with nothing to run but KV transfers pending, return a kv_connector_poll step.
  // admit_waiting false: only running requests are scheduled (balance scheduling's gate).
  SchedulerOutput schedule(bool allow_poll = true, bool admit_waiting = true);
  // Applies a step's results, in the order the steps were scheduled: appends each scheduled
  // request's `sampled` tokens (entry i: none, or 1 .. spec_token_ids.size() + 1 with
  // speculative decoding), rolls num_computed_tokens back over its rejected drafts, keeps
  // `draft_token_ids[i]` (may be empty) as its next step's drafts, and caches the full blocks
  // of verified tokens. num_computed_tokens was advanced at schedule time, so the next chunk of
  // a prompt can be scheduled while this one is still in flight (pipeline parallelism). Entry
  // i of the result counts the tokens appended for scheduled[i]: none for a request that
  // finished, was aborted or was preempted while the step was in flight.
  std::vector<int32_t> update(const SchedulerOutput& output,
                              const std::vector<std::vector<int32_t>>& sampled,
                              const std::vector<std::vector<int32_t>>& draft_token_ids);
  // The same without speculative decoding: one token (or -1 for none) per scheduled request;
  // entry i of the result is true when it was appended.
  std::vector<bool> update(const SchedulerOutput& output, const std::vector<int32_t>& sampled);
  // Drops a request's output tokens after the first `num_output_tokens` (tokens of a step
  // that came after its stop condition). The request must be finished next.
  void truncate_output(const std::string& request_id, size_t num_output_tokens);
  // The KV connector's completed transfers: blocks held for sending are freed; requests whose
  // KV arrived go back to waiting with it counted as computed.
  // A failed load recomputes or fails the request (SchedulerConfig::recompute_kv_load_failures).
  void update_kv_transfers(const KvTransferReport& report);
  // Marks a running request finished and frees its blocks; returns it.
  std::unique_ptr<Request> finish_request(const std::string& request_id, FinishReason reason);

  // The request (nullptr when it is not waiting or running).
  Request* find_request(const std::string& request_id) const;
  // Requests the recompute scheduler finished since the last call (finish_reason stop), for
  // the engine to report with stop_reason "recomputed".
  std::vector<std::unique_ptr<Request>> take_recomputed() { return std::move(recomputed_); }
  // Requests whose remote KV failed to load and that the policy fails, with why (finish_reason
  // abort), for the engine to report as errors.
  std::vector<std::pair<std::unique_ptr<Request>, std::string>> take_load_failures() {
    return std::move(load_failures_);
  }
  bool has_unfinished_requests() const {
    return !waiting_.empty() || !running_.empty() || !waiting_for_remote_kvs_.empty();
  }
  // Unfinished requests, or finished ones whose blocks a KV connector still holds: the engine
  // keeps stepping (steps with kv_connector_poll when nothing can run) until both are gone.
  bool has_requests() const { return has_unfinished_requests() || !delayed_free_.empty(); }
  // Requests whose KV is being loaded (their first token waits on it).
  bool has_pending_loads() const { return !waiting_for_remote_kvs_.empty(); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  SchedulerStats stats() const;
  const kv::KvCacheManager& kv_cache() const { return *kv_; }

 private:
  void preempt(Request* r);
  // Under the priority policy, whether `a` is served before `b`: the smaller priority, then the
  // earlier arrival (vLLM's Request ordering).
  static bool served_before(const Request* a, const Request* b) {
    return a->priority != b->priority ? a->priority < b->priority
                                      : a->arrival_order < b->arrival_order;
  }
  // Puts `r` in the waiting queue. Requests that hold their blocks (loads that are in) stay
  // ahead of those that do not: they start without a new block, and behind a request that
  // needs more blocks than are free they could wait forever for the blocks they hold.
  // FCFS: `r` goes first among its kind (as_new: last, for a new request); priority: in order.
  void enqueue_waiting(Request* r, bool as_new);
  // Admits `r` to the running list: last (FCFS, oldest first) or in priority order.
  void add_running(Request* r);
  // The recompute scheduler's alternative to preempt(): r leaves with finish_reason stop.
  void recompute(Request* r);
  // Slots to allocate for `r` when its tokens up to `end` are scheduled (lookahead included).
  int64_t slots_for(const Request& r, int64_t end) const;
  // The entry for `r` after its slots for n more tokens are allocated; books what was sent.
  ScheduledRequest make_entry(Request* r, int64_t n);
  // A request leaves: the connector gets it (and may keep its blocks), the workers drop their
  // state of it with the next step.
  void release(Request* r);
  // CPP: the chunk for a prefill of `r` given the step's remaining time budget; nullopt = stop
  // scheduling prefills this step. `n` is the upstream (fixed) size. In planned mode the
  // step's first prefill sets the step's budget to its plan's chunk time.
  std::optional<int64_t> dynamic_chunk(Request& r, int64_t history, int64_t n, double* time_budget,
                                       double target) const;
  ChunkSizePredictor* predictor_ = nullptr;
  KvConnectorScheduler* connector_ = nullptr;

  SchedulerConfig config_;
  kv::KvCacheManager* kv_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  // Those that hold blocks (their loads are in) come first: they start without a new block.
  std::deque<Request*> waiting_;
  // FCFS: in admission order; priority: in served_before order. Either way the last one is
  // preempted first.
  std::vector<Request*> running_;
  int64_t num_preemptions_ = 0;
  uint64_t num_added_ = 0;                     // arrival_order of the next request
  std::vector<std::string> finished_req_ids_;  // for the next step's SchedulerOutput
  std::deque<Request*> waiting_for_remote_kvs_;
  std::vector<std::unique_ptr<Request>> recomputed_;
  std::vector<std::pair<std::unique_ptr<Request>, std::string>> load_failures_;
  std::unordered_set<std::string> delayed_free_;  // blocks the connector is still sending
  // Per step not yet updated, oldest first: each entry's preemption count when it was scheduled,
  // so that a result computed before a preemption is not applied after the request resumed.
  std::deque<std::vector<int32_t>> in_flight_epochs_;
};

}  // namespace sched
