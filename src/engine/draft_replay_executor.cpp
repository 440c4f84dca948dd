// Replaying reference drafts at a chosen acceptance rate.
#include "engine/draft_replay_executor.h"

namespace engine {

DraftReplayExecutor::DraftReplayExecutor(
    std::unique_ptr<Executor> inner,
    std::unordered_map<std::string, std::vector<int32_t>> reference, double alpha, uint64_t seed)
    : inner_(std::move(inner)), reference_(std::move(reference)), alpha_(alpha), rng_(seed) {}

common::Status DraftReplayExecutor::submit(const sched::SchedulerOutput& output,
                                           const StepMeta& meta) {
  std::vector<Entry> entries;
  for (const sched::ScheduledRequest& s : output.scheduled) {
    if (s.new_request)
      prompt_lengths_[s.req_id] = static_cast<int64_t>(s.new_request->prompt_token_ids.size());
    const int64_t known = s.num_computed_tokens + s.num_scheduled_tokens -
                          static_cast<int64_t>(s.spec_token_ids.size());
    entries.push_back({s.req_id, known - prompt_lengths_[s.req_id]});
  }
  CP_RETURN_IF_ERROR(inner_->submit(output, meta));
  in_flight_.push_back(std::move(entries));
  return {};
}

common::Result<sched::ModelRunnerOutput> DraftReplayExecutor::take_oldest() {
  CP_ASSIGN_OR_RETURN(sched::ModelRunnerOutput out, inner_->take_oldest());
  const std::vector<Entry> entries = std::move(in_flight_.front());
  in_flight_.pop_front();
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (size_t i = 0; i < entries.size() && i < out.draft_token_ids.size(); ++i) {
    std::vector<int32_t>& drafts = out.draft_token_ids[i];
    if (drafts.empty()) continue;
    auto ref = reference_.find(entries[i].req_id);
    const int64_t next =
        entries[i].num_outputs_before + static_cast<int64_t>(out.sampled[i].size());
    for (size_t j = 0; j < drafts.size(); ++j) {
      const int64_t at = next + static_cast<int64_t>(j);
      int32_t right = drafts[j];  // past the reference: the drafter's own
      if (ref != reference_.end() && at < static_cast<int64_t>(ref->second.size()))
        right = ref->second[static_cast<size_t>(at)];
      drafts[j] = u(rng_) < alpha_ ? right : (right == 0 ? 1 : right - 1);
    }
  }
  return out;
}

}  // namespace engine
