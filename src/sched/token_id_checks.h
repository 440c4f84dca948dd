// Token-id range checks over one request's data: its prompt and every SamplingParams field that
// names token ids. The API server, the engine's intake and the workers all run the same check,
// so a request whose ids reach past the model's vocabulary fails alone wherever it is caught.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "sched/sampling_params.h"

namespace sched {

// The first id of `ids` outside [0, vocab_size), if any.
std::optional<int32_t> first_out_of_vocab(std::span<const int32_t> ids, int64_t vocab_size);

// Why `sampling` cannot run on a model of vocab_size rows: the field and the id, for example
// "'stop_token_ids' holds token id 129280, outside the vocabulary [0, 129280)". Checks
// stop_token_ids, all_stop_token_ids, logit_bias, allowed_token_ids and bad_words_token_ids.
std::optional<std::string> out_of_vocab_sampling(const SamplingParams& sampling,
                                                 int64_t vocab_size);

// The same for a prompt ("'prompt' holds token id ...") and then its sampling parameters.
std::optional<std::string> out_of_vocab_request(std::span<const int32_t> prompt_token_ids,
                                                const SamplingParams& sampling, int64_t vocab_size);

// The message both of the above use for `field` holding `id`.
std::string out_of_vocab_message(const std::string& field, int64_t id, int64_t vocab_size);

}  // namespace sched
