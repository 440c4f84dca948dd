// Field-by-field layout of EngineRequest and RequestOutput (dist/wire.h primitives).
#include "engine/engine_wire.h"

#include "dist/wire.h"

namespace engine {
namespace {

template <typename T>
void put_optional(dist::WireWriter& w, const std::optional<T>& v) {
  w.put<uint8_t>(v ? 1 : 0);
  w.put<T>(v.value_or(T{}));
}

template <typename T>
void get_optional(dist::WireReader& r, std::optional<T>* v) {
  uint8_t has = 0;
  T x{};
  r.get(&has);
  r.get(&x);
  if (has) *v = x;
}

common::Status malformed(const char* what) {
  return common::data_loss(std::string("a malformed ") + what + " reached this engine");
}

}  // namespace

std::vector<uint8_t> encode_request(const EngineRequest& q) {
  std::vector<uint8_t> out;
  dist::WireWriter w(&out);
  const sched::SamplingParams& p = q.sampling;
  w.put_string(q.request_id);
  w.put_vector(q.prompt_token_ids);
  w.put(p.temperature);
  w.put(p.top_p);
  w.put(p.top_k);
  w.put(p.min_p);
  put_optional(w, p.seed);
  w.put(p.repetition_penalty);
  w.put(p.presence_penalty);
  w.put(p.frequency_penalty);
  w.put(p.max_tokens);
  w.put(p.min_tokens);
  w.put_strings(p.stop);
  w.put_vector(p.stop_token_ids);
  w.put<uint8_t>((p.include_stop_str_in_output ? 1 : 0) | (p.ignore_eos ? 2 : 0) |
                 (p.skip_special_tokens ? 4 : 0));
  put_optional(w, p.logprobs);
  w.put_pairs(p.logit_bias);
  return out;
}

common::Result<EngineRequest> decode_request(const std::vector<uint8_t>& bytes) {
  EngineRequest q;
  dist::WireReader r(bytes);
  sched::SamplingParams& p = q.sampling;
  uint8_t flags = 0;
  r.get_string(&q.request_id);
  r.get_vector(&q.prompt_token_ids);
  r.get(&p.temperature);
  r.get(&p.top_p);
  r.get(&p.top_k);
  r.get(&p.min_p);
  get_optional(r, &p.seed);
  r.get(&p.repetition_penalty);
  r.get(&p.presence_penalty);
  r.get(&p.frequency_penalty);
  r.get(&p.max_tokens);
  r.get(&p.min_tokens);
  if (!r.get_strings(&p.stop)) return malformed("request");
  r.get_vector(&p.stop_token_ids);
  r.get(&flags);
  p.include_stop_str_in_output = flags & 1;
  p.ignore_eos = flags & 2;
  p.skip_special_tokens = flags & 4;
  get_optional(r, &p.logprobs);
  if (!r.get_pairs(&p.logit_bias) || !r.at_end()) return malformed("request");
  return q;
}

std::vector<uint8_t> encode_output(const RequestOutput& o) {
  std::vector<uint8_t> out;
  dist::WireWriter w(&out);
  w.put_string(o.request_id);
  w.put_vector(o.new_token_ids);
  w.put<uint64_t>(o.new_logprobs.size());
  for (const auto& lp : o.new_logprobs) {
    w.put(lp.token);
    w.put(lp.logprob);
    w.put_pairs(lp.top_logprobs);
  }
  w.put_string(o.new_text);
  w.put<uint8_t>(o.finished ? 1 : 0);
  w.put<uint8_t>(static_cast<uint8_t>(o.finish_reason));
  w.put<uint8_t>(static_cast<uint8_t>(o.stop_reason.index()));
  if (const auto* s = std::get_if<std::string>(&o.stop_reason)) w.put_string(*s);
  if (const auto* t = std::get_if<int32_t>(&o.stop_reason)) w.put(*t);
  w.put(o.num_prompt_tokens);
  w.put(o.num_output_tokens);
  w.put(o.num_cached_tokens);
  w.put_string(o.error);
  w.put_string(o.kv_transfer_params);
  return out;
}

common::Result<RequestOutput> decode_output(const std::vector<uint8_t>& bytes) {
  RequestOutput o;
  dist::WireReader r(bytes);
  uint64_t n = 0;
  uint8_t finished = 0, reason = 0, stop_kind = 0;
  r.get_string(&o.request_id);
  r.get_vector(&o.new_token_ids);
  if (!r.get(&n) || n > bytes.size()) return malformed("output");
  o.new_logprobs.resize(n);
  for (auto& lp : o.new_logprobs) {
    r.get(&lp.token);
    r.get(&lp.logprob);
    if (!r.get_pairs(&lp.top_logprobs)) return malformed("output");
  }
  r.get_string(&o.new_text);
  r.get(&finished);
  r.get(&reason);
  r.get(&stop_kind);
  if (reason > static_cast<uint8_t>(sched::FinishReason::kAbort) || stop_kind > 2)
    return malformed("output");
  o.finished = finished != 0;
  o.finish_reason = static_cast<sched::FinishReason>(reason);
  if (stop_kind == 1) {
    std::string s;
    r.get_string(&s);
    o.stop_reason = s;
  } else if (stop_kind == 2) {
    int32_t t = 0;
    r.get(&t);
    o.stop_reason = t;
  }
  r.get(&o.num_prompt_tokens);
  r.get(&o.num_output_tokens);
  r.get(&o.num_cached_tokens);
  r.get_string(&o.error);
  r.get_string(&o.kv_transfer_params);
  if (!r.ok() || !r.at_end()) return malformed("output");
  return o;
}

}  // namespace engine
