// Sampler: turns one request's logits into the next token: penalties (repetition on prompt and
// output; presence and frequency on output), logit_bias, min_tokens masking of stop tokens, greedy
// or temperature / top-k / top-p / min-p sampling, and top-N logprobs. Pure function of its inputs
// and the RNG; thread-compatible.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "sched/request.h"
#include "sched/scheduler_output.h"

namespace worker {

using sched::SampledToken;

// The tokens the penalties and min_tokens read: the prompt (repetition penalty) and the output so
// far (every penalty, min_tokens).
struct TokenHistory {
  std::span<const int32_t> prompt_token_ids;
  std::span<const int32_t> output_token_ids;
};

// Samples from `logits` (modified in place) under `params`. While the output is shorter than
// min_tokens, params.all_stop_token_ids are masked. Ids in `history` must be in the vocabulary.
SampledToken sample_token(std::span<float> logits, const sched::SamplingParams& params,
                          const TokenHistory& history, std::mt19937_64& rng);

}  // namespace worker
