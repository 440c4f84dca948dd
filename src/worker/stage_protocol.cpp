// Binary layout of the pipeline messages: one kind byte, then the kind's fields.
#include "worker/stage_protocol.h"

#include "dist/wire.h"
#include "sched/sampling_params_codec.h"

namespace worker {
namespace {

common::Status truncated(const char* what) {
  return common::data_loss(std::string("a malformed ") + what + " message reached this stage");
}

void put_output(dist::WireWriter& w, const sched::SchedulerOutput& so) {
  w.put<uint64_t>(so.scheduled.size());
  for (const auto& s : so.scheduled) {
    w.put_string(s.req_id);
    w.put<uint8_t>((s.new_request ? 1 : 0) | (s.resumed_from_preemption ? 2 : 0) |
                   (s.samples ? 4 : 0) | (static_cast<uint8_t>(s.attention_form) << 3));
    if (s.new_request) {
      w.put_vector(s.new_request->prompt_token_ids);
      sched::write_sampling_params(w, s.new_request->sampling);
    }
    w.put_vector(s.new_token_ids);
    w.put_vector(s.new_block_ids);
    w.put(s.num_computed_tokens);
    w.put(s.num_scheduled_tokens);
    w.put_vector(s.spec_token_ids);
  }
  w.put_strings(so.finished_req_ids);
  w.put_vector(so.kv_connector_metadata);
  w.put(so.total_num_scheduled_tokens);
  w.put(so.num_preempted);
  w.put(so.num_recomputed);
}

bool get_output(dist::WireReader& r, size_t limit, sched::SchedulerOutput* so) {
  uint64_t n = 0;
  if (!r.get(&n) || n > limit) return false;
  so->scheduled.resize(n);
  for (auto& s : so->scheduled) {
    uint8_t flags = 0;
    r.get_string(&s.req_id);
    r.get(&flags);
    s.resumed_from_preemption = flags & 2;
    s.samples = flags & 4;
    const uint8_t form = (flags >> 3) & 3;
    if (form > static_cast<uint8_t>(sched::AttentionForm::kAbsorbed)) return false;
    s.attention_form = static_cast<sched::AttentionForm>(form);
    if (flags & 1) {
      s.new_request.emplace();
      r.get_vector(&s.new_request->prompt_token_ids);
      if (!sched::read_sampling_params(r, &s.new_request->sampling)) return false;
    }
    r.get_vector(&s.new_token_ids);
    r.get_vector(&s.new_block_ids);
    r.get(&s.num_computed_tokens);
    r.get(&s.num_scheduled_tokens);
    r.get_vector(&s.spec_token_ids);
  }
  if (!r.get_strings(&so->finished_req_ids)) return false;
  r.get_vector(&so->kv_connector_metadata);
  r.get(&so->total_num_scheduled_tokens);
  r.get(&so->num_preempted);
  r.get(&so->num_recomputed);
  return r.ok();
}

dist::Message start(StageMessageKind kind) {
  dist::Message m;
  m.meta.push_back(static_cast<uint8_t>(kind));
  return m;
}

}  // namespace

common::Result<StageMessageKind> message_kind(const dist::Message& m) {
  if (m.meta.empty() || m.meta[0] < 1 || m.meta[0] > 5)
    return common::data_loss("a pipeline message of unknown kind");
  return static_cast<StageMessageKind>(m.meta[0]);
}

dist::Message encode_step(const StepEnvelope& step, std::vector<float> payload) {
  dist::Message m = start(StageMessageKind::kStep);
  dist::WireWriter w(&m.meta);
  w.put<int64_t>(step.step_id);
  w.put<double>(step.predicted_ms);
  put_output(w, step.output);
  w.put_vector(step.timings);
  w.put<uint64_t>(step.sampled.size());
  for (const auto& tokens : step.sampled) sched::write_sampled_tokens(w, tokens);
  w.put<uint64_t>(step.prompt_logprobs.size());
  for (const auto& tokens : step.prompt_logprobs) sched::write_sampled_tokens(w, tokens);
  w.put<uint64_t>(step.draft_token_ids.size());
  for (const auto& drafts : step.draft_token_ids) w.put_vector(drafts);
  std::vector<std::string> rejected_ids, rejected_why;
  for (const auto& [id, why] : step.rejected)
    rejected_ids.push_back(id), rejected_why.push_back(why);
  w.put_strings(rejected_ids);
  w.put_strings(rejected_why);
  const sched::KvTransferReport& t = step.transfers;
  w.put_strings(t.finished_sending);
  w.put_strings(t.finished_recving);
  std::vector<std::string> failed_ids, failed_why;
  for (const auto& [id, why] : t.failed_recving)
    failed_ids.push_back(id), failed_why.push_back(why);
  w.put_strings(failed_ids);
  w.put_strings(failed_why);
  w.put(t.stats);
  m.data = std::move(payload);
  return m;
}

common::Status decode_step(const dist::Message& m, StepEnvelope* step) {
  dist::WireReader r(m.meta);
  uint8_t kind = 0;
  r.get(&kind);
  r.get(&step->step_id);
  r.get(&step->predicted_ms);
  if (!get_output(r, m.meta.size(), &step->output)) return truncated("step");
  r.get_vector(&step->timings);
  uint64_t num_sampled = 0;
  if (!r.get(&num_sampled) || num_sampled > m.meta.size()) return truncated("step");
  step->sampled.resize(num_sampled);
  for (auto& tokens : step->sampled)
    if (!sched::read_sampled_tokens(r, m.meta.size(), &tokens)) return truncated("step");
  uint64_t num_prompt = 0;
  if (!r.get(&num_prompt) || num_prompt > m.meta.size()) return truncated("step");
  step->prompt_logprobs.resize(num_prompt);
  for (auto& tokens : step->prompt_logprobs)
    if (!sched::read_sampled_tokens(r, m.meta.size(), &tokens)) return truncated("step");
  uint64_t num_drafts = 0;
  if (!r.get(&num_drafts) || num_drafts > m.meta.size()) return truncated("step");
  step->draft_token_ids.resize(num_drafts);
  for (auto& drafts : step->draft_token_ids)
    if (!r.get_vector(&drafts)) return truncated("step");
  std::vector<std::string> rejected_ids, rejected_why;
  if (!r.get_strings(&rejected_ids) || !r.get_strings(&rejected_why) ||
      rejected_ids.size() != rejected_why.size())
    return truncated("step");
  for (size_t i = 0; i < rejected_ids.size(); ++i)
    step->rejected.push_back({std::move(rejected_ids[i]), std::move(rejected_why[i])});
  sched::KvTransferReport& t = step->transfers;
  std::vector<std::string> failed_ids, failed_why;
  if (!r.get_strings(&t.finished_sending) || !r.get_strings(&t.finished_recving) ||
      !r.get_strings(&failed_ids) || !r.get_strings(&failed_why) ||
      failed_ids.size() != failed_why.size() || !r.get(&t.stats))
    return truncated("step");
  for (size_t i = 0; i < failed_ids.size(); ++i)
    t.failed_recving.emplace_back(std::move(failed_ids[i]), std::move(failed_why[i]));
  return r.at_end() ? common::Status{} : truncated("step");
}

size_t encoded_size(const sched::SchedulerOutput& output) {
  std::vector<uint8_t> bytes;
  dist::WireWriter w(&bytes);
  put_output(w, output);
  return bytes.size();
}

dist::Message encode_profile(const ProfileProbe& probe) {
  dist::Message m = start(StageMessageKind::kProfile);
  dist::WireWriter w(&m.meta);
  w.put(probe.stage);
  w.put(probe.num_tokens);
  w.put(probe.history);
  w.put(static_cast<uint8_t>(probe.form));
  w.put(probe.ms);
  return m;
}

common::Status decode_profile(const dist::Message& m, ProfileProbe* probe) {
  dist::WireReader r(m.meta);
  uint8_t kind = 0;
  r.get(&kind);
  r.get(&probe->stage);
  r.get(&probe->num_tokens);
  r.get(&probe->history);
  uint8_t form = 0;
  r.get(&form);
  r.get(&probe->ms);
  if (form > static_cast<uint8_t>(sched::AttentionForm::kAbsorbed) || probe->num_tokens < 1 ||
      probe->history < 0)
    return truncated("profile");
  probe->form = static_cast<sched::AttentionForm>(form);
  return r.at_end() ? common::Status{} : truncated("profile");
}

dist::Message encode_hello(const Hello& hello) {
  dist::Message m = start(StageMessageKind::kHello);
  dist::WireWriter w(&m.meta);
  w.put_vector(hello.stages);
  w.put_vector(hello.pids);
  w.put_vector(hello.num_blocks);
  return m;
}

common::Status decode_hello(const dist::Message& m, Hello* hello) {
  dist::WireReader r(m.meta);
  uint8_t kind = 0;
  r.get(&kind);
  r.get_vector(&hello->stages);
  r.get_vector(&hello->pids);
  r.get_vector(&hello->num_blocks);
  const size_t n = hello->stages.size();
  return r.at_end() && hello->pids.size() == n && hello->num_blocks.size() == n
             ? common::Status{}
             : truncated("hello");
}

dist::Message encode_shutdown() {
  return start(StageMessageKind::kShutdown);
}

dist::Message encode_dummy() {
  return start(StageMessageKind::kDummy);
}

}  // namespace worker
