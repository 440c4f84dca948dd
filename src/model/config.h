// ModelConfig: every field of a DeepSeek-V3 / V3.1 config.json the engine uses, parsed and
// validated. Immutable after parse; thread-safe to share.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/moe.h"
#include "kernels/rope.h"

namespace model {

struct QuantizationConfig {
  std::string quant_method;       // "fp8"
  std::string fmt;                // "e4m3"
  std::string activation_scheme;  // "dynamic"
  std::string scale_fmt;          // "ue8m0" (V3.1) or empty; weight dequantization ignores it
  int64_t weight_block_rows = 128;
  int64_t weight_block_cols = 128;
};

struct ModelConfig {
  std::vector<std::string> architectures;
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t moe_intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_nextn_predict_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  std::optional<int64_t> q_lora_rank;  // null => plain q_proj
  int64_t kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  int n_routed_experts = 0;  // 0 when the model has no MoE layers (null in config.json)
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int n_group = 1;
  int topk_group = 1;
  double routed_scaling_factor = 1.0;
  kernels::ScoringFunc scoring_func = kernels::ScoringFunc::kSoftmax;
  kernels::TopkMethod topk_method = kernels::TopkMethod::kGreedy;
  bool norm_topk_prob = false;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  kernels::YarnConfig yarn;
  int64_t max_position_embeddings = 0;
  std::string hidden_act = "silu";
  bool attention_bias = false;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  std::string torch_dtype;
  std::optional<QuantizationConfig> quantization;

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t kv_cache_row_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  // Per-token k_nope ‖ v of every head, as the optional expanded KV cache stores it.
  int64_t expanded_kv_row_dim() const {
    return int64_t{num_attention_heads} * (qk_nope_head_dim + v_head_dim);
  }
  bool is_moe_layer(int layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // Decoder layers including the MTP layers stored after the main stack.
  int num_total_layers() const { return num_hidden_layers + num_nextn_predict_layers; }
  kernels::RouterParams router_params() const;
};

// Parses config.json text; `source` names the file in error messages.
common::Result<ModelConfig> parse_model_config(const std::string& json_text,
                                               const std::string& source);
common::Result<ModelConfig> load_model_config(const std::string& model_dir);

}  // namespace model
