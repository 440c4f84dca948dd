// One process: run the step now, keep the output for take_oldest().
#include "engine/uniproc_executor.h"

#include "common/check.h"
#include "common/timer.h"

namespace engine {

common::Status UniProcExecutor::submit(const sched::SchedulerOutput& output,
                                       const StepMeta& /*meta*/) {
  if (!failure_.empty()) return common::Status(common::StatusCode::kInternal, failure_);
  const double t0 = common::now_seconds();
  auto result = runner_.execute_model(output);
  if (!result.ok()) {
    failure_ = result.status().message();
    return result.status();
  }
  sched::ModelRunnerOutput out;
  out.sampled = std::move(result->sampled);
  out.draft_token_ids = std::move(result->draft_token_ids);
  out.prompt_logprobs = std::move(result->prompt_logprobs);
  out.kv_transfers = std::move(result->transfers);
  out.rejected = std::move(result->rejected);
  out.last_stage_ms = out.max_stage_ms = (common::now_seconds() - t0) * 1000.0;
  done_.push_back(std::move(out));
  return {};
}

common::Result<sched::ModelRunnerOutput> UniProcExecutor::take_oldest() {
  CHECK(!done_.empty()) << "take_oldest with nothing in flight";
  auto out = std::move(done_.front());
  done_.pop_front();
  return out;
}

common::Status UniProcExecutor::execute_dummy_batch() {
  if (!failure_.empty()) return common::Status(common::StatusCode::kInternal, failure_);
  CHECK(done_.empty()) << "a dummy batch while a step is in flight";
  if (auto st = runner_.execute_dummy_batch(); !st.ok()) {
    failure_ = st.message();
    return st;
  }
  return {};
}

common::Result<double> UniProcExecutor::profile_ms(int64_t num_tokens, int64_t history,
                                                   sched::AttentionForm form,
                                                   bool /*slowest_stage*/) {
  CHECK(done_.empty()) << "profiling while a step is in flight";
  return runner_.profile_ms(num_tokens, history, form);
}

}  // namespace engine
