// PipelineExecutor: the engine's side of pipeline parallelism. Stages are processes of this
// binary (worker/stage_worker.h), each a ModelRunner over a slice of the decoder layers with
// its KV cache, request states and a pinned thread pool; they are joined in a ring of links
// (shared memory on one host, TCP between hosts; worker/stage_launcher.h). Steps enter stage 0
// in submission order and every stage processes them FIFO, so a later chunk of a prompt runs on
// stage 0 while an earlier one is on stage 1. The last stage samples and returns the tokens. A
// stage that dies or a link that breaks fails the executor (executor.h).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "engine/executor.h"
#include "engine/kv_output_aggregator.h"
#include "worker/stage_launcher.h"
#include "worker/stage_plan.h"
#include "worker/stage_protocol.h"

namespace engine {

using worker::PipelineOptions;

class PipelineExecutor : public Executor {
 public:
  static common::Result<std::unique_ptr<PipelineExecutor>> create(const PipelineOptions& options);
  ~PipelineExecutor() override;

  const std::vector<std::pair<int, int>>& layer_ranges() const { return ranges_; }
  int num_stages() const { return static_cast<int>(ranges_.size()); }

  int max_concurrent_batches() const override { return num_stages(); }
  size_t num_in_flight() const override { return in_flight_.size(); }
  common::Status submit(const sched::SchedulerOutput& output, const StepMeta& meta) override;
  common::Result<sched::ModelRunnerOutput> take_oldest() override;
  // Data-parallel lock step (experts over DP x TP): every rank of every stage runs a one-token
  // forward into its scratch block, and the message comes back round the ring. Only with
  // nothing in flight, on stages whose experts span DP ranks (they keep that scratch block).
  common::Status execute_dummy_batch() override;
  // Upstream times the last stage's own layers (zero input for non-first stages, as each stage
  // is timed independently); `slowest_stage` probes every stage and keeps the slowest.
  common::Result<double> profile_ms(int64_t num_tokens, int64_t history, sched::AttentionForm form,
                                    bool slowest_stage) override;
  std::string failure() const override;
  bool has_remote_workers() const override { return true; }
  std::vector<double> stage_busy_seconds() const override;
  // Records one Chrome trace event per (step, stage) from now on; see write_trace.
  void enable_trace() override { tracing_ = true; }
  // Writes the recorded events as Chrome trace-event JSON (opens in Perfetto / chrome://tracing):
  // one track per stage; each event carries tokens, history, predicted and measured ms.
  common::Status write_trace(const std::string& path) const override;

  // Milliseconds of `stage`'s own layers on a from-scratch prefill of num_tokens dummy tokens.
  common::Result<double> profile_stage_ms(int stage, int64_t num_tokens, int64_t history,
                                          sched::AttentionForm form);

  // Bytes of the step messages sent to stage 0 so far (the SchedulerOutputs on the wire).
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  // What the engine side remembers of a step in flight (the last stage does not echo it).
  struct InFlight {
    StepMeta meta;
    std::vector<bool> samples;
    std::vector<std::string> req_ids;
    std::vector<size_t> num_spec;  // drafts each entry verifies
    int64_t tokens = 0, history = 0;
  };
  PipelineExecutor() = default;
  // Next message from the last stage, or the failure.
  common::Result<dist::Message> next_message();
  void fail(const std::string& why);
  void receive_loop();
  void monitor_loop();

  struct TraceEvent {
    int stage;
    int64_t step_id;
    double start_s, duration_s, predicted_ms;
    int64_t tokens, history, sequences;
  };
  std::vector<std::pair<int, int>> ranges_;
  worker::LocalStages local_;
  std::unique_ptr<worker::StageMonitor> stage_monitor_;  // watches local_'s processes
  std::thread receiver_, monitor_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<dist::Message> inbox_;  // from the last stage, oldest first
  std::string failure_;
  std::vector<double> busy_seconds_;
  std::vector<TraceEvent> trace_;
  std::atomic<bool> tracing_{false};
  std::deque<InFlight> in_flight_;       // engine thread only
  KvOutputAggregator kv_aggregator_{1};  // engine thread only
  int64_t bytes_sent_ = 0;
};

}  // namespace engine
