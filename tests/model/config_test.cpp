// config.json parsing: the real V3.1 shape and errors that name the field.
#include "model/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace {

using nlohmann::json;

json v31_config() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "attention_bias": false, "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})");
}

TEST(ConfigTest, ParsesDeepSeekV31) {
  auto c = model::parse_model_config(v31_config().dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->hidden_size, 7168);
  EXPECT_EQ(c->q_lora_rank.value(), 1536);
  EXPECT_EQ(c->qk_head_dim(), 192);
  EXPECT_EQ(c->kv_cache_row_dim(), 576);
  EXPECT_TRUE(c->yarn.enabled);
  EXPECT_EQ(c->yarn.factor, 40);
  ASSERT_TRUE(c->quantization.has_value());
  EXPECT_EQ(c->quantization->scale_fmt, "ue8m0");
  EXPECT_EQ(c->quantization->weight_block_rows, 128);
  EXPECT_FALSE(c->is_moe_layer(2));
  EXPECT_TRUE(c->is_moe_layer(3));
  EXPECT_TRUE(c->is_moe_layer(61));
  EXPECT_EQ(c->num_total_layers(), 62);
  EXPECT_EQ(c->topk_method, kernels::TopkMethod::kNoauxTc);
}

TEST(ConfigTest, NullQLoraRankAndRopeType) {
  json j = v31_config();
  j["q_lora_rank"] = nullptr;
  j["rope_scaling"].erase("type");
  j["rope_scaling"]["rope_type"] = "yarn";
  auto c = model::parse_model_config(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->q_lora_rank.has_value());
}

void expect_error(json j, const std::string& needle) {
  auto c = model::parse_model_config(j.dump(), "/m/config.json");
  ASSERT_FALSE(c.ok()) << "expected an error mentioning " << needle;
  EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
  EXPECT_EQ(c.status().message().find('\n'), std::string::npos);
}

TEST(ConfigTest, ErrorsNameTheField) {
  json j = v31_config();
  j["hidden_size"] = "big";
  expect_error(j, "/m/config.json: field 'hidden_size' must be an integer >= 1 (got \"big\")");
  j = v31_config();
  j.erase("kv_lora_rank");
  expect_error(j, "field 'kv_lora_rank' is required");
  j = v31_config();
  j["rope_scaling"]["type"] = "linear";
  expect_error(j, "field 'rope_scaling.type' must be \"yarn\"");
  j = v31_config();
  j["quantization_config"]["weight_block_size"] = {128};
  expect_error(j, "field 'quantization_config.weight_block_size'");
  j = v31_config();
  j["quantization_config"]["quant_method"] = "awq";
  expect_error(j, "field 'quantization_config.quant_method'");
  j = v31_config();
  j["scoring_func"] = "relu";
  expect_error(j, "field 'scoring_func'");
  j = v31_config();
  j["n_group"] = 7;
  expect_error(j, "field 'n_group' must divide n_routed_experts");
  j = v31_config();
  j["tie_word_embeddings"] = true;
  expect_error(j, "field 'tie_word_embeddings'");
  auto bad = model::parse_model_config("{not json", "x/config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "x/config.json: not valid JSON");
}

}  // namespace
