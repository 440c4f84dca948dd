// Token-id range checks over one request's data (token_id_checks.h).
#include "sched/token_id_checks.h"

namespace sched {

std::optional<int32_t> first_out_of_vocab(std::span<const int32_t> ids, int64_t vocab_size) {
  for (int32_t t : ids) {
    if (t < 0 || t >= vocab_size) return t;
  }
  return std::nullopt;
}

std::string out_of_vocab_message(const std::string& field, int64_t id, int64_t vocab_size) {
  return "'" + field + "' holds token id " + std::to_string(id) + ", outside the vocabulary [0, " +
         std::to_string(vocab_size) + ")";
}

std::optional<std::string> out_of_vocab_sampling(const SamplingParams& s, int64_t vocab_size) {
  const auto check = [&](const char* field,
                         std::span<const int32_t> ids) -> std::optional<std::string> {
    if (auto bad = first_out_of_vocab(ids, vocab_size))
      return out_of_vocab_message(field, *bad, vocab_size);
    return std::nullopt;
  };
  if (auto e = check("stop_token_ids", s.stop_token_ids)) return e;
  // all_stop_token_ids adds the model's EOS ids (engine intake): a bad one is the engine's.
  if (auto e = check("all_stop_token_ids", s.all_stop_token_ids)) return e;
  for (const auto& [t, bias] : s.logit_bias) {
    if (t < 0 || t >= vocab_size) return out_of_vocab_message("logit_bias", t, vocab_size);
  }
  if (auto e = check("allowed_token_ids", s.allowed_token_ids)) return e;
  for (const auto& word : s.bad_words_token_ids) {
    if (auto e = check("bad_words", word)) return e;
  }
  return std::nullopt;
}

std::optional<std::string> out_of_vocab_request(std::span<const int32_t> prompt_token_ids,
                                                const SamplingParams& sampling,
                                                int64_t vocab_size) {
  if (auto bad = first_out_of_vocab(prompt_token_ids, vocab_size))
    return out_of_vocab_message("prompt", *bad, vocab_size);
  return out_of_vocab_sampling(sampling, vocab_size);
}

}  // namespace sched
