// KvTransferConfig: --kv-transfer-config as vLLM and vllm-ascend read it (KVTransferConfig:
// kv_connector, kv_role, kv_port, engine_id, kv_load_failure_policy, kv_connector_extra_config
// with the prefill / decode layouts MooncakeConnectorV1 requires). Parsing checks every field
// and names the one at fault. Plain data.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace transfer {

// kv_connector_extra_config.prefill / .decode: how the P and D instances are laid out.
struct InstanceLayout {
  int dp_size = 1;
  int tp_size = 1;
  int pp_size = 1;
  std::vector<int> pp_layer_partition;  // "31,30": decoder layers per P stage (empty: even)
};

struct KvTransferConfig {
  std::string kv_connector;
  std::string kv_role;                          // kv_producer, kv_consumer or kv_both
  std::string kv_port = "14579";                // JSON string or integer (vLLM's default)
  std::string engine_id;                        // empty in the JSON: a random one is made up
  std::string kv_load_failure_policy = "fail";  // or "recompute"
  nlohmann::json kv_connector_extra_config = nlohmann::json::object();
  // Required by MooncakeConnectorV1 (vllm-ascend asserts both blocks, with tp_size and dp_size).
  std::optional<InstanceLayout> prefill, decode;

  bool is_producer() const { return kv_role == "kv_producer" || kv_role == "kv_both"; }
  bool is_consumer() const { return kv_role == "kv_consumer" || kv_role == "kv_both"; }
};

// The pull connector's name in chunkpipe for vllm-ascend's MooncakeConnectorV1.
inline constexpr const char* kMooncakeConnector = "MooncakeConnectorV1";

common::Result<KvTransferConfig> parse_kv_transfer_config(const std::string& text);

}  // namespace transfer
