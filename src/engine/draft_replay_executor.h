// DraftReplayExecutor: benchmarks and tests only (serve never builds one). It wraps another
// executor and replaces the drafts its workers proposed with tokens of a reference greedy run,
// each kept right with probability alpha and otherwise made wrong, so that the verification
// path can be timed and tested at a chosen acceptance rate on random weights. The workers still
// run their drafter (its cost stays in the step). Engine-thread only, like any executor.
#pragma once

#include <deque>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/executor.h"

namespace engine {

class DraftReplayExecutor : public Executor {
 public:
  // `reference`: each request id's greedy output tokens without speculation.
  DraftReplayExecutor(std::unique_ptr<Executor> inner,
                      std::unordered_map<std::string, std::vector<int32_t>> reference, double alpha,
                      uint64_t seed);

  int max_concurrent_batches() const override { return inner_->max_concurrent_batches(); }
  size_t num_in_flight() const override { return inner_->num_in_flight(); }
  common::Status submit(const sched::SchedulerOutput& output, const StepMeta& meta) override;
  common::Result<sched::ModelRunnerOutput> take_oldest() override;
  common::Result<double> profile_ms(int64_t num_tokens, int64_t history, sched::AttentionForm form,
                                    bool slowest_stage) override {
    return inner_->profile_ms(num_tokens, history, form, slowest_stage);
  }
  std::string failure() const override { return inner_->failure(); }
  bool has_remote_workers() const override { return inner_->has_remote_workers(); }
  std::vector<double> stage_busy_seconds() const override { return inner_->stage_busy_seconds(); }

 private:
  struct Entry {
    std::string req_id;
    int64_t num_outputs_before = 0;  // the request's output tokens before this step
  };
  std::unique_ptr<Executor> inner_;
  std::unordered_map<std::string, std::vector<int32_t>> reference_;
  std::unordered_map<std::string, int64_t> prompt_lengths_;
  std::deque<std::vector<Entry>> in_flight_;
  double alpha_;
  std::mt19937_64 rng_;
};

}  // namespace engine
