// Parsing of quant_model_description.json and the type lookup the weight loader uses.
#include "model/quant_description.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace model {

using common::Result;

Result<QuantType> QuantDescription::type_of(const std::string& tensor) const {
  const auto it = types.find(tensor);
  if (it == types.end()) {
    return common::invalid_argument(path + ": tensor '" + tensor +
                                    "' is in the checkpoint but has no quantization type");
  }
  const std::string& t = it->second;
  if (t == "FLOAT") return QuantType::kFloat;
  if (t == "W8A8") return QuantType::kW8A8;
  if (t == "W8A8_DYNAMIC") return QuantType::kW8A8Dynamic;
  if (t == "W8A8_MIX") return QuantType::kW8A8Mix;
  if (t == "W4A8_DYNAMIC") return QuantType::kW4A8Dynamic;
  return common::invalid_argument(path + ": tensor '" + tensor + "' has quantization type '" + t +
                                  "'; chunkpipe loads FLOAT, W8A8, W8A8_DYNAMIC, W8A8_MIX and "
                                  "W4A8_DYNAMIC");
}

Result<QuantDescription> parse_quant_description(const std::string& text, const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return common::invalid_argument(path + ": not a JSON object");
  }
  QuantDescription d;
  d.path = path;
  for (const char* key : {"kv_cache_type", "kv_quant_type", "fa_quant_type"}) {
    if (j.contains(key) && j[key].is_string()) {
      return common::unimplemented(path + ": " + key + " '" + j[key].get<std::string>() +
                                   "' (a quantized KV cache or attention) is not supported on "
                                   "CPU; quantize the weights only");
    }
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "is_rot_used" && it.value().is_boolean())
      d.is_rot_used = it.value().get<bool>();
    if (!it.value().is_string()) continue;
    if (it.key() == "model_quant_type") d.model_quant_type = it.value().get<std::string>();
    d.types[it.key()] = it.value().get<std::string>();
  }
  return d;
}

Result<std::optional<QuantDescription>> load_quant_description(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / kQuantDescriptionFile;
  if (!std::filesystem::exists(path)) return std::optional<QuantDescription>();
  std::ifstream in(path);
  if (!in) return common::not_found(path.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  CP_ASSIGN_OR_RETURN(QuantDescription d, parse_quant_description(ss.str(), path.string()));
  return std::optional<QuantDescription>(std::move(d));
}

}  // namespace model
