// --kv-transfer-config parsing and field checks.
#include "transfer/kv_transfer_config.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <random>

namespace transfer {

namespace {

common::Status bad_field(const std::string& why) {
  return common::invalid_argument("--kv-transfer-config: " + why);
}

std::string random_engine_id() {
  std::random_device rd;
  std::mt19937_64 rng((uint64_t(rd()) << 32) ^ rd());
  char id[33];
  std::snprintf(id, sizeof(id), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return id;
}

// {"dp_size": N, "tp_size": N, "pp_size"?: N, "pp_layer_partition"?: "a,b"}.
common::Result<InstanceLayout> parse_layout(const nlohmann::json& j, const std::string& side) {
  const std::string where = "'kv_connector_extra_config." + side;
  if (!j.is_object()) return bad_field(where + "' must be an object");
  InstanceLayout l;
  auto size = [&](const char* key, int* out, bool required) -> common::Status {
    if (!j.contains(key)) {
      return required ? bad_field(where + "." + key + "' is required") : common::Status{};
    }
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1 || j[key].get<int64_t>() > 4096)
      return bad_field(where + "." + key + "' must be a positive integer");
    *out = static_cast<int>(j[key].get<int64_t>());
    return {};
  };
  CP_RETURN_IF_ERROR(size("dp_size", &l.dp_size, true));
  CP_RETURN_IF_ERROR(size("tp_size", &l.tp_size, true));
  CP_RETURN_IF_ERROR(size("pp_size", &l.pp_size, false));
  if (j.contains("pp_layer_partition") && !j["pp_layer_partition"].is_null()) {
    const auto& v = j["pp_layer_partition"];
    const std::string bad_partition =
        where +
        ".pp_layer_partition' must list one positive layer count per pipeline stage, "
        "e.g. \"31,30\"";
    if (!v.is_string()) return bad_field(bad_partition);
    const std::string text = v.get<std::string>();
    size_t start = 0;
    while (start <= text.size()) {
      const size_t comma = std::min(text.find(',', start), text.size());
      const std::string item = text.substr(start, comma - start);
      int n = 0;
      const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
      if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || n < 1)
        return bad_field(bad_partition);
      l.pp_layer_partition.push_back(n);
      start = comma + 1;
    }
    if (static_cast<int>(l.pp_layer_partition.size()) != l.pp_size)
      return bad_field(where + ".pp_layer_partition' has " +
                       std::to_string(l.pp_layer_partition.size()) + " entries for pp_size " +
                       std::to_string(l.pp_size));
  }
  return l;
}

}  // namespace

common::Result<KvTransferConfig> parse_kv_transfer_config(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [](const std::string& why) {
    return common::invalid_argument("--kv-transfer-config: " + why);
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  KvTransferConfig c;
  auto string_field = [&](const char* key, std::string* out, bool required) -> common::Status {
    if (!j.contains(key) || j[key].is_null()) {
      return required ? bad(std::string("'") + key + "' is required") : common::Status{};
    }
    if (!j[key].is_string()) return bad(std::string("'") + key + "' must be a string");
    *out = j[key].get<std::string>();
    return {};
  };
  CP_RETURN_IF_ERROR(string_field("kv_connector", &c.kv_connector, true));
  CP_RETURN_IF_ERROR(string_field("kv_role", &c.kv_role, true));
  CP_RETURN_IF_ERROR(string_field("engine_id", &c.engine_id, false));
  if (c.kv_role != "kv_producer" && c.kv_role != "kv_consumer" && c.kv_role != "kv_both")
    return bad("'kv_role' must be one of kv_producer, kv_consumer, kv_both, got '" + c.kv_role +
               "'");
  if (j.contains("kv_port") && !j["kv_port"].is_null()) {
    const auto& p = j["kv_port"];
    if (p.is_string()) {
      c.kv_port = p.get<std::string>();
    } else if (p.is_number_unsigned() && p.get<uint64_t>() < 65536) {
      c.kv_port = std::to_string(p.get<uint64_t>());
    } else {
      return bad("'kv_port' must be a port number (a string or an integer)");
    }
  }
  if (c.engine_id.empty()) c.engine_id = random_engine_id();
  CP_RETURN_IF_ERROR(string_field("kv_load_failure_policy", &c.kv_load_failure_policy, false));
  if (c.kv_load_failure_policy != "fail" && c.kv_load_failure_policy != "recompute")
    return bad("'kv_load_failure_policy' must be 'fail' or 'recompute', got '" +
               c.kv_load_failure_policy + "'");
  if (j.contains("kv_connector_extra_config") && !j["kv_connector_extra_config"].is_null()) {
    if (!j["kv_connector_extra_config"].is_object())
      return bad("'kv_connector_extra_config' must be an object");
    c.kv_connector_extra_config = j["kv_connector_extra_config"];
  }
  const nlohmann::json& extra = c.kv_connector_extra_config;
  for (const char* side : {"prefill", "decode"}) {
    if (!extra.contains(side)) continue;
    CP_ASSIGN_OR_RETURN(InstanceLayout layout, parse_layout(extra[side], side));
    (std::string(side) == "prefill" ? c.prefill : c.decode) = std::move(layout);
  }
  if (c.kv_connector == kMooncakeConnector) {
    if (!c.prefill || !c.decode)
      return bad(
          "MooncakeConnectorV1 needs 'kv_connector_extra_config.prefill' and '.decode', "
          "each with 'dp_size' and 'tp_size'");
    if (c.decode->pp_size != 1) return bad("'kv_connector_extra_config.decode.pp_size' must be 1");
    if (c.prefill->tp_size < c.decode->tp_size)
      return bad("'kv_connector_extra_config.prefill.tp_size' (" +
                 std::to_string(c.prefill->tp_size) + ") must not be smaller than decode's (" +
                 std::to_string(c.decode->tp_size) + ")");
  }
  return c;
}

}  // namespace transfer
