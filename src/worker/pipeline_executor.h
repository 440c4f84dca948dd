// PipelineExecutor: pipeline-parallel execution of scheduler steps over N stages, each owning a
// slice of the decoder layers, its own KV cache for those layers, and its own thread pool.
// Steps enter stage 0 in submission order and every stage processes them FIFO (lockstep), so a
// later chunk of a prompt can run on stage 0 while an earlier one is on stage 1. The last
// stage computes logits for sampling rows. Stages are threads of this process; the stage loop
// only sees StepInput and hidden-state buffers, so a process or host boundary can replace the
// queues without touching the engine.
// submit / wait_oldest are called by one engine thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kv/kv_cache_manager.h"
#include "model/deepseek_v3.h"
#include "sched/scheduler.h"
#include "worker/step_input.h"

namespace worker {

// Layer ranges [begin, end) per stage: explicit counts, or near-equal with the remainder given
// to the first stages. Errors name the problem (counts that do not add up, empty stages).
common::Result<std::vector<std::pair<int, int>>> partition_layers(int num_layers, int num_stages,
                                                                  const std::vector<int>& counts);

class PipelineExecutor {
 public:
  static common::Result<std::unique_ptr<PipelineExecutor>> create(
      const std::string& model_dir, int num_stages, const std::vector<int>& layer_counts,
      int threads_per_stage, int64_t num_blocks, int block_size, bool pin_stages = false,
      bool expanded_kv_cache = false);
  ~PipelineExecutor();

  const model::ModelConfig& config() const { return stages_.front()->model->config(); }
  const std::vector<std::pair<int, int>>& layer_ranges() const { return ranges_; }
  int num_stages() const { return static_cast<int>(stages_.size()); }

  void submit(StepInput input);
  struct StepOutput {
    std::vector<std::vector<float>> logits;  // entry i for the i-th sequence if it samples
    double last_stage_ms = 0;                // the last stage's own time for this step
    double max_stage_ms = 0;                 // the slowest stage's time for this step
  };
  // Output of the oldest submitted step.
  StepOutput wait_oldest();
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
  double profile_stage_ms(int stage, int64_t num_tokens);

 private:
  struct Job {
    std::shared_ptr<StepInput> input;
    std::vector<float> hidden;
    std::vector<std::vector<float>> logits;
    double last_stage_ms = 0;
    double max_stage_ms = 0;
  };
  struct Stage {
    int index = 0;
    std::unique_ptr<model::DeepseekV3Model> model;
    std::unique_ptr<model::LatentKvCache> cache;
    std::unique_ptr<common::ThreadPool> pool;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> queue;
    std::thread thread;
    std::vector<int> cpus;  // pinning of this stage's threads (empty: not pinned)
    std::atomic<double> busy_seconds{0.0};
  };
  PipelineExecutor() = default;
  void stage_loop(Stage& s);
  void run_stage(Stage& s, Job& job);

  struct TraceEvent {
    int stage;
    int64_t step_id;
    double start_s, duration_s, predicted_ms;
    int64_t tokens, history, sequences;
  };
  std::vector<std::unique_ptr<Stage>> stages_;
  std::atomic<bool> tracing_{false};
  mutable std::mutex trace_mu_;
  std::vector<TraceEvent> trace_;
  double trace_origin_s_ = 0;
  std::vector<std::pair<int, int>> ranges_;
  std::mutex out_mu_;
  std::condition_variable out_cv_;
  std::deque<Job> outputs_;
  size_t in_flight_ = 0;
  std::atomic<bool> stopping_{false};
};

}  // namespace worker
