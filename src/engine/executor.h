// Executor: how the engine runs its steps, wherever the workers are (vLLM's Executor). The
// engine submits SchedulerOutputs and takes their ModelRunnerOutputs back oldest first; up to
// max_concurrent_batches() steps may be in flight (a pipeline's depth). Every executor samples
// on the worker side. A failed executor stays failed: every later call returns the error.
// Called by the one engine thread; stage_busy_seconds() and failure() are thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "sched/scheduler_output.h"

namespace engine {

struct StepMeta {
  int64_t step_id = 0;
  double predicted_ms = 0;  // CPP's predicted time of the step's prefill chunks (0: none)
};

class Executor {
 public:
  virtual ~Executor() = default;

  // 1 runs each step to completion; a pipeline of S stages keeps up to S in flight.
  virtual int max_concurrent_batches() const = 0;
  virtual size_t num_in_flight() const = 0;

  virtual common::Status submit(const sched::SchedulerOutput& output, const StepMeta& meta) = 0;
  // The output of the oldest submitted step.
  virtual common::Result<sched::ModelRunnerOutput> take_oldest() = 0;

  // Data-parallel lock step: a one-token forward whose output is dropped, so that this rank
  // joins the collectives of ranks that have work. Only executors that support it override it.
  virtual common::Status execute_dummy_batch() {
    return common::unimplemented("this executor cannot run dummy batches");
  }

  // CPP profiling: milliseconds of a prefill chunk of num_tokens dummy tokens after `history`
  // cached ones (0: from scratch) in the given attention form, timed on the last stage, or on
  // the slowest one when `slowest_stage`. Only while nothing is in flight.
  virtual common::Result<double> profile_ms(int64_t num_tokens, int64_t history,
                                            sched::AttentionForm form, bool slowest_stage) = 0;

  // Empty while healthy; otherwise why the executor failed (a stage died, a link broke).
  virtual std::string failure() const = 0;
  // True when a worker can fail while the engine is idle (the engine then polls failure()).
  virtual bool has_remote_workers() const = 0;

  // Seconds each stage has computed since start (one entry per stage; empty when not tracked).
  virtual std::vector<double> stage_busy_seconds() const { return {}; }
  // Chrome trace of every (step, stage), for executors that record one.
  virtual void enable_trace() {}
  virtual common::Status write_trace(const std::string& /*path*/) const { return {}; }
};

}  // namespace engine
