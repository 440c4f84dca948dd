// --kv-transfer-config parsing and field checks.
#include "transfer/kv_transfer_config.h"

namespace transfer {

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
  if (j.contains("kv_connector_extra_config") && !j["kv_connector_extra_config"].is_null()) {
    if (!j["kv_connector_extra_config"].is_object())
      return bad("'kv_connector_extra_config' must be an object");
    c.kv_connector_extra_config = j["kv_connector_extra_config"];
  }
  return c;
}

}  // namespace transfer
