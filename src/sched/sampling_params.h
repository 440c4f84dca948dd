// SamplingParams (how a request's tokens are chosen and when it stops) and FinishReason: plain
// data shared by the API layer, the engine and the workers' sampler.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sched {

// vLLM's --logprobs-mode: what a generated token's logprobs hold. Raw: from the model's logits
// before any processor (allowed_token_ids, bad words, logit_bias, min_tokens, penalties);
// processed: from the logits the token was drawn from (after those, then temperature, min-p,
// top-k and top-p, tokens outside the support at -inf; a greedy request's stop at the
// processors). *Logits modes give the values themselves instead of their log-softmax.
enum class LogprobsMode : uint8_t {
  kRawLogprobs,
  kRawLogits,
  kProcessedLogprobs,
  kProcessedLogits
};

struct SamplingParams {
  double temperature = 1.0;  // < 1e-5 means greedy
  double top_p = 1.0;
  int32_t top_k = 0;  // 0 or -1: off
  double min_p = 0.0;
  std::optional<uint64_t> seed;
  double repetition_penalty = 1.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  int32_t max_tokens = 16;
  int32_t min_tokens = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  std::optional<int32_t> logprobs;                          // top-N logprobs per generated token
  LogprobsMode logprobs_mode = LogprobsMode::kRawLogprobs;  // the engine's --logprobs-mode
  // Top-N logprobs per prompt token after the first, from the model's raw logits (vLLM's
  // prompt_logprobs). Such a request reads no prefix-cache hits: every position is computed.
  std::optional<int32_t> prompt_logprobs;
  bool skip_special_tokens = true;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  // Non-empty: every other token is masked (sorted, unique, in the vocabulary).
  std::vector<int32_t> allowed_token_ids;
  // vLLM's bad words as token sequences: a sequence's last token is masked whenever the output
  // so far ends with the rest of it (a one-token word is always masked).
  std::vector<std::vector<int32_t>> bad_words_token_ids;
  // stop_token_ids plus EOS unless ignore_eos (resolved by the engine at intake): the ids the
  // sampler masks while the output is shorter than min_tokens.
  std::vector<int32_t> all_stop_token_ids;

  bool greedy() const { return temperature < 1e-5; }
};

enum class FinishReason { kNone, kStop, kLength, kAbort };

// vLLM's finish_reason strings ("stop", "length", "abort"); nullptr for kNone.
inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kNone:
      break;
  }
  return nullptr;
}

}  // namespace sched
