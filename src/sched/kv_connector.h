// KvConnectorScheduler: the scheduler's side of a KV connector (vLLM's KVConnectorBase_V1,
// scheduler role), which lets a request's KV come from outside this engine (another engine, a
// store) and lets finished requests hand theirs over. One instance, called by the scheduler
// thread. The worker side is worker/kv_connector.h; implementations live in src/transfer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/request.h"
#include "sched/scheduler_output.h"

namespace sched {

struct MatchedTokens {
  int64_t num_tokens = 0;   // tokens past num_computed_tokens the connector can provide
  bool load_async = false;  // true: they arrive over later steps (never with num_tokens 0)
  // With num_tokens 0: a request whose prompt KV the connector loaded and which this one
  // shares (another choice of the same request), for when the prefix cache did not find it.
  std::string share_from;
};

struct FinishedHandoff {
  // True: the connector owns the blocks until the request's id comes back in finished_sending;
  // the scheduler frees them only then.
  bool delay_free = false;
  std::string kv_transfer_params;  // JSON for the client's response; empty for none
};

class KvConnectorScheduler {
 public:
  virtual ~KvConnectorScheduler() = default;

  // A request entered the scheduler; request_finished follows exactly once.
  virtual void request_added(const Request& /*request*/) {}
  // For a waiting request with num_computed_tokens local (prefix-cache) tokens: how many more
  // the connector can load. May be called more than once per request; nullopt = ask again later
  // (the requests behind it may start first).
  virtual std::optional<MatchedTokens> get_num_new_matched_tokens(const Request& request,
                                                                  int64_t num_computed_tokens) = 0;
  // After the request's blocks were allocated: num_external_tokens of them will be loaded.
  virtual void update_state_after_alloc(const Request& request,
                                        const std::vector<kv::BlockId>& block_ids,
                                        int64_t num_external_tokens) = 0;
  // Once per step: what the workers' connectors must load and save during it (opaque bytes
  // carried in SchedulerOutput::kv_connector_metadata). Must not change `output`.
  virtual std::vector<uint8_t> build_connector_meta(const SchedulerOutput& output,
                                                    const kv::KvCacheManager& kv) = 0;
  // Once per step, before the scheduler acts on it: which loads and sends the workers finished
  // (vLLM's update_connector_output).
  virtual void update_connector_output(const KvTransferReport& /*report*/) {}
  // Exactly once per request, before its blocks are freed.
  virtual FinishedHandoff request_finished(const Request& request,
                                           const std::vector<kv::BlockId>& block_ids) = 0;
  // A request with these kv_transfer_params (JSON text) was refused before the scheduler saw
  // it: let the remote side go. Thread-safe, unlike the rest (called by API threads).
  virtual void release_unscheduled(const std::string& /*kv_transfer_params*/) {}
};

}  // namespace sched
