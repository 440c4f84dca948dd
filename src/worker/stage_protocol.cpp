// Binary layout of the pipeline messages: one kind byte, then the kind's fields.
#include "worker/stage_protocol.h"

#include "dist/wire.h"

namespace worker {
namespace {

common::Status truncated(const char* what) {
  return common::data_loss(std::string("a malformed ") + what + " message reached this stage");
}

// The SamplingParams fields the sampler reads, then the spec's history and seed.
void put_sample_spec(dist::WireWriter& w, const SampleSpec& spec) {
  const sched::SamplingParams& p = spec.params;
  w.put(p.temperature);
  w.put(p.top_p);
  w.put(p.top_k);
  w.put(p.min_p);
  w.put(p.repetition_penalty);
  w.put(p.presence_penalty);
  w.put(p.frequency_penalty);
  w.put(p.min_tokens);
  w.put<int32_t>(p.logprobs ? *p.logprobs : -1);
  std::vector<int32_t> bias_ids;
  std::vector<float> bias_values;
  for (const auto& [t, v] : p.logit_bias) bias_ids.push_back(t), bias_values.push_back(v);
  w.put_vector(bias_ids);
  w.put_vector(bias_values);
  w.put_vector(spec.prompt_token_ids);
  w.put_vector(spec.output_token_ids);
  w.put_vector(spec.stop_ids);
  w.put(spec.seed);
}

bool get_sample_spec(dist::WireReader& r, SampleSpec* spec) {
  sched::SamplingParams& p = spec->params;
  int32_t logprobs = -1;
  r.get(&p.temperature);
  r.get(&p.top_p);
  r.get(&p.top_k);
  r.get(&p.min_p);
  r.get(&p.repetition_penalty);
  r.get(&p.presence_penalty);
  r.get(&p.frequency_penalty);
  r.get(&p.min_tokens);
  r.get(&logprobs);
  if (logprobs >= 0) p.logprobs = logprobs;
  std::vector<int32_t> bias_ids;
  std::vector<float> bias_values;
  r.get_vector(&bias_ids);
  r.get_vector(&bias_values);
  if (bias_ids.size() != bias_values.size()) return false;
  p.logit_bias.clear();
  for (size_t i = 0; i < bias_ids.size(); ++i)
    p.logit_bias.emplace_back(bias_ids[i], bias_values[i]);
  r.get_vector(&spec->prompt_token_ids);
  r.get_vector(&spec->output_token_ids);
  r.get_vector(&spec->stop_ids);
  r.get(&spec->seed);
  return r.ok();
}

dist::Message start(StageMessageKind kind) {
  dist::Message m;
  m.meta.push_back(static_cast<uint8_t>(kind));
  return m;
}

}  // namespace

common::Result<StageMessageKind> message_kind(const dist::Message& m) {
  if (m.meta.empty() || m.meta[0] < 1 || m.meta[0] > 4)
    return common::data_loss("a pipeline message of unknown kind");
  return static_cast<StageMessageKind>(m.meta[0]);
}

dist::Message encode_step(const StepEnvelope& step, std::vector<float> payload) {
  dist::Message m = start(StageMessageKind::kStep);
  dist::WireWriter w(&m.meta);
  w.put<int64_t>(step.input.step_id);
  w.put<double>(step.input.predicted_ms);
  w.put<uint64_t>(step.input.sequences.size());
  for (const auto& s : step.input.sequences) {
    w.put_vector(s.token_ids);
    w.put<int64_t>(s.num_computed_tokens);
    w.put_vector(s.block_table);
    w.put<uint8_t>(s.samples ? 1 : 0);
    if (s.samples) put_sample_spec(w, s.sample);
  }
  w.put_vector(step.timings);
  w.put<uint64_t>(step.sampled.size());
  for (const auto& t : step.sampled) {
    w.put<uint8_t>(t ? 1 : 0);
    if (!t) continue;
    w.put(t->token);
    w.put(t->logprob);
    std::vector<int32_t> ids;
    std::vector<float> lps;
    for (const auto& [id, lp] : t->top_logprobs) {
      ids.push_back(id);
      lps.push_back(lp);
    }
    w.put_vector(ids);
    w.put_vector(lps);
  }
  m.data = std::move(payload);
  return m;
}

common::Status decode_step(const dist::Message& m, StepEnvelope* step) {
  dist::WireReader r(m.meta);
  uint8_t kind = 0;
  uint64_t n = 0;
  r.get(&kind);
  r.get(&step->input.step_id);
  r.get(&step->input.predicted_ms);
  if (!r.get(&n) || n > m.meta.size()) return truncated("step");
  step->input.sequences.resize(n);
  for (auto& s : step->input.sequences) {
    uint8_t samples = 0;
    r.get_vector(&s.token_ids);
    r.get(&s.num_computed_tokens);
    r.get_vector(&s.block_table);
    r.get(&samples);
    s.samples = samples != 0;
    if (s.samples && !get_sample_spec(r, &s.sample)) return truncated("step");
  }
  r.get_vector(&step->timings);
  uint64_t num_sampled = 0;
  if (!r.get(&num_sampled) || num_sampled > step->input.sequences.size()) return truncated("step");
  step->sampled.resize(num_sampled);
  for (auto& t : step->sampled) {
    uint8_t has = 0;
    if (!r.get(&has)) return truncated("step");
    if (!has) continue;
    SampledToken tok;
    std::vector<int32_t> ids;
    std::vector<float> lps;
    r.get(&tok.token);
    r.get(&tok.logprob);
    r.get_vector(&ids);
    r.get_vector(&lps);
    if (!r.ok() || ids.size() != lps.size()) return truncated("step");
    for (size_t k = 0; k < ids.size(); ++k) tok.top_logprobs.emplace_back(ids[k], lps[k]);
    t = std::move(tok);
  }
  return r.at_end() ? common::Status{} : truncated("step");
}

dist::Message encode_profile(const ProfileProbe& probe) {
  dist::Message m = start(StageMessageKind::kProfile);
  dist::WireWriter w(&m.meta);
  w.put(probe.stage);
  w.put(probe.num_tokens);
  w.put(probe.ms);
  return m;
}

common::Status decode_profile(const dist::Message& m, ProfileProbe* probe) {
  dist::WireReader r(m.meta);
  uint8_t kind = 0;
  r.get(&kind);
  r.get(&probe->stage);
  r.get(&probe->num_tokens);
  r.get(&probe->ms);
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

}  // namespace worker
