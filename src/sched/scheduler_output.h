// The two messages of a step, as in vLLM v1: SchedulerOutput (scheduler -> workers) and
// ModelRunnerOutput (workers -> engine). Plain, serializable data (worker/stage_protocol.h
// encodes them). A request travels in full once, the first step the workers see it; after that
// only its deltas, so a step's size does not grow with how far a prompt has got.
// Workers keep per-request state built from these deltas and never read the KV cache manager.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sched/chunk_cost_model.h"
#include "sched/request.h"

namespace sched {

// What the workers keep of a request, sent once (vLLM's NewRequestData).
struct NewRequestData {
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;  // `seed` and `all_stop_token_ids` resolved by the engine
};

// One request's share of a step. New to the workers: `new_request` is set and `new_block_ids`
// is the whole block table. Already known: only what changed (vLLM's CachedRequestData).
struct ScheduledRequest {
  std::string req_id;
  std::optional<NewRequestData> new_request;
  // Preempted since the workers last saw it: `new_block_ids` replaces the block table.
  bool resumed_from_preemption = false;
  std::vector<int32_t> new_token_ids;  // output tokens the workers have not seen yet
  std::vector<int32_t> new_block_ids;  // appended to the block table (see above)
  int64_t num_computed_tokens = 0;     // before this step
  int64_t num_scheduled_tokens = 0;    // tokens [num_computed, num_computed + this) run now
  bool samples = false;                // the chunk reaches the request's last token: sample it
  // Speculative decoding: draft tokens run after the request's last token, as the chunk's
  // last spec_token_ids.size() tokens (counted in num_scheduled_tokens), to be verified.
  std::vector<int32_t> spec_token_ids;
  // The attention form CPP's cost model chose for this chunk; kAuto: the model's FLOP rule.
  AttentionForm attention_form = AttentionForm::kAuto;
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> scheduled;     // in the order the forward batches them
  std::vector<std::string> finished_req_ids;   // workers drop these requests' state
  std::vector<uint8_t> kv_connector_metadata;  // for the workers' KV connector (opaque)
  int64_t total_num_scheduled_tokens = 0;
  int32_t num_preempted = 0;
  int32_t num_recomputed = 0;  // finished by the recompute scheduler this step
  // Nothing to compute, but KV transfers are pending: the workers' connectors report on them.
  bool kv_connector_poll = false;
  bool empty() const { return scheduled.empty(); }
};

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;                                 // of the chosen token
  std::vector<std::pair<int32_t, float>> top_logprobs;  // when requested, best first
  int32_t rank = 0;  // the token's 1-based rank in its distribution (prompt logprobs); 0: unset
};

// Counters of a worker's KV connector since its last report (summed over pipeline stages).
struct KvTransferStats {
  int64_t bytes_pulled = 0;
  int64_t blocks_pulled = 0;
  double read_seconds = 0;
  int64_t pulls_failed = 0;
  int64_t leases_expired = 0;
  int64_t late_releases = 0;    // DONEs for blocks already freed (expired, or released twice)
  int64_t pulls_in_flight = 0;  // a gauge: now, not since the last report
  // Adds another report's counters (and its gauge: workers' loads in flight add up).
  KvTransferStats& operator+=(const KvTransferStats& o) {
    bytes_pulled += o.bytes_pulled;
    blocks_pulled += o.blocks_pulled;
    read_seconds += o.read_seconds;
    pulls_failed += o.pulls_failed;
    leases_expired += o.leases_expired;
    late_releases += o.late_releases;
    pulls_in_flight += o.pulls_in_flight;
    return *this;
  }
};

// What the workers' KV connectors report after a step (worker/kv_connector.h). With pipeline
// stages, a request is listed once every stage has reported it.
struct KvTransferReport {
  std::vector<std::string> finished_sending;                        // their blocks may be freed now
  std::vector<std::string> finished_recving;                        // their KV has arrived
  std::vector<std::pair<std::string, std::string>> failed_recving;  // (id, why): KV is garbage
  KvTransferStats stats;
  bool empty() const {
    return finished_sending.empty() && finished_recving.empty() && failed_recving.empty();
  }
};

// A request the workers refused for its own data (token ids past the vocabulary): it fails
// alone, and the engine finishes it; the rest of its step ran without it.
struct RejectedRequest {
  std::string req_id;
  std::string why;
};

struct ModelRunnerOutput {
  // Entry i: scheduled[i]'s tokens: none when it does not sample, one, or with drafts the
  // accepted drafts and then the one sampled after them (1 .. spec_token_ids.size() + 1).
  std::vector<std::vector<SampledToken>> sampled;
  // Entry i: for a request with prompt_logprobs, one entry per position p of its chunk whose
  // next token is a prompt token (p + 1 < prompt length): that token, scored from the logits
  // at p. The first entry is position num_computed_tokens. Empty for other requests.
  std::vector<std::vector<SampledToken>> prompt_logprobs;
  // Entry i: speculative decoding's drafts for scheduled[i]'s next step (empty without).
  std::vector<std::vector<int32_t>> draft_token_ids;
  double last_stage_ms = 0;       // the last pipeline stage's own time for the step
  double max_stage_ms = 0;        // the slowest stage's time for the step
  KvTransferReport kv_transfers;  // the KV connector's, if any
  // Requests the workers refused this step; their entries above are empty.
  std::vector<RejectedRequest> rejected;
};

}  // namespace sched
