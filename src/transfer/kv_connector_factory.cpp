// Connector names -> implementations, and the pull connector's options from the config and
// the environment (VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, ASCEND_TRANSFER_TIMEOUT).
#include "transfer/kv_connector_factory.h"

#include <charconv>
#include <cstdlib>

#include "dist/host_ip.h"
#include "transfer/pull_connector.h"
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
                                  "' is not available; chunkpipe has SharedStorageConnector and " +
                                  kMooncakeConnector);
}

// A positive number from the environment, or `fallback` when unset.
common::Result<double> env_number(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  double x = 0;
  const auto [end, ec] = std::from_chars(v, v + std::char_traits<char>::length(v), x);
  if (ec != std::errc() || *end != '\0' || !(x > 0))
    return common::invalid_argument(std::string(name) + " must be a positive number, got '" + v +
                                    "'");
  return x;
}

common::Result<PullOptions> pull_options(const KvTransferConfig& c, const ConnectorPlacement& at) {
  PullOptions o;
  o.producer = c.is_producer();
  o.consumer = c.is_consumer();
  o.engine_id = c.engine_id;
  o.host = dist::host_ip();
  int port = 0;
  const auto [end, ec] =
      std::from_chars(c.kv_port.data(), c.kv_port.data() + c.kv_port.size(), port);
  if (ec != std::errc() || end != c.kv_port.data() + c.kv_port.size() || port < 1 || port > 65535)
    return common::invalid_argument("--kv-transfer-config: 'kv_port' must be a port number, got '" +
                                    c.kv_port + "'");
  o.side_channel_port = port + at.dp_rank * at.tp_size * at.pp_size;
  if (o.side_channel_port + at.tp_size * at.pp_size - 1 > 65535)
    return common::invalid_argument("--kv-transfer-config: 'kv_port' " + c.kv_port +
                                    " leaves no room for this rank's side-channel ports");
  o.tp_size = at.tp_size;
  o.pp_size = at.pp_size;
  if (c.prefill) {
    o.remote_tp_size = c.prefill->tp_size;
    o.remote_pp_size = c.prefill->pp_size;
  }
  o.block_size = at.block_size;
  CP_ASSIGN_OR_RETURN(o.lease_seconds, env_number("VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT", 480));
  CP_ASSIGN_OR_RETURN(const double ms, env_number("ASCEND_TRANSFER_TIMEOUT", 33064));
  o.transfer_timeout_ms = static_cast<int64_t>(ms);
  return o;
}

}  // namespace

common::Result<std::shared_ptr<sched::KvConnectorScheduler>> make_scheduler_connector(
    const KvTransferConfig& config, const model::ModelConfig& model,
    const ConnectorPlacement& placement) {
  if (config.kv_connector == kMooncakeConnector) {
    CP_ASSIGN_OR_RETURN(PullOptions o, pull_options(config, placement));
    return std::shared_ptr<sched::KvConnectorScheduler>(
        std::make_shared<PullScheduler>(std::move(o)));
  }
  if (config.kv_connector != "SharedStorageConnector") return unknown(config);
  SharedStorageOptions o;
  CP_ASSIGN_OR_RETURN(o.path, storage_path(config));
  o.block_size = placement.block_size;
  o.num_layers = static_cast<int>(model.num_hidden_layers);
  o.row_dim = model.kv_cache_row_dim();
  return std::shared_ptr<sched::KvConnectorScheduler>(
      std::make_shared<SharedStorageScheduler>(std::move(o)));
}

common::Result<std::shared_ptr<worker::KvConnectorWorker>> make_worker_connector(
    const KvTransferConfig& config, const ConnectorPlacement& placement, int pp_rank) {
  if (config.kv_connector == kMooncakeConnector) {
    CP_ASSIGN_OR_RETURN(PullOptions o, pull_options(config, placement));
    return std::shared_ptr<worker::KvConnectorWorker>(
        std::make_shared<PullWorker>(std::move(o), pp_rank));
  }
  if (config.kv_connector != "SharedStorageConnector") return unknown(config);
  SharedStorageOptions o;
  CP_ASSIGN_OR_RETURN(o.path, storage_path(config));
  return std::shared_ptr<worker::KvConnectorWorker>(
      std::make_shared<SharedStorageWorker>(std::move(o)));
}

}  // namespace transfer
