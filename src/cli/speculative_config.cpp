// --speculative-config parsing with vLLM's field names and checks.
#include "cli/speculative_config.h"

#include <nlohmann/json.hpp>

namespace cli {
namespace {

common::Status bad(const std::string& why) {
  return common::invalid_argument("--speculative-config: " + why);
}

}  // namespace

common::Result<SpeculativeConfig> parse_speculative_config(const std::string& json_text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    return bad(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return bad("expected a JSON object");
  SpeculativeConfig c;
  for (const auto& [key, value] : j.items()) {
    if (key == "method") {
      if (!value.is_string()) return bad("method must be a string");
      c.method = value.get<std::string>();
    } else if (key == "num_speculative_tokens") {
      if (!value.is_number_integer()) return bad("num_speculative_tokens must be an integer");
      const int64_t k = value.get<int64_t>();
      // vLLM: "Expected num_speculative_tokens to be greater than zero".
      if (k <= 0)
        return bad("num_speculative_tokens must be greater than zero, got " + std::to_string(k));
      if (k > 16) return bad("num_speculative_tokens " + std::to_string(k) + " is above 16");
      c.num_speculative_tokens = static_cast<int>(k);
    } else if (key == "model") {
      // MTP drafts with the target's own layers: the draft model is the target.
      if (!value.is_null() && !value.is_string()) return bad("model must be a string");
    } else if (key == "draft_tensor_parallel_size") {
      if (!value.is_null() && (!value.is_number_integer() || value.get<int64_t>() < 1))
        return bad("draft_tensor_parallel_size must be a positive integer");
    } else if (key == "disable_padded_drafter_batch" || key == "enforce_eager") {
      if (!value.is_boolean()) return bad(key + " must be a boolean");
    } else {
      return bad("unknown field '" + key +
                 "' (chunkpipe reads method, num_speculative_tokens, model, "
                 "draft_tensor_parallel_size, disable_padded_drafter_batch, enforce_eager)");
    }
  }
  if (c.method.empty()) return bad("method is required (\"mtp\")");
  if (c.method == "deepseek_mtp") c.method = "mtp";
  if (c.method != "mtp")
    return bad("method '" + c.method +
               "' is not supported; chunkpipe drafts with the checkpoint's MTP layers "
               "(\"mtp\" or \"deepseek_mtp\")");
  return c;
}

common::Result<std::string> check_speculative_model(SpeculativeConfig* c,
                                                    const model::ModelConfig& m) {
  if (!m.model_type.empty() && m.model_type != "deepseek_v3")
    return bad("MTP speculative decoding needs a DeepSeek-V3 model; model_type is '" +
               m.model_type + "'");
  const int n_predict = m.num_nextn_predict_layers;
  if (n_predict <= 0)
    return bad("method mtp needs MTP layers, but the model's num_nextn_predict_layers is 0");
  if (c->num_speculative_tokens == 0) c->num_speculative_tokens = n_predict;
  const int k = c->num_speculative_tokens;
  // vLLM: k above n_predict must be a multiple of it (the layers are reused in turn).
  if (k > n_predict && k % n_predict != 0)
    return bad("num_speculative_tokens " + std::to_string(k) +
               " must be divisible by num_nextn_predict_layers " + std::to_string(n_predict));
  if (k > n_predict)
    return std::string("MTP: num_speculative_tokens ") + std::to_string(k) + " > " +
           std::to_string(n_predict) +
           " MTP layers: each layer runs more than once per step, which may lower acceptance";
  return std::string();
}

}  // namespace cli
