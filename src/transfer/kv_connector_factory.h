// The KV connector named by --kv-transfer-config's kv_connector, both sides. Errors name the
// connector and the field at fault.
#pragma once

#include <memory>

#include "common/status.h"
#include "model/config.h"
#include "sched/kv_connector.h"
#include "transfer/kv_transfer_config.h"
#include "worker/kv_connector.h"

namespace transfer {

// Where this instance sits: its data-parallel rank and pipeline layout (for the pull
// connector's side-channel ports).
struct ConnectorPlacement {
  int dp_rank = 0;
  int pp_size = 1;
  int tp_size = 1;
  int block_size = 16;
};

// The scheduler side, for a model with `model` dims.
common::Result<std::shared_ptr<sched::KvConnectorScheduler>> make_scheduler_connector(
    const KvTransferConfig& config, const model::ModelConfig& model,
    const ConnectorPlacement& placement);
// The worker side (one per stage process) of pipeline stage pp_rank.
common::Result<std::shared_ptr<worker::KvConnectorWorker>> make_worker_connector(
    const KvTransferConfig& config, const ConnectorPlacement& placement, int pp_rank);

}  // namespace transfer
