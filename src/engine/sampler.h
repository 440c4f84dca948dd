// Sampler: turns one request's logits into the next token: penalties (repetition on prompt and
// output; presence and frequency on output), min_tokens masking of stop tokens, greedy or
// temperature / top-k / top-p / min-p sampling, and top-N logprobs. Pure function of its
// inputs and the RNG; thread-compatible.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "sched/request.h"

namespace engine {

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;                                 // of the chosen token
  std::vector<std::pair<int32_t, float>> top_logprobs;  // when requested, best first
};

// `logits` is modified in place. `stop_ids` are the ids masked while output is shorter than
// min_tokens (EOS unless ignore_eos, plus stop_token_ids).
SampledToken sample_token(std::span<float> logits, const sched::Request& request,
                          std::span<const int32_t> stop_ids, std::mt19937_64& rng);

}  // namespace engine
