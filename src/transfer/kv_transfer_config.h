// KvTransferConfig: --kv-transfer-config as vLLM reads it (its KVTransferConfig fields:
// kv_connector, kv_role, kv_port, engine_id, kv_connector_extra_config). Parsing names the field
// at fault. Plain data.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace transfer {

struct KvTransferConfig {
  std::string kv_connector;
  std::string kv_role;    // kv_producer, kv_consumer or kv_both
  std::string kv_port;    // JSON string or integer
  std::string engine_id;  // empty: one is made up
  nlohmann::json kv_connector_extra_config = nlohmann::json::object();
};

common::Result<KvTransferConfig> parse_kv_transfer_config(const std::string& text);

}  // namespace transfer
