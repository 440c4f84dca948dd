// Field-by-field layout of EngineRequest and RequestOutput (dist/wire.h primitives).
#include "engine/engine_wire.h"

#include <algorithm>

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
  w.put_string(q.sampling_key);
  w.put_string(q.cache_salt);
  w.put(static_cast<uint8_t>(q.recomputable));
  w.put(q.priority);
  return out;
}

common::Result<EngineRequest> decode_request(const std::vector<uint8_t>& bytes) {
  EngineRequest q;
  dist::WireReader r(bytes);
  r.get_string(&q.request_id);
  r.get_vector(&q.prompt_token_ids);
  if (!sched::read_sampling_params(r, &q.sampling)) return malformed("request");
  r.get_string(&q.kv_transfer_params);
  r.get_string(&q.sampling_key);
  r.get_string(&q.cache_salt);
  uint8_t recomputable = 1;
  r.get(&recomputable);
  q.recomputable = recomputable != 0;
  r.get(&q.priority);
  if (!r.ok() || !r.at_end()) return malformed("request");
  return q;
}

std::vector<uint8_t> encode_output(const RequestOutput& o) {
  std::vector<uint8_t> out;
  dist::WireWriter w(&out);
  w.put_string(o.request_id);
  w.put_vector(o.new_token_ids);
  sched::write_sampled_tokens(w, o.new_logprobs);
  sched::write_sampled_tokens(w, o.prompt_logprobs);
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
  w.put<int32_t>(o.error_status);
  w.put_string(o.kv_transfer_params);
  return out;
}

common::Result<RequestOutput> decode_output(const std::vector<uint8_t>& bytes) {
  RequestOutput o;
  dist::WireReader r(bytes);
  uint8_t finished = 0, reason = 0, stop_kind = 0;
  r.get_string(&o.request_id);
  r.get_vector(&o.new_token_ids);
  if (!sched::read_sampled_tokens(r, bytes.size(), &o.new_logprobs) ||
      !sched::read_sampled_tokens(r, bytes.size(), &o.prompt_logprobs))
    return malformed("output");
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
  r.get(&o.error_status);
  r.get_string(&o.kv_transfer_params);
  if (!r.ok() || !r.at_end()) return malformed("output");
  return o;
}

namespace {

void put_histogram(dist::WireWriter& w, const Histogram& h) {
  w.put_vector(h.bounds);
  w.put_vector(h.counts);
  w.put(h.sum);
  w.put(h.count);
}

// Some bounds depend on the sender's configuration (max_model_len), so they travel too.
bool get_histogram(dist::WireReader& r, Histogram* h) {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;
  if (!r.get_vector(&bounds) || !r.get_vector(&counts) || counts.size() != bounds.size() + 1 ||
      !std::is_sorted(bounds.begin(), bounds.end()))
    return false;
  h->bounds = std::move(bounds);
  h->counts = std::move(counts);
  return r.get(&h->sum) && r.get(&h->count);
}

}  // namespace

std::vector<uint8_t> encode_metrics(const MetricsSnapshot& s) {
  std::vector<uint8_t> out;
  dist::WireWriter w(&out);
  const Metrics& m = s.totals;
  for (int64_t v : {m.prompt_tokens, m.generation_tokens, m.prefix_cache_queries,
                    m.prefix_cache_hits, m.external_prefix_cache_hits, m.preemptions,
                    m.recomputed_requests, m.dummy_batches, m.balance_paused_steps, m.cpp_steps})
    w.put(v);
  w.put(m.kv_transfer);
  for (int64_t v : {m.spec_decoding.num_drafts, m.spec_decoding.num_draft_tokens,
                    m.spec_decoding.num_accepted_tokens})
    w.put(v);
  w.put_vector(m.spec_decoding.accepted_per_pos);
  std::vector<std::string> reasons;
  std::vector<int64_t> counts;
  for (const auto& [reason, n] : m.request_success) reasons.push_back(reason), counts.push_back(n);
  w.put_strings(reasons);
  w.put_vector(counts);
  for (const Histogram* h : Metrics::histograms(m)) put_histogram(w, *h);
  w.put(m.cpp_predicted_ms_sum);
  w.put(m.cpp_measured_ms_sum);
  w.put(s.recent_prefix_cache_queries);
  w.put(s.recent_prefix_cache_hits);
  w.put(s.num_running);
  w.put(s.num_waiting);
  w.put(s.kv_cache_usage);
  w.put(s.num_kv_blocks);
  w.put(s.block_size);
  w.put_vector(s.stage_busy_seconds);
  w.put<uint8_t>(s.cpp_ready ? 1 : 0);
  for (double v : {s.cpp_a, s.cpp_b, s.cpp_c, s.cpp_target_ms}) w.put(v);
  return out;
}

common::Result<MetricsSnapshot> decode_metrics(const std::vector<uint8_t>& bytes) {
  MetricsSnapshot s;
  Metrics& m = s.totals;
  dist::WireReader r(bytes);
  for (int64_t* v :
       {&m.prompt_tokens, &m.generation_tokens, &m.prefix_cache_queries, &m.prefix_cache_hits,
        &m.external_prefix_cache_hits, &m.preemptions, &m.recomputed_requests, &m.dummy_batches,
        &m.balance_paused_steps, &m.cpp_steps})
    r.get(v);
  r.get(&m.kv_transfer);
  for (int64_t* v : {&m.spec_decoding.num_drafts, &m.spec_decoding.num_draft_tokens,
                     &m.spec_decoding.num_accepted_tokens})
    r.get(v);
  r.get_vector(&m.spec_decoding.accepted_per_pos);
  std::vector<std::string> reasons;
  std::vector<int64_t> counts;
  r.get_strings(&reasons);
  r.get_vector(&counts);
  if (!r.ok() || reasons.size() != counts.size()) return malformed("metrics report");
  for (size_t i = 0; i < reasons.size(); ++i) m.request_success[reasons[i]] = counts[i];
  for (Histogram* h : Metrics::histograms(m))
    if (!get_histogram(r, h)) return malformed("metrics report");
  r.get(&m.cpp_predicted_ms_sum);
  r.get(&m.cpp_measured_ms_sum);
  r.get(&s.recent_prefix_cache_queries);
  r.get(&s.recent_prefix_cache_hits);
  r.get(&s.num_running);
  r.get(&s.num_waiting);
  r.get(&s.kv_cache_usage);
  r.get(&s.num_kv_blocks);
  r.get(&s.block_size);
  r.get_vector(&s.stage_busy_seconds);
  uint8_t ready = 0;
  r.get(&ready);
  s.cpp_ready = ready != 0;
  for (double* v : {&s.cpp_a, &s.cpp_b, &s.cpp_c, &s.cpp_target_ms}) r.get(v);
  if (!r.ok() || !r.at_end()) return malformed("metrics report");
  return s;
}

}  // namespace engine
