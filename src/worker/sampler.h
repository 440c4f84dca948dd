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

namespace worker {

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;                                 // of the chosen token
  std::vector<std::pair<int32_t, float>> top_logprobs;  // when requested, best first
};

// What the last pipeline stage needs to sample one request's next token without the engine's
// request state: its sampling parameters, the token history only when penalties or min_tokens
// read it, the ids masked before min_tokens, and this step's seed (drawn by the engine from the
// request's own generator, so seeded outputs do not depend on where sampling runs).
struct SampleSpec {
  sched::SamplingParams params;           // the fields sample_token reads (no stop strings)
  std::vector<int32_t> prompt_token_ids;  // with a repetition penalty
  std::vector<int32_t> output_token_ids;  // with any penalty or min_tokens
  std::vector<int32_t> stop_ids;
  uint64_t seed = 0;
};

// The spec of request `r` for this step; `stop_ids` as for sample_token, `seed` from its RNG.
SampleSpec make_sample_spec(const sched::Request& r, std::vector<int32_t> stop_ids, uint64_t seed);
// Samples from `logits` (modified in place) under `spec`.
SampledToken sample_with_spec(std::span<float> logits, const SampleSpec& spec);

// `logits` is modified in place. `stop_ids` are the ids masked while output is shorter than
// min_tokens (EOS unless ignore_eos, plus stop_token_ids).
SampledToken sample_token(std::span<float> logits, const sched::Request& request,
                          std::span<const int32_t> stop_ids, std::mt19937_64& rng);

}  // namespace worker
