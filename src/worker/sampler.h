// Sampler: turns one request's logits into the next token: penalties (repetition on prompt and
// output; presence and frequency on output), logit_bias, min_tokens masking of stop tokens, greedy
// or temperature / top-k / top-p / min-p sampling, and top-N logprobs in the request's
// logprobs_mode (sched/sampling_params.h); and the verification of
// a speculative draft token. Pure function of its inputs
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

// What a random (non-greedy) draw picks from, by token id: exp((logit - max) / temperature),
// zero outside the support that min-p, top-k and top-p leave. `logits` as sample_token has
// processed them.
std::vector<double> sampling_weights(std::span<const float> logits,
                                     const sched::SamplingParams& params);

// Prompt logprobs: `token` (in the vocabulary) scored under the raw `logits`, with no logits
// processor and no temperature, as vLLM scores prompts: its logprob, its 1-based rank (1 + the
// ids with a strictly larger logit) and the top `num_top` ids, best first.
SampledToken score_token(std::span<const float> logits, int32_t token, int32_t num_top);

// Speculative decoding: one draft position checked against the target's logits, by rejection
// sampling with a one-hot draft distribution (vLLM's rejection sampler without draft probs).
// The draft is accepted with probability p(draft) under the distribution sample_token draws
// from (greedy: when it is the argmax); otherwise the token is drawn from p with the draft
// removed (greedy: the argmax). Either way the token's law is exactly p.
struct VerifiedToken {
  SampledToken sampled;
  bool accepted = false;
};
VerifiedToken verify_draft(std::span<float> logits, const sched::SamplingParams& params,
                           const TokenHistory& history, int32_t draft, std::mt19937_64& rng);

}  // namespace worker
