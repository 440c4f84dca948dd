// UniProcExecutor: the whole model in the engine's process. Each submitted step runs at once
// on the calling (engine) thread; take_oldest() hands its output back. Not thread-safe.
#pragma once

#include <deque>
#include <memory>

#include "engine/engine_config.h"
#include "engine/executor.h"
#include "worker/model_runner.h"

namespace engine {

// The runner of an engine configured by `config`, over the whole model.
inline worker::RunnerOptions runner_options(const EngineConfig& config) {
  worker::RunnerOptions o;
  o.num_blocks = config.num_kv_blocks;
  o.block_size = config.block_size;
  o.num_threads = config.num_threads;
  o.expanded_kv_cache = config.expanded_kv_cache;
  o.kv_cache_dtype = config.bf16_kv_cache ? model::KvCacheDtype::kBf16 : model::KvCacheDtype::kF32;
  o.dummy_block = config.dp_group != nullptr;
  o.num_speculative_tokens = config.scheduler.num_lookahead_tokens;
  return o;
}

class UniProcExecutor : public Executor {
 public:
  // `model` must outlive the executor.
  UniProcExecutor(const model::DeepseekV3Model& model, const worker::RunnerOptions& options)
      : runner_(model, options) {}

  int max_concurrent_batches() const override { return 1; }
  size_t num_in_flight() const override { return done_.size(); }
  common::Status submit(const sched::SchedulerOutput& output, const StepMeta& meta) override;
  common::Result<sched::ModelRunnerOutput> take_oldest() override;
  common::Result<double> profile_ms(int64_t num_tokens, int64_t history, sched::AttentionForm form,
                                    bool slowest_stage) override;
  common::Status execute_dummy_batch() override;
  std::string failure() const override { return failure_; }
  bool has_remote_workers() const override { return false; }
  // Whether the runner's KV connector started (ports bound, memory registered).
  common::Status init_status() const { return runner_.init_status(); }

 private:
  worker::ModelRunner runner_;
  std::deque<common::Result<sched::ModelRunnerOutput>> done_;
  std::string failure_;
};

}  // namespace engine
