// config.json parsing with nlohmann::json; every rejection names the field and the value.
#include "model/config.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace model {
namespace {

using common::Result;
using common::Status;
using nlohmann::json;

class FieldReader {
 public:
  FieldReader(const json& object, std::string source, std::string prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  Status error(const std::string& key, const std::string& what) const {
    std::string shown =
        object_.contains(key)
            ? object_[key].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
            : "missing";
    return common::invalid_argument(source_ + ": field '" + prefix_ + key + "' " + what + " (got " +
                                    shown + ")");
  }

  template <typename T>
  Status integer(const std::string& key, T* out, bool required, int64_t min_value) const {
    if (!object_.contains(key) || object_[key].is_null()) {
      return required ? error(key, "is required") : Status();
    }
    const json& v = object_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < min_value) {
      return error(key, "must be an integer >= " + std::to_string(min_value));
    }
    *out = static_cast<T>(v.get<int64_t>());
    return {};
  }

  Status number(const std::string& key, double* out, bool required) const {
    if (!object_.contains(key) || object_[key].is_null()) {
      return required ? error(key, "is required") : Status();
    }
    if (!object_[key].is_number()) return error(key, "must be a number");
    *out = object_[key].get<double>();
    return {};
  }

  Status boolean(const std::string& key, bool* out) const {
    if (!object_.contains(key) || object_[key].is_null()) return {};
    if (!object_[key].is_boolean()) return error(key, "must be true or false");
    *out = object_[key].get<bool>();
    return {};
  }

  Status string(const std::string& key, std::string* out) const {
    if (!object_.contains(key) || object_[key].is_null()) return {};
    if (!object_[key].is_string()) return error(key, "must be a string");
    *out = object_[key].get<std::string>();
    return {};
  }

