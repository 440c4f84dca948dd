// PipelineExecutor: the engine's side of pipeline parallelism. Stages are processes of this
// binary (worker/stage_worker.h), each owning a slice of the decoder layers, its KV cache and
// a pinned thread pool; they are joined in a ring of links (shared memory on one host, TCP
// between hosts; worker/stage_launcher.h). Steps enter stage 0 in submission order and every
// stage processes them FIFO, so a later chunk of a prompt runs on stage 0 while an earlier one
// is on stage 1. The last stage samples (worker/sampler.h) and returns the tokens. A stage that
// dies or a link that breaks fails the executor: every later call returns the error. submit /
// wait_oldest / profile_stage_ms are called by one engine thread.
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
#include "model/config.h"
#include "worker/stage_launcher.h"
#include "worker/stage_protocol.h"
#include "worker/step_input.h"

namespace worker {

// Layer ranges [begin, end) per stage: explicit counts, or near-equal with the remainder given
// to the first stages. Errors name the problem (counts that do not add up, empty stages).
common::Result<std::vector<std::pair<int, int>>> partition_layers(int num_layers, int num_stages,
                                                                  const std::vector<int>& counts);

struct PipelineOptions {
  std::string model_dir;
  int num_stages = 2;
  std::vector<int> layer_counts;  // empty: even split
  int threads_per_stage = 1;
  int64_t num_blocks = 0;
  int block_size = 16;
  bool pin_stages = false;  // stage s on cores [s·t, (s+1)·t) of its host
  bool expanded_kv_cache = false;
  PipelineTopology topology;       // num_stages is copied from above
  std::string worker_binary;       // empty: this binary
  double startup_timeout_s = 900;  // all stages (also remote ones) must be up by then
};

// Stage s's StageSpec under `options` (shared by the engine node and --headless nodes).
common::Result<std::vector<StageSpec>> stage_specs(const PipelineOptions& options,
                                                   const model::ModelConfig& config);

class PipelineExecutor {
 public:
  static common::Result<std::unique_ptr<PipelineExecutor>> create(const PipelineOptions& options);
  ~PipelineExecutor();

  const model::ModelConfig& config() const { return config_; }
  const std::vector<std::pair<int, int>>& layer_ranges() const { return ranges_; }
  int num_stages() const { return static_cast<int>(ranges_.size()); }

  common::Status submit(StepInput input);
  struct StepOutput {
    std::vector<std::optional<SampledToken>> tokens;  // entry i: the i-th sequence's token
    double last_stage_ms = 0;                         // the last stage's own time for this step
    double max_stage_ms = 0;                          // the slowest stage's time for this step
  };
  // Output of the oldest submitted step.
  common::Result<StepOutput> wait_oldest();
  size_t in_flight() const { return in_flight_; }
  // Records one Chrome trace event per (step, stage) from now on; see write_trace.
  void enable_trace() { tracing_ = true; }
  // Writes the recorded events as Chrome trace-event JSON (opens in Perfetto / chrome://tracing):
  // one track per stage; each event carries tokens, history, predicted and measured ms.
  common::Status write_trace(const std::string& path) const;

  // Seconds each stage has spent computing since start (thread-safe).
  std::vector<double> stage_busy_seconds() const;

  // CPP profiling: milliseconds of `stage`'s own layers on a from-scratch prefill of
  // num_tokens dummy tokens (zero input for non-first stages, as upstream times each stage
  // independently). Call only while nothing is in flight.
  common::Result<double> profile_stage_ms(int stage, int64_t num_tokens);

  // Empty while healthy; otherwise why the pipeline failed.
  std::string failure() const;

 private:
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
  model::ModelConfig config_;
  std::vector<std::pair<int, int>> ranges_;
  LocalStages local_;
  std::thread receiver_, monitor_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<dist::Message> inbox_;  // from the last stage, oldest first
  std::string failure_;
  std::vector<bool> reaped_;  // per local pid
  std::vector<double> busy_seconds_;
  std::vector<TraceEvent> trace_;
  std::atomic<bool> tracing_{false};
  size_t in_flight_ = 0;
};

}  // namespace worker
