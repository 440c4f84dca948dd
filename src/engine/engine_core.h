// EngineCore: the step loop (schedule -> execute -> update) on its own thread, plus output
// processing (detokenization, stop conditions, timings, metrics). add_request / abort_request
// / stats are thread-safe; outputs are delivered through each request's callback on the
// engine thread, in order, ending with one whose `finished` is true.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "engine/engine_client.h"
#include "engine/engine_config.h"
#include "engine/executor.h"
#include "engine/metrics.h"
#include "kv/kv_cache_manager.h"
#include "sched/chunk_predictor.h"
#include "sched/scheduler.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace engine {

using sched::SampledToken;

// The in-process engine: EngineClient's implementation for one engine in this process.
class EngineCore : public EngineClient {
 public:
  // The executor runs the steps (one process, or a pipeline with up to its depth of steps in
  // flight: vLLM's batch queue, outputs consumed oldest first).
  EngineCore(std::unique_ptr<Executor> executor, const tokenizer::Tokenizer& tokenizer,
             const EngineConfig& config);
  ~EngineCore() override;
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  void add_request(EngineRequest request, OutputCallback callback) override;
  void abort_request(const std::string& request_id) override;
  // Stops accepting work, aborts everything in flight (their callbacks get finished=abort)
  // and joins the engine thread. Idempotent.
  void shutdown();

  MetricsSnapshot metrics() const override;
  std::vector<EngineMetrics> engine_metrics() const override {
    return {{config_.engine_index, metrics()}};
  }
  // The CPP predictor (null without profiling_chunk); read it only while the engine is idle.
  const sched::ChunkSizePredictor* chunk_predictor() const { return predictor_.get(); }
  const EngineConfig& config() const { return config_; }
  void release_kv_transfer(const std::string& kv_transfer_params) override {
    if (config_.kv_connector) config_.kv_connector->release_unscheduled(kv_transfer_params);
  }
  bool is_healthy() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return !dead_;
  }

 private:
  struct Tracked {
    OutputCallback callback;
    std::unique_ptr<tokenizer::IncrementalDetokenizer> detokenizer;
    std::string text;  // decoded so far (stop strings are searched here)
    size_t sent = 0;   // bytes of `text` already delivered
    int64_t num_prompt_tokens = 0;
    int64_t num_cached_tokens = 0;
    double arrival = 0, first_scheduled = 0, first_token = 0, last_token = 0;
    int32_t max_tokens = 0;  // the request's max_tokens (vLLM's request_params_max_tokens)
    // With prompt_logprobs: entry p scores prompt token p + 1 (NaN until computed); moved into
    // the first output.
    std::vector<SampledToken> prompt_logprobs;
  };
  struct InFlight {
    sched::SchedulerOutput output;
    double predicted_ms = 0;
  };

  void start();
  void loop();
  void run_profiling_chunk_init();
  // CPP planned mode: probes chunks at zero and non-zero history in both attention forms and
  // fits the cost model.
  struct ProfileShape {
    int64_t tokens = 0, history = 0;
    sched::AttentionForm form = sched::AttentionForm::kExpanded;
    bool operator==(const ProfileShape&) const = default;
  };
  std::vector<ProfileShape> planned_profile_shapes() const;
  void run_planned_profiling();
  // Schedules one step and books its metrics; empty when nothing fits.
  sched::SchedulerOutput schedule_step(bool allow_poll, bool admit_waiting = true);
  // Reports the requests the recompute scheduler finished (stop_reason "recomputed").
  void finish_recomputed();
  // Requests whose remote KV failed to load, under kv_load_failure_policy "fail".
  void finish_load_failures();
  // The step loop: fill the executor up to its depth, then complete the oldest step.
  void step();
  // The step loop of a data-parallel rank in lock step (config.dp_group): one step at a time;
  // the ranks agree on (max tokens, any unfinished) first, and a rank with nothing to compute
  // runs a dummy batch while another computes.
  void step_lockstep();
  // Updates the scheduler and delivers outputs for an executed step.
  void complete_step(const sched::SchedulerOutput& so, const sched::ModelRunnerOutput& out);
  double timing_ms(const sched::ModelRunnerOutput& out) const;
  // vLLM's "SpecDecoding metrics: ..." line, every kSpecDecodingLogSeconds with drafts.
  void log_spec_decoding(double now);
  static constexpr double kSpecDecodingLogSeconds = 10.0;
  // The executor failed: finish every request with `why`, stop accepting work, report.
  void fail_engine(const std::string& why);
  void finish(const std::string& id, sched::FinishReason reason, RequestOutput* out);
  // Finishes a request the engine will not take (its own data is wrong) with a 400, alone.
  void refuse(const std::string& request_id, const std::string& why,
              const OutputCallback& callback) const;
  // Fails alone each request the workers refused for its own data (ModelRunnerOutput::rejected).
  void finish_rejected(const std::vector<sched::RejectedRequest>& rejected);
  // A finished request's histograms (e2e, its phases, token counts). Called with mu_ held.
  void observe_finished(const Tracked& t, int64_t num_generated);
  // Files a step's prompt logprobs (ModelRunnerOutput::prompt_logprobs) by position.
  void collect_prompt_logprobs(const sched::SchedulerOutput& so,
                               const sched::ModelRunnerOutput& out);
  // Applies one sampled token, the request's n_out-th output: text, stop checks. Returns true
  // when the request finished.
  bool process_token(const sched::Request& r, Tracked& t, const SampledToken& s, int64_t n_out,
                     RequestOutput* out);

  const tokenizer::Tokenizer& tokenizer_;
  EngineConfig config_;
  std::unique_ptr<Executor> executor_;
  kv::KvCacheManager kv_;
  sched::Scheduler scheduler_;
  std::deque<InFlight> in_flight_;  // submitted steps, oldest first
  int64_t next_step_id_ = 0;
  std::unique_ptr<sched::ChunkSizePredictor> predictor_;
  std::vector<int32_t> eos_ids_;
  std::unordered_map<std::string, Tracked> tracked_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::unique_ptr<sched::Request>, OutputCallback>> inbox_;
  std::vector<std::string> aborts_;
  bool stopping_ = false;
  bool dead_ = false;
  std::string fatal_error_;                         // why the engine died (guarded by mu_)
  Metrics metrics_;                                 // guarded by mu_
  RecentPrefixCacheHits recent_prefix_cache_hits_;  // guarded by mu_
  int64_t prefix_cache_requests_ = 0;               // lookups seen so far; guarded by mu_
  SpecDecodingCounters spec_logged_;  // the counters at the last log line (engine thread)
  double spec_logged_at_ = 0;
  std::thread thread_;
};

}  // namespace engine
