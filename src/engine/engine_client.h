// EngineClient: all the API server needs of an engine (vLLM's EngineClient): add a request,
// abort it, read metrics and health. Requests and outputs are plain, serializable data, apart
// from scheduler state, so that an engine in another process or a data-parallel client that
// spreads requests over several engines can stand behind it without a change to server/.
// Implementations are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "engine/metrics.h"
#include "sched/sampling_params.h"
#include "sched/scheduler_output.h"

namespace engine {

struct EngineRequest {
  std::string request_id;  // unique among the engine's live requests
  std::vector<int32_t> prompt_token_ids;
  sched::SamplingParams sampling;
  // The client's kv_transfer_params (a JSON object's text; empty for none): a PD request's
  // instructions to the KV connector (do_remote_decode on P, do_remote_prefill on D).
  std::string kv_transfer_params;
  // Seeds the generator of a request without its own seed, with the engine's --seed (empty:
  // request_id). The API server passes the client-visible id and choice, so one request samples
  // the same tokens on whichever data-parallel rank serves it.
  std::string sampling_key;
  // The request's cache_salt: it shares prefix-cache blocks only with requests of the same salt.
  std::string cache_salt;
  // Whether the recompute scheduler may hand it back (stop_reason "recomputed") for the proxy to
  // resume elsewhere. Not one of several choices: the proxy resumes only an answer's first.
  bool recomputable = true;
  // vLLM's priority: under --scheduling-policy priority the smaller is served first.
  int64_t priority = 0;
};

// A generated token with its logprob and the top alternatives (when asked for).
using TokenLogprob = sched::SampledToken;

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> new_token_ids;
  std::vector<TokenLogprob> new_logprobs;  // when the request asked for logprobs
  // With prompt_logprobs, on the first output only: entry p scores prompt token p + 1 (a NaN
  // logprob where the engine did not compute that position, e.g. KV loaded from a peer).
  std::vector<TokenLogprob> prompt_logprobs;
  std::string new_text;
  bool finished = false;
  sched::FinishReason finish_reason = sched::FinishReason::kNone;
  std::variant<std::monostate, std::string, int32_t> stop_reason;
  int64_t num_prompt_tokens = 0;
  int64_t num_output_tokens = 0;
  int64_t num_cached_tokens = 0;
  std::string error;  // set when the request failed (finish_reason is then abort)
  // With `error`: 0 when the engine failed (every request fails; 500 EngineDeadError); else the
  // HTTP status of a request that failed alone while the engine serves on (400: its own data was
  // refused at the engine's intake; 500: the workers refused it).
  int error_status = 0;
  std::string kv_transfer_params;  // the KV connector's handoff (JSON), on the finished output
  int engine_index = 0;  // the data-parallel engine that produced it (on the finished output)
};

using OutputCallback = std::function<void(const RequestOutput&)>;

class EngineClient {
 public:
  virtual ~EngineClient() = default;
  // Outputs arrive through `callback` in order, the last with `finished` set (finish_reason
  // abort and `error` when the engine fails). It runs on an engine thread: it must not block.
  virtual void add_request(EngineRequest request, OutputCallback callback) = 0;
  // Unknown or finished ids are ignored.
  virtual void abort_request(const std::string& request_id) = 0;
  virtual MetricsSnapshot metrics() const = 0;
  // Every engine's metrics (one entry unless a data-parallel client fronts several engines).
  virtual std::vector<EngineMetrics> engine_metrics() const { return {{0, metrics()}}; }
  // False once the engine has failed (e.g. a pipeline stage died); it then takes no more work.
  virtual bool is_healthy() const = 0;
  // A request that carried kv_transfer_params was refused before it reached the engine: the
  // connector lets the remote side go (a decoder tells the prefiller to free the blocks).
  virtual void release_kv_transfer(const std::string& kv_transfer_params) = 0;
};

}  // namespace engine
