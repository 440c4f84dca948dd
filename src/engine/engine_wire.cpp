// Field-by-field layout of EngineRequest and RequestOutput (dist/wire.h primitives).
#include "engine/engine_wire.h"

#include "dist/wire.h"
#include "sched/sampling_params_codec.h"

namespace engine {
namespace {

common::Status malformed(const char* what) {
  return common::data_loss(std::string("a malformed ") + what + " reached this engine");
}

}  // namespace

std::vector<uint8_t> encode_request(const EngineRequest& q) {
  std::vector<uint8_t> out;
  dist::WireWriter w(&out);
  w.put_string(q.request_id);
  w.put_vector(q.prompt_token_ids);
  sched::write_sampling_params(w, q.sampling);
  w.put_string(q.kv_transfer_params);
  return out;
}

common::Result<EngineRequest> decode_request(const std::vector<uint8_t>& bytes) {
  EngineRequest q;
  dist::WireReader r(bytes);
  r.get_string(&q.request_id);
  r.get_vector(&q.prompt_token_ids);
  if (!sched::read_sampling_params(r, &q.sampling)) return malformed("request");
  r.get_string(&q.kv_transfer_params);
  if (!r.ok() || !r.at_end()) return malformed("request");
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
