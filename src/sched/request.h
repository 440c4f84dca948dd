// Request: one generation request as the scheduler tracks it. There is no prefill or decode
// phase: a request has token ids (prompt, then outputs) and num_computed_tokens; each step
// computes some of the rest. Plain data; owned by the scheduler thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sched/sampling_params.h"

namespace sched {

// kWaitingForRemoteKvs: blocks allocated, the KV connector is loading them asynchronously.
enum class RequestStatus { kWaiting, kWaitingForRemoteKvs, kRunning, kPreempted, kFinished };

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
  // vLLM's priority (smaller is served first under --scheduling-policy priority) and the
  // scheduler's count of requests added before this one, which breaks priority ties.
  int64_t priority = 0;
  uint64_t arrival_order = 0;
  int32_t num_preemptions = 0;
  int64_t num_external_tokens = 0;  // of num_cached_tokens, those a KV connector provided
  std::string kv_transfer_params;   // the client's, for the KV connector (JSON text), if any
  std::string cache_salt;           // prefix-cache hits only among requests with the same salt
  bool recomputable = true;         // the recompute scheduler may hand it back (EngineRequest)
  std::string kv_handoff_params;    // the KV connector's answer at finish (JSON), if any
  // CPP planned mode: the chunk time of this prompt's plan (0: fixed chunks; < 0: not planned
  // yet). Planned at its first chunk, again after a preemption.
  double cpp_chunk_ms = -1;
  // Speculative decoding: the drafts proposed for this request's next step (vLLM's
  // spec_token_ids). They are scheduled after its last token and consumed by that step.
  std::vector<int32_t> spec_token_ids;

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
