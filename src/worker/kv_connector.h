// KvConnectorWorker: a worker's side of a KV connector (vLLM's KVConnectorBase_V1, worker
// role), one per stage process. Around each forward: start_load_kv before it,
// wait_for_layer_load / save_kv_layer around each of the worker's layers, wait_for_save after
// it, then get_finished. The step's metadata is what the scheduler side built for it; a step
// with nothing scheduled (SchedulerOutput::kv_connector_poll) runs only start_load_kv and
// get_finished. Called by the worker's one compute thread.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "model/kv_cache.h"
#include "sched/scheduler_output.h"

namespace worker {

using FinishedTransfers = sched::KvTransferReport;

class KvConnectorWorker {
 public:
  virtual ~KvConnectorWorker() = default;

  // The paged cache the connector reads and writes, for layers [layer_begin, layer_end).
  virtual void register_kv_cache(model::LatentKvCache* cache, int layer_begin, int layer_end) = 0;
  // After register_kv_cache: whether the connector could start (bind its ports, register
  // memory); the worker refuses to run otherwise.
  virtual common::Status init_status() const { return {}; }
  // A failure refuses the step (no request may decode on KV that did not arrive).
  virtual common::Status start_load_kv(const std::vector<uint8_t>& metadata) = 0;
  virtual void wait_for_layer_load(int layer) = 0;
  // After `layer` has written this step's KV.
  virtual common::Status save_kv_layer(int layer) = 0;
  virtual common::Status wait_for_save() = 0;
  // Transfers that completed since the last call; `finished_req_ids` left the scheduler.
  virtual FinishedTransfers get_finished(const std::vector<std::string>& finished_req_ids) = 0;
};

}  // namespace worker
