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

// The scheduler side, for a model with `model` dims and KV blocks of block_size tokens.
common::Result<std::shared_ptr<sched::KvConnectorScheduler>> make_scheduler_connector(
    const KvTransferConfig& config, const model::ModelConfig& model, int block_size);
// The worker side (one per stage process).
common::Result<std::shared_ptr<worker::KvConnectorWorker>> make_worker_connector(
    const KvTransferConfig& config);

}  // namespace transfer
