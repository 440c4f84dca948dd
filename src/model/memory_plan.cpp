// Walks the checkpoint's tensor index and applies the loader's dtype rules per tensor (no tensor
// data is read); sums the forward's buffer sizes from the config for the scratch estimate.
#include "model/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kernels/moe.h"
#include "model/quant_description.h"
#include "tensor/dtype.h"

namespace model {
namespace {

using tensor::DType;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The decoder layer a "model.layers.N." tensor belongs to, or -1.
int layer_of(const std::string& name) {
  static const std::string kPrefix = "model.layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  size_t i = kPrefix.size();
  int layer = 0;
  bool digits = false;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
    layer = layer * 10 + (name[i++] - '0');
    digits = true;
  }
  return digits && i < name.size() && name[i] == '.' ? layer : -1;
}

// Whether the loader reads this tensor for the given options.
bool loaded(const std::string& name, const ModelConfig& c, const LoadOptions& o) {
  const int layer = layer_of(name);
  const int end = o.layer_end < 0 ? c.num_hidden_layers : o.layer_end;
  if (layer >= c.num_hidden_layers) return o.load_mtp && o.load_head;
  if (layer >= 0) return layer >= o.layer_begin && layer < end;
  if (name == "model.embed_tokens.weight")
    return o.load_embedding || (o.load_mtp && o.load_head && c.num_nextn_predict_layers > 0);
  if (name == "lm_head.weight" || name == "model.norm.weight") return o.load_head;
  if (name == "rot.weight") return o.load_mtp && o.load_head;
  return false;
}

// Tensors that are folded into another one's bytes (scales, offsets, static-quant inputs).
bool auxiliary(const std::string& name) {
  for (const char* tail : {".weight_scale_inv", ".weight_scale", ".weight_offset", ".input_scale",
                           ".input_offset", ".deq_scale", ".quant_bias"})
    if (ends_with(name, tail)) return true;
  return false;
}

// Whether every FP8 value of `weight` (code × its block's scale) is exact in bf16, judged from
// the scales alone: each scale times every code. Power-of-two scales (ue8m0) always pass.
common::Result<bool> fp8_exact_in_bf16(const Checkpoint& ck, const std::string& weight) {
  const std::string scale_name = weight + "_scale_inv";
  if (!ck.contains(scale_name)) return false;
  CP_ASSIGN_OR_RETURN(const TensorInfo* s, ck.find(scale_name));
  if (s->dtype != DType::kF32) return false;
  std::vector<float> values(256);
  for (int c = 0; c < 256; ++c) values[size_t(c)] = tensor::fp8_e4m3_to_f32(uint8_t(c));
  for (int64_t i = 0; i < s->num_elements(); ++i) {
    float scale;
    std::memcpy(&scale, s->data + 4 * i, sizeof(scale));
    for (float v : values) {
      if (std::isnan(v)) continue;
      const float x = v * scale;
      if (tensor::bf16_to_f32(tensor::f32_to_bf16(x)) != x) return false;
    }
  }
  return true;
}

}  // namespace

