// Connector names -> implementations.
#include "transfer/kv_connector_factory.h"

#include "transfer/shared_storage_connector.h"

namespace transfer {
namespace {

common::Result<std::string> storage_path(const KvTransferConfig& c) {
  const auto& extra = c.kv_connector_extra_config;
  if (!extra.contains("shared_storage_path")) return std::string("/tmp");  // vLLM's default
  if (!extra["shared_storage_path"].is_string() ||
      extra["shared_storage_path"].get<std::string>().empty())
    return common::invalid_argument(
        "--kv-transfer-config: 'kv_connector_extra_config.shared_storage_path' must be a "
        "non-empty string");
  return extra["shared_storage_path"].get<std::string>();
}

common::Status unknown(const KvTransferConfig& c) {
  return common::invalid_argument("--kv-transfer-config: kv_connector '" + c.kv_connector +
                                  "' is not available; chunkpipe has SharedStorageConnector");
}

}  // namespace

common::Result<std::shared_ptr<sched::KvConnectorScheduler>> make_scheduler_connector(
    const KvTransferConfig& config, const model::ModelConfig& model, int block_size) {
  if (config.kv_connector != "SharedStorageConnector") return unknown(config);
  SharedStorageOptions o;
  CP_ASSIGN_OR_RETURN(o.path, storage_path(config));
  o.block_size = block_size;
  o.num_layers = static_cast<int>(model.num_hidden_layers);
  o.row_dim = model.kv_cache_row_dim();
  return std::shared_ptr<sched::KvConnectorScheduler>(
      std::make_shared<SharedStorageScheduler>(std::move(o)));
}

common::Result<std::shared_ptr<worker::KvConnectorWorker>> make_worker_connector(
    const KvTransferConfig& config) {
  if (config.kv_connector != "SharedStorageConnector") return unknown(config);
  SharedStorageOptions o;
  CP_ASSIGN_OR_RETURN(o.path, storage_path(config));
  return std::shared_ptr<worker::KvConnectorWorker>(
      std::make_shared<SharedStorageWorker>(std::move(o)));
}

}  // namespace transfer
