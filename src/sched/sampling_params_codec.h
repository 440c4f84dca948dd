// SamplingParams and SampledTokens on the wire, every field, for any writer / reader with
// dist/wire.h's interface (put / put_vector / put_strings / put_pairs and their getters).
// Templates so that sched needs no dist: the engine's codecs and the workers' step messages
// share them.
#pragma once

#include <cstdint>

#include <vector>

#include "sched/sampling_params.h"
#include "sched/scheduler_output.h"

namespace sched {

template <typename Writer>
void write_sampling_params(Writer& w, const SamplingParams& p) {
  w.put(p.temperature);
  w.put(p.top_p);
  w.put(p.top_k);
  w.put(p.min_p);
  w.template put<uint8_t>(p.seed ? 1 : 0);
  w.template put<uint64_t>(p.seed.value_or(0));
  w.put(p.repetition_penalty);
  w.put(p.presence_penalty);
  w.put(p.frequency_penalty);
  w.put(p.max_tokens);
  w.put(p.min_tokens);
  w.put_strings(p.stop);
  w.put_vector(p.stop_token_ids);
  w.template put<uint8_t>((p.include_stop_str_in_output ? 1 : 0) | (p.ignore_eos ? 2 : 0) |
                          (p.skip_special_tokens ? 4 : 0));
  w.template put<int32_t>(p.logprobs.value_or(-1));
  w.template put<uint8_t>(static_cast<uint8_t>(p.logprobs_mode));
  w.template put<int32_t>(p.prompt_logprobs.value_or(-1));
  w.put_pairs(p.logit_bias);
  w.put_vector(p.all_stop_token_ids);
  w.put_vector(p.allowed_token_ids);
  // Bad words as their lengths, then every id in order.
  std::vector<int32_t> lengths, ids;
  for (const auto& word : p.bad_words_token_ids) {
    lengths.push_back(static_cast<int32_t>(word.size()));
    ids.insert(ids.end(), word.begin(), word.end());
  }
  w.put_vector(lengths);
  w.put_vector(ids);
}

// False when the bytes run out or do not fit together.
template <typename Reader>
bool read_sampling_params(Reader& r, SamplingParams* p) {
  uint8_t has_seed = 0, flags = 0, logprobs_mode = 0;
  uint64_t seed = 0;
  int32_t logprobs = -1, prompt_logprobs = -1;
  r.get(&p->temperature);
  r.get(&p->top_p);
  r.get(&p->top_k);
  r.get(&p->min_p);
  r.get(&has_seed);
  r.get(&seed);
  p->seed.reset();
  if (has_seed) p->seed = seed;
  r.get(&p->repetition_penalty);
  r.get(&p->presence_penalty);
  r.get(&p->frequency_penalty);
  r.get(&p->max_tokens);
  r.get(&p->min_tokens);
  r.get_strings(&p->stop);
  r.get_vector(&p->stop_token_ids);
  r.get(&flags);
  p->include_stop_str_in_output = flags & 1;
  p->ignore_eos = flags & 2;
  p->skip_special_tokens = flags & 4;
  r.get(&logprobs);
  p->logprobs.reset();
  if (logprobs >= 0) p->logprobs = logprobs;
  r.get(&logprobs_mode);
  if (logprobs_mode > static_cast<uint8_t>(LogprobsMode::kProcessedLogits)) return false;
  p->logprobs_mode = static_cast<LogprobsMode>(logprobs_mode);
  r.get(&prompt_logprobs);
  p->prompt_logprobs.reset();
  if (prompt_logprobs >= 0) p->prompt_logprobs = prompt_logprobs;
  r.get_pairs(&p->logit_bias);
  r.get_vector(&p->all_stop_token_ids);
  r.get_vector(&p->allowed_token_ids);
  std::vector<int32_t> lengths, ids;
  r.get_vector(&lengths);
  r.get_vector(&ids);
  if (!r.ok()) return false;
  p->bad_words_token_ids.clear();
  size_t at = 0;
  for (int32_t n : lengths) {
    if (n < 0 || size_t(n) > ids.size() - at) return false;
    p->bad_words_token_ids.emplace_back(ids.begin() + at, ids.begin() + at + n);
    at += size_t(n);
  }
  return at == ids.size();
}

template <typename Writer>
void write_sampled_tokens(Writer& w, const std::vector<SampledToken>& tokens) {
  w.template put<uint64_t>(tokens.size());
  for (const SampledToken& t : tokens) {
    w.put(t.token);
    w.put(t.logprob);
    w.put_pairs(t.top_logprobs);
    w.put(t.rank);
  }
}

// False when the bytes run out; `limit` bounds the count (the message's size).
template <typename Reader>
bool read_sampled_tokens(Reader& r, size_t limit, std::vector<SampledToken>* tokens) {
  uint64_t n = 0;
  if (!r.get(&n) || n > limit) return false;
  tokens->resize(n);
  for (SampledToken& t : *tokens) {
    r.get(&t.token);
    r.get(&t.logprob);
    if (!r.get_pairs(&t.top_logprobs)) return false;
    r.get(&t.rank);
  }
  return r.ok();
}

}  // namespace sched