common::Result<WeightCensus> planned_weight_census(const Checkpoint& ck, const ModelConfig& c,
                                                   const LoadOptions& o) {
  std::optional<QuantDescription> quant;
  if (o.quantization.empty() || o.quantization == "ascend") {
    CP_ASSIGN_OR_RETURN(quant, load_quant_description(ck.dir()));
  }
  const int64_t br = c.quantization ? c.quantization->weight_block_rows : 128;
  const int64_t bc = c.quantization ? c.quantization->weight_block_cols : 128;
  const bool fp8_in_place = !o.fp8_dequantize && bc >= 16 && (bc & (bc - 1)) == 0;
  const double tp = std::max(1, o.tp.size);
  WeightCensus w;
  for (const std::string& name : ck.tensor_names()) {
    if (!loaded(name, c, o) || auxiliary(name)) continue;
    CP_ASSIGN_OR_RETURN(const TensorInfo* t, ck.find(name));
    const int64_t n = t->num_elements();
    const int64_t rows = t->shape.empty() ? 1 : t->shape[0];
    // Layer tensors split over TP ranks (by heads, columns or experts); norms are whole.
    const bool sharded = layer_of(name) >= 0 && t->shape.size() == 2;
    const auto add = [&](int64_t& bucket, double bytes) {
      bucket += static_cast<int64_t>(sharded ? bytes / tp : bytes);
    };
    if (t->shape.size() != 2) {
      add(w.f32_bytes, 4.0 * double(n));  // norms, biases: F32
      continue;
    }
    const bool kv_b = ends_with(name, "kv_b_proj.weight");
    const bool router = ends_with(name, "mlp.gate.weight");
    std::optional<QuantType> qtype;
    if (quant && (quant->types.count(name) || t->dtype == DType::kI8)) {
      CP_ASSIGN_OR_RETURN(QuantType q, quant->type_of(name));
      if (q != QuantType::kFloat) qtype = q;
    }
    if (qtype) {
      const bool int4 = *qtype == QuantType::kW4A8Dynamic;
      const int64_t out_rows = int4 ? 2 * rows : rows;
      add(w.i8_bytes, double(int4 ? 2 * n : n) + 12.0 * double(out_rows));
      continue;
    }
    if (kv_b) {
      // F32, and its absorbed copies: BF16 when every value is exact in bf16 (BF16 storage, or
      // FP8 with power-of-two scales).
      bool exact = t->dtype == DType::kBF16;
      if (t->dtype == DType::kF8E4M3) {
        CP_ASSIGN_OR_RETURN(exact, fp8_exact_in_bf16(ck, name));
      }
      add(w.f32_bytes, 4.0 * double(n));
      add(exact ? w.bf16_bytes : w.f32_bytes, (exact ? 2.0 : 4.0) * double(n));
      continue;
    }
    // gate_proj and up_proj stack into one FP8 matrix only when gate's rows end on a block.
    const bool gate_or_up =
        ends_with(name, ".gate_proj.weight") || ends_with(name, ".up_proj.weight");
    if (t->dtype == DType::kF8E4M3 && !router && fp8_in_place && (!gate_or_up || rows % br == 0)) {
      const int64_t cols = t->shape[1];
      const double scales = double((rows + br - 1) / br) * double((cols + bc - 1) / bc);
      add(w.fp8_bytes, double(n) + 4.0 * scales);
      continue;
    }
    const bool head = name == "lm_head.weight" || ends_with(name, "shared_head.head.weight");
    if (head && o.lm_head_int8) {
      w.i8_bytes += n + 12 * rows;
      continue;
    }
    if (t->dtype == DType::kBF16 && !router) {
      add(w.bf16_bytes, 2.0 * double(n));
    } else {
      add(w.f32_bytes, 4.0 * double(n));
    }
  }
  return w;
}

int64_t forward_scratch_bytes(const ModelConfig& c, const ScratchInput& in) {
  const int64_t T = std::max<int64_t>(in.num_batched_tokens, 1);
  const int64_t L = std::max<int64_t>(in.max_model_len, 1);
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, r = c.kv_lora_rank;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const int64_t rq = c.q_lora_rank.value_or(0);
  const int64_t k = std::max(c.num_experts_per_tok, 1);
  // f32 elements of one thread's buffers.
  int64_t tokens = 0;
  tokens += 4 * T * H;  // the hidden state in and out, the normed input, the sublayer output
  tokens += T * (nh * c.qk_head_dim() + rq + (r + dr) + nh * dv + r);  // q, q latent, kv_a, o
  // The MLP's gate_up and activation rows (dense, or one expert's tokens, or the shared
  // experts'), one expert's gathered input and output rows, and the decode-sized form's outputs
  // of every expert at once.
  const int64_t inter =
      std::max(c.intermediate_size, c.moe_intermediate_size * std::max(c.n_shared_experts, 1));
  tokens += T * 3 * inter;
  if (c.n_routed_experts > 0) {
    const int64_t held = std::min(T * k, c.n_routed_experts * kernels::kExpertsPerThreadMaxTokens);
    tokens += 2 * T * H + held * H + T * (c.n_routed_experts + 2 * k);
  }
  // Attention of one sequence of up to L keys: k_pe transposed, the latent (and its bf16
  // splits), one segment's expanded keys and values, W_UK packed.
  const int64_t segment = std::min(L, std::max<int64_t>(256, T / 4 + 64));
  const int64_t attention = L * (dr + r) + L * r * 2 + segment * nh * (dn + dv) + nh * dn * r;
  // Every thread's activation packing and attention tiles (one GEMM input of T rows).
  const int64_t per_thread = T * std::max({H, nh * dv, c.intermediate_size}) + 64 * 1024;
  const int64_t logits = std::min(T, std::max<int64_t>(in.max_num_seqs, 1)) * c.vocab_size;
  const int64_t elements = tokens + attention + per_thread * std::max(in.threads, 1) + logits;
  return 4 * elements;
}

}  // namespace model
