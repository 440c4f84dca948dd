// Request: one generation request as the scheduler tracks it. There is no prefill or decode
// phase: a request has token ids (prompt, then outputs) and num_computed_tokens; each step
// computes some of the rest. Plain data; owned by the scheduler thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sched {

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
  std::optional<int32_t> logprobs;  // top-N logprobs per generated token
  bool skip_special_tokens = true;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  // stop_token_ids plus EOS unless ignore_eos (resolved by the engine at intake): the ids the
  // sampler masks while the output is shorter than min_tokens.
  std::vector<int32_t> all_stop_token_ids;

  bool greedy() const { return temperature < 1e-5; }
};

enum class RequestStatus { kWaiting, kRunning, kPreempted, kFinished };
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

struct Request {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> output_token_ids;
  SamplingParams sampling;
  int64_t num_computed_tokens = 0;
  int64_t num_cached_tokens = 0;  // prefix-cache hits at its last admission
  RequestStatus status = RequestStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  double arrival_time = 0;
  int32_t num_preemptions = 0;

  // What the workers hold of this request: the scheduler's bookkeeping for SchedulerOutput's
  // deltas (sched/scheduler_output.h).
  bool known_to_workers = false;
  bool resumed = false;         // preempted since the workers last saw it
  int64_t num_tokens_sent = 0;  // prompt and output tokens the workers hold
  size_t num_blocks_sent = 0;   // entries of the block table the workers hold

  int64_t num_prompt_tokens() const { return static_cast<int64_t>(prompt_token_ids.size()); }
  int64_t num_tokens() const {
    return static_cast<int64_t>(prompt_token_ids.size() + output_token_ids.size());
  }
  int32_t token_at(int64_t i) const {
    return i < num_prompt_tokens() ? prompt_token_ids[i]
                                   : output_token_ids[i - num_prompt_tokens()];
  }
  std::vector<int32_t> all_token_ids() const {
    std::vector<int32_t> ids = prompt_token_ids;
    ids.insert(ids.end(), output_token_ids.begin(), output_token_ids.end());
    return ids;
  }
};

}  // namespace sched
