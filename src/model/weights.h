// The DeepSeek-V3 weight set in kernel-ready form, loaded from a Checkpoint (or filled with
// random values for benchmarks). Linear weights stay BF16, F32 or FP8 e4m3 (with its
// weight_scale_inv blocks) as stored; F16 becomes F32, and so do FP8 slices the kernels cannot
// read in place; msmodelslim W8A8 / W4A8 weights become I8 with their scales
// (quant_model_description.json). Immutable after load; thread-safe reads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/moe.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/tensor_parallel.h"
#include "tensor/weight_matrix.h"

namespace model {

using Vector = std::vector<float>;

struct MlpWeights {
  tensor::WeightMatrix gate_up;  // [2·inter, H]: gate_proj rows, then up_proj rows
  tensor::WeightMatrix down;     // [H, inter]
  kernels::ExpertWeights view() const { return {gate_up.view(), down.view()}; }
};

struct AttentionWeights {
  tensor::WeightMatrix q_a_proj;   // [q_lora_rank, H]          (q_lora models)
  Vector q_a_layernorm;            // [q_lora_rank]
  Vector q_a_layernorm_bias;       // W8A8 smoothing bias after the norm, or empty
  tensor::WeightMatrix q_b_proj;   // [nh·(dn+dr), q_lora_rank]
  tensor::WeightMatrix q_proj;     // [nh·(dn+dr), H]            (q_lora_rank null)
  tensor::WeightMatrix kv_a_proj;  // [r + dr, H]  (kv_a_proj_with_mqa)
  Vector kv_a_layernorm;           // [r]
  Vector kv_a_layernorm_bias;      // or empty
  tensor::WeightMatrix kv_b_proj;  // [nh·(dn+dv), r], always F32 (absorption reads it directly)
  tensor::WeightMatrix o_proj;     // [H, nh·dv]
  // kv_b_proj again, as the absorbed form of a few tokens reads it: per head h, rows
  // [h·r, (h+1)·r) of absorb_uk_t are W_UK[h]ᵀ ([r, dn]) and rows [h·dv, (h+1)·dv) of absorb_uv
  // are W_UV[h] ([dv, r]), both streamed by the GEMV kernel. BF16 when every kv_b_proj value is
  // exact in BF16 (BF16 and W8A8 checkpoints): a decode step then reads half the bytes of the
  // F32 copy. Else F32. Empty until add_absorbed_projections().
  tensor::WeightMatrix absorb_uk_t;
  tensor::WeightMatrix absorb_uv;
};

// Fills a.absorb_uk_t and a.absorb_uv from a.kv_b_proj (this rank's heads).
void add_absorbed_projections(AttentionWeights& a, int64_t qk_nope_head_dim, int64_t v_head_dim);

struct MoeWeights {
  tensor::WeightMatrix router;  // [E, H] F32 (routing runs in f32)
  Vector correction_bias;       // [E] e_score_correction_bias (empty when absent)
  // Experts [first_expert, first_expert + experts.size()): all of them, or with expert
  // parallelism this rank's share.
  int first_expert = 0;
  std::vector<MlpWeights> experts;
  std::vector<kernels::ExpertWeights> expert_views;
  std::optional<MlpWeights> shared;
};

struct DecoderLayerWeights {
  Vector input_layernorm;
  Vector post_attention_layernorm;
  Vector input_layernorm_bias;  // W8A8 smoothing biases, added after the norms; or empty
  Vector post_attention_layernorm_bias;
  AttentionWeights attn;
  std::optional<MlpWeights> dense_mlp;  // first_k_dense_replace layers
  std::optional<MoeWeights> moe;
};

struct MtpWeights {
  Vector enorm, hnorm, shared_head_norm;
  tensor::WeightMatrix eh_proj;           // [H, 2H]
  tensor::WeightMatrix embed_tokens;      // own copy, or empty => main embedding
  tensor::WeightMatrix shared_head_head;  // own copy, or empty => main lm_head
  DecoderLayerWeights layer;
};

struct ModelWeights {
  tensor::WeightMatrix embed_tokens;  // [V, H], or this rank's padded vocabulary shard
  tensor::WeightMatrix lm_head;       // [V, H], or this rank's padded vocabulary shard
  Vector norm;                        // [H]
  // Indexed by layer id; layers outside the loaded range stay default (empty).
  std::vector<DecoderLayerWeights> layers;
  std::vector<MtpWeights> mtp;  // num_nextn_predict_layers entries when loaded
  // QuaRot W8A8 (is_rot_used): [H, H] F32 applied to the hidden state entering the MTP layer.
  tensor::WeightMatrix mtp_rotation;
};

struct LoadOptions {
  int layer_begin = 0;         // main decoder layers to load: [layer_begin, layer_end)
  int layer_end = -1;          // -1: all
  bool load_embedding = true;  // first pipeline stage
  bool load_head = true;       // last pipeline stage: norm, lm_head
  bool load_mtp = true;        // MTP layers (need load_head's stage)
  // "" (detect: W8A8 when quant_model_description.json is present), "ascend" (require it), or
  // "fp8" (config.json's quantization_config only).
  std::string quantization;
  // W8A8_MIX layers run statically (input_scale / deq_scale / quant_bias) instead of dynamically,
  // as vllm-ascend runs them on a decode-only KV consumer.
  bool w8a8_mix_static = false;
  // chunkpipe extension: lm_head (and the MTP layers' own heads) quantized to int8 at load,
  // per row, with per-token dynamic activations, like W8A8_DYNAMIC. msmodelslim keeps them
  // FLOAT; this halves the head's bytes per decode step (llama.cpp's Q8_0 quantizes its output
  // tensor too). Off by default.
  bool lm_head_int8 = false;
  // FP8 linears block-dequantized to F32 at load, as chunkpipe loaded them before it held them
  // as FP8: four times the memory, the same outputs. For comparisons and tests.
  bool fp8_dequantize = false;
  TensorParallel tp;               // this rank's shard (whole model when tp.size == 1)
  LmHeadParallel lmhead_tp;        // splits the heads over their own group instead of tp's
  DataParallelExperts dp_experts;  // routed experts split over DP x TP (tp.expert_parallel)
};

common::Result<ModelWeights> load_weights(const Checkpoint& checkpoint, const ModelConfig& config,
                                          const LoadOptions& options);

// Random weights with the checkpoint's distributions (make-tiny style); `dtype` is kF32, kBF16,
// or kI8 for msmodelslim's W8A8 layout (projections and MLPs int8 per channel, the rest BF16).
ModelWeights random_weights(const ModelConfig& config, tensor::DType dtype, uint64_t seed);

// LoadOptions::lm_head_int8 on loaded weights: lm_head and every MTP head copy become int8.
void quantize_lm_head_int8(ModelWeights& weights);

}  // namespace model
