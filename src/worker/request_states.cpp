// Applying SchedulerOutput deltas to the worker's request states.
#include "worker/request_states.h"

#include <cstdint>

#include "sched/token_id_checks.h"

namespace worker {
namespace {

common::Status refused(const std::string& why) {
  return common::data_loss("a step was refused: " + why);
}

}  // namespace

model::AttentionMode attention_mode(sched::AttentionForm form) {
  switch (form) {
    case sched::AttentionForm::kExpanded:
      return model::AttentionMode::kExpanded;
    case sched::AttentionForm::kAbsorbed:
      return model::AttentionMode::kAbsorbed;
    case sched::AttentionForm::kAuto:
      break;
  }
  return model::AttentionMode::kAuto;
}

common::Status RequestStates::check_tokens(const std::vector<int32_t>& ids) const {
  for (int32_t t : ids) {
    if (t < 0 || t >= vocab_size_)
      return refused("token id " + std::to_string(t) + " is outside [0, " +
                     std::to_string(vocab_size_) + ")");
  }
  return {};
}

common::Status RequestStates::check_blocks(const std::vector<int32_t>& ids) const {
  for (int32_t b : ids) {
    if (b < 0 || b >= num_blocks_)
      return refused("KV block " + std::to_string(b) + " is outside [0, " +
                     std::to_string(num_blocks_) + ")");
  }
  return {};
}

ScreenedStep RequestStates::screen(const sched::SchedulerOutput& output) {
  for (const std::string& id : output.finished_req_ids) rejected_.erase(id);
  ScreenedStep step;
  std::vector<bool> held(output.scheduled.size(), false);
  bool any = false;
  for (size_t i = 0; i < output.scheduled.size(); ++i) {
    const sched::ScheduledRequest& s = output.scheduled[i];
    if (rejected_.count(s.req_id)) {
      held[i] = any = true;
      continue;
    }
    if (!s.new_request) continue;
    const sched::NewRequestData& n = *s.new_request;
    if (auto why = sched::out_of_vocab_request(n.prompt_token_ids, n.sampling, vocab_size_)) {
      step.rejected.push_back({s.req_id, *why});
      rejected_.insert(s.req_id);
      held[i] = any = true;
    }
  }
  if (!any) return step;
  sched::SchedulerOutput kept;
  kept.finished_req_ids = output.finished_req_ids;
  kept.kv_connector_metadata = output.kv_connector_metadata;
  kept.num_preempted = output.num_preempted;
  kept.num_recomputed = output.num_recomputed;
  kept.kv_connector_poll = output.kv_connector_poll;
  for (size_t i = 0; i < output.scheduled.size(); ++i) {
    if (held[i]) continue;
    kept.scheduled.push_back(output.scheduled[i]);
    kept.total_num_scheduled_tokens += output.scheduled[i].num_scheduled_tokens;
    step.kept_index.push_back(i);
  }
  step.kept = std::move(kept);
  return step;
}

common::Status RequestStates::apply(const sched::SchedulerOutput& output,
                                    std::vector<CachedRequestState*>* states) {
  for (const std::string& id : output.finished_req_ids) states_.erase(id);
  states->clear();
  for (const sched::ScheduledRequest& s : output.scheduled) {
    CP_RETURN_IF_ERROR(check_tokens(s.new_token_ids));
    CP_RETURN_IF_ERROR(check_blocks(s.new_block_ids));
    CachedRequestState* st = nullptr;
    if (s.new_request) {
      const sched::NewRequestData& n = *s.new_request;
      // screen() holds such a request back: one here means a step that skipped screen().
      if (auto why = sched::out_of_vocab_request(n.prompt_token_ids, n.sampling, vocab_size_))
        return refused("request " + s.req_id + " was not screened: " + *why);
      st = &states_[s.req_id];
      st->token_ids = n.prompt_token_ids;
      st->num_prompt_tokens = static_cast<int64_t>(n.prompt_token_ids.size());
      st->block_ids.clear();
      st->sampling = n.sampling;
      st->generator.seed(n.sampling.seed ? *n.sampling.seed : 0);
    } else {
      auto it = states_.find(s.req_id);
      if (it == states_.end()) return refused("no state for request " + s.req_id);
      st = &it->second;
      if (s.resumed_from_preemption) st->block_ids.clear();
    }
    st->token_ids.insert(st->token_ids.end(), s.new_token_ids.begin(), s.new_token_ids.end());
    st->block_ids.insert(st->block_ids.end(), s.new_block_ids.begin(), s.new_block_ids.end());
    CP_RETURN_IF_ERROR(check_tokens(s.spec_token_ids));
    const int64_t num_spec = static_cast<int64_t>(s.spec_token_ids.size());
    const int64_t known = static_cast<int64_t>(st->token_ids.size());
    const int64_t limit = known + num_spec;  // sizes of vectors: cannot overflow
    // Both counts come from a peer: bound each before adding them, so that a huge pair cannot
    // wrap around into range.
    const auto range_refusal = [&] {
      int64_t sum = 0;
      const std::string end_text =
          __builtin_add_overflow(s.num_computed_tokens, s.num_scheduled_tokens, &sum)
              ? std::to_string(s.num_computed_tokens) + " + " +
                    std::to_string(s.num_scheduled_tokens)
              : std::to_string(sum);
      return refused("request " + s.req_id + " schedules tokens [" +
                     std::to_string(s.num_computed_tokens) + ", " + end_text + ") with " +
                     std::to_string(st->token_ids.size()) + " tokens and " +
                     std::to_string(st->block_ids.size()) + " blocks");
    };
    if (s.num_computed_tokens < 0 || s.num_scheduled_tokens <= 0 || s.num_computed_tokens > limit ||
        s.num_scheduled_tokens > limit - s.num_computed_tokens)
      return range_refusal();
    const int64_t end = s.num_computed_tokens + s.num_scheduled_tokens;
    if (num_spec > 0 &&
        (!s.samples || end != known + num_spec || num_spec >= s.num_scheduled_tokens))
      return refused("request " + s.req_id + " runs " + std::to_string(num_spec) +
                     " drafts in a chunk that does not end with them");
    if (end > static_cast<int64_t>(st->block_ids.size()) * block_size_) return range_refusal();
    if (s.samples && end != known + num_spec)
      return refused("request " + s.req_id + " samples before its last token");
    st->step_input.clear();
    if (num_spec > 0) {
      st->step_input.assign(st->token_ids.begin() + s.num_computed_tokens, st->token_ids.end());
      st->step_input.insert(st->step_input.end(), s.spec_token_ids.begin(), s.spec_token_ids.end());
    }
    states->push_back(st);
  }
  return {};
}

model::ForwardBatch RequestStates::forward_batch(const sched::SchedulerOutput& output,
                                                 const std::vector<CachedRequestState*>& states) {
  model::ForwardBatch batch;
  for (size_t i = 0; i < output.scheduled.size(); ++i) {
    const sched::ScheduledRequest& s = output.scheduled[i];
    const CachedRequestState& st = *states[i];
    const std::span<const int32_t> tokens =
        st.step_input.empty()
            ? std::span<const int32_t>(st.token_ids)
                  .subspan(size_t(s.num_computed_tokens), size_t(s.num_scheduled_tokens))
            : std::span<const int32_t>(st.step_input);
    batch.sequences.push_back(
        {tokens, s.num_computed_tokens, st.block_ids, attention_mode(s.attention_form)});
  }
  return batch;
}

}  // namespace worker