 private:
  const json& object_;
  std::string source_;
  std::string prefix_;
};

Status parse_rope_scaling(const json& root, const std::string& source, ModelConfig* c) {
  if (!root.contains("rope_scaling") || root["rope_scaling"].is_null()) return {};
  const json& rs = root["rope_scaling"];
  FieldReader top(root, source, "");
  if (!rs.is_object()) return top.error("rope_scaling", "must be an object or null");
  FieldReader r(rs, source, "rope_scaling.");
  std::string type;
  CP_RETURN_IF_ERROR(r.string("rope_type", &type));
  if (type.empty()) CP_RETURN_IF_ERROR(r.string("type", &type));
  if (type != "yarn") {
    return r.error(rs.contains("rope_type") ? "rope_type" : "type",
                   "must be \"yarn\" (the only rope scaling DeepSeek-V3 uses)");
  }
  kernels::YarnConfig& y = c->yarn;
  y.enabled = true;
  CP_RETURN_IF_ERROR(r.number("factor", &y.factor, true));
  if (y.factor <= 0) return r.error("factor", "must be positive");
  CP_RETURN_IF_ERROR(
      r.integer("original_max_position_embeddings", &y.original_max_position_embeddings, false, 1));
  CP_RETURN_IF_ERROR(r.number("beta_fast", &y.beta_fast, false));
  CP_RETURN_IF_ERROR(r.number("beta_slow", &y.beta_slow, false));
  CP_RETURN_IF_ERROR(r.number("mscale", &y.mscale, false));
  CP_RETURN_IF_ERROR(r.number("mscale_all_dim", &y.mscale_all_dim, false));
  return {};
}

Status parse_quantization(const json& root, const std::string& source, ModelConfig* c) {
  if (!root.contains("quantization_config") || root["quantization_config"].is_null()) return {};
  const json& qc = root["quantization_config"];
  if (!qc.is_object()) {
    return FieldReader(root, source, "").error("quantization_config", "must be an object");
  }
  FieldReader r(qc, source, "quantization_config.");
  QuantizationConfig q;
  CP_RETURN_IF_ERROR(r.string("quant_method", &q.quant_method));
  CP_RETURN_IF_ERROR(r.string("fmt", &q.fmt));
  CP_RETURN_IF_ERROR(r.string("activation_scheme", &q.activation_scheme));
  CP_RETURN_IF_ERROR(r.string("scale_fmt", &q.scale_fmt));
  if (q.quant_method != "fp8") {
    return r.error("quant_method", "must be \"fp8\" (block-scaled FP8 checkpoints)");
  }
  if (!q.fmt.empty() && q.fmt != "e4m3") return r.error("fmt", "must be \"e4m3\"");
  if (!q.scale_fmt.empty() && q.scale_fmt != "ue8m0")
    return r.error("scale_fmt", "must be \"ue8m0\"");
  if (qc.contains("weight_block_size")) {
    const json& b = qc["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
        b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0) {
      return r.error("weight_block_size", "must be two positive integers");
    }
    q.weight_block_rows = b[0].get<int64_t>();
    q.weight_block_cols = b[1].get<int64_t>();
  }
  c->quantization = q;
  return {};
}

Status parse_fields(const json& root, const std::string& source, ModelConfig* c) {
  FieldReader r(root, source, "");
  if (root.contains("architectures")) {
    if (!root["architectures"].is_array()) return r.error("architectures", "must be a list");
    for (const json& a : root["architectures"]) {
      if (!a.is_string()) return r.error("architectures", "must be a list of strings");
      c->architectures.push_back(a.get<std::string>());
    }
  }
  CP_RETURN_IF_ERROR(r.string("model_type", &c->model_type));
  if (!c->model_type.empty() && c->model_type != "deepseek_v3" && c->model_type != "deepseek_v2") {
    return r.error("model_type", "must be \"deepseek_v3\"");
  }
  CP_RETURN_IF_ERROR(r.integer("vocab_size", &c->vocab_size, true, 1));
  CP_RETURN_IF_ERROR(r.integer("hidden_size", &c->hidden_size, true, 1));
  CP_RETURN_IF_ERROR(r.integer("intermediate_size", &c->intermediate_size, true, 1));
  CP_RETURN_IF_ERROR(r.integer("num_hidden_layers", &c->num_hidden_layers, true, 1));
  CP_RETURN_IF_ERROR(r.integer("num_nextn_predict_layers", &c->num_nextn_predict_layers, false, 0));
  CP_RETURN_IF_ERROR(r.integer("num_attention_heads", &c->num_attention_heads, true, 1));
  c->num_key_value_heads = c->num_attention_heads;
  CP_RETURN_IF_ERROR(r.integer("num_key_value_heads", &c->num_key_value_heads, false, 1));
  if (root.contains("q_lora_rank") && !root["q_lora_rank"].is_null()) {
    int64_t rank = 0;
    CP_RETURN_IF_ERROR(r.integer("q_lora_rank", &rank, true, 1));
    c->q_lora_rank = rank;
  }
  CP_RETURN_IF_ERROR(r.integer("kv_lora_rank", &c->kv_lora_rank, true, 1));
  CP_RETURN_IF_ERROR(r.integer("qk_nope_head_dim", &c->qk_nope_head_dim, true, 1));
  CP_RETURN_IF_ERROR(r.integer("qk_rope_head_dim", &c->qk_rope_head_dim, true, 2));
  if (c->qk_rope_head_dim % 2 != 0) return r.error("qk_rope_head_dim", "must be even");
  CP_RETURN_IF_ERROR(r.integer("v_head_dim", &c->v_head_dim, true, 1));
  CP_RETURN_IF_ERROR(r.integer("n_routed_experts", &c->n_routed_experts, false, 1));
  if (c->n_routed_experts > 0) {
    CP_RETURN_IF_ERROR(r.integer("moe_intermediate_size", &c->moe_intermediate_size, true, 1));
    CP_RETURN_IF_ERROR(r.integer("num_experts_per_tok", &c->num_experts_per_tok, true, 1));
    if (c->num_experts_per_tok > c->n_routed_experts) {
      return r.error("num_experts_per_tok", "must not exceed n_routed_experts");
    }
  }
  CP_RETURN_IF_ERROR(r.integer("n_shared_experts", &c->n_shared_experts, false, 0));
  CP_RETURN_IF_ERROR(r.integer("n_group", &c->n_group, false, 1));
  CP_RETURN_IF_ERROR(r.integer("topk_group", &c->topk_group, false, 1));
  if (c->n_routed_experts > 0 && c->n_routed_experts % c->n_group != 0) {
    return r.error("n_group", "must divide n_routed_experts");
  }
  if (c->topk_group > c->n_group) return r.error("topk_group", "must not exceed n_group");
  CP_RETURN_IF_ERROR(r.number("routed_scaling_factor", &c->routed_scaling_factor, false));
  std::string scoring = "softmax", method = "greedy";
  CP_RETURN_IF_ERROR(r.string("scoring_func", &scoring));
  if (scoring == "sigmoid") {
    c->scoring_func = kernels::ScoringFunc::kSigmoid;
  } else if (scoring == "softmax") {
    c->scoring_func = kernels::ScoringFunc::kSoftmax;
  } else {
    return r.error("scoring_func", "must be \"sigmoid\" or \"softmax\"");
  }
  CP_RETURN_IF_ERROR(r.string("topk_method", &method));
  if (method == "noaux_tc") {
    c->topk_method = kernels::TopkMethod::kNoauxTc;
  } else if (method == "greedy") {
    c->topk_method = kernels::TopkMethod::kGreedy;
  } else if (method == "group_limited_greedy") {
    c->topk_method = kernels::TopkMethod::kGroupLimitedGreedy;
  } else {
    return r.error("topk_method", "must be \"noaux_tc\", \"greedy\" or \"group_limited_greedy\"");
  }
  if (c->topk_method != kernels::TopkMethod::kGreedy && c->n_routed_experts > 0 &&
      c->topk_group * (c->n_routed_experts / c->n_group) < c->num_experts_per_tok) {
    return r.error("topk_group", "keeps fewer experts than num_experts_per_tok");
  }
  CP_RETURN_IF_ERROR(r.boolean("norm_topk_prob", &c->norm_topk_prob));
  CP_RETURN_IF_ERROR(r.integer("first_k_dense_replace", &c->first_k_dense_replace, false, 0));
  CP_RETURN_IF_ERROR(r.integer("moe_layer_freq", &c->moe_layer_freq, false, 1));
  CP_RETURN_IF_ERROR(r.number("rms_norm_eps", &c->rms_norm_eps, false));
  if (c->rms_norm_eps <= 0) return r.error("rms_norm_eps", "must be positive");
  CP_RETURN_IF_ERROR(r.number("rope_theta", &c->rope_theta, false));
  if (c->rope_theta <= 1) return r.error("rope_theta", "must be greater than 1");
  CP_RETURN_IF_ERROR(parse_rope_scaling(root, source, c));
  CP_RETURN_IF_ERROR(r.integer("max_position_embeddings", &c->max_position_embeddings, false, 1));
  CP_RETURN_IF_ERROR(r.string("hidden_act", &c->hidden_act));
  if (c->hidden_act != "silu") return r.error("hidden_act", "must be \"silu\"");
  CP_RETURN_IF_ERROR(r.boolean("attention_bias", &c->attention_bias));
  if (c->attention_bias) return r.error("attention_bias", "must be false (DeepSeek-V3 has none)");
  CP_RETURN_IF_ERROR(r.boolean("tie_word_embeddings", &c->tie_word_embeddings));
  if (c->tie_word_embeddings) return r.error("tie_word_embeddings", "must be false");
  CP_RETURN_IF_ERROR(r.integer("bos_token_id", &c->bos_token_id, false, 0));
  CP_RETURN_IF_ERROR(r.integer("eos_token_id", &c->eos_token_id, false, 0));
  CP_RETURN_IF_ERROR(r.string("torch_dtype", &c->torch_dtype));
  CP_RETURN_IF_ERROR(parse_quantization(root, source, c));
  return {};
}

}  // namespace

kernels::RouterParams ModelConfig::router_params() const {
  kernels::RouterParams p;
  p.num_experts = n_routed_experts;
  p.top_k = num_experts_per_tok;
  p.num_groups = n_group;
  p.topk_groups = topk_group;
  p.normalize = norm_topk_prob;
  p.routed_scaling_factor = static_cast<float>(routed_scaling_factor);
  p.scoring = scoring_func;
  p.method = topk_method;
  return p;
}

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return common::invalid_argument(source + ": not valid JSON");
  if (!root.is_object()) return common::invalid_argument(source + ": must hold a JSON object");
  ModelConfig config;
  CP_RETURN_IF_ERROR(parse_fields(root, source, &config));
  return config;
}

Result<ModelConfig> load_model_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path);
  if (!in) return common::not_found(path + ": cannot open config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace model
