// Checkpoint writing: the inverse of load_weights (fused gate_up split back into gate_proj and
// up_proj), FP8 block quantization, and the safetensors container.
#include "model/checkpoint_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace model {
namespace {

using nlohmann::json;
using tensor::DType;

TensorToWrite raw_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                         const void* data, size_t bytes) {
  TensorToWrite t{name, dtype, std::move(shape), std::vector<uint8_t>(bytes)};
  std::memcpy(t.bytes.data(), data, bytes);
  return t;
}

TensorToWrite vector_tensor(const std::string& name, const Vector& v, DType dtype) {
  if (dtype == DType::kF32)
    return raw_tensor(name, DType::kF32, {static_cast<int64_t>(v.size())}, v.data(), v.size() * 4);
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = tensor::f32_to_bf16(v[i]);
  return raw_tensor(name, DType::kBF16, {static_cast<int64_t>(v.size())}, bits.data(),
                    bits.size() * 2);
}

float element(const tensor::WeightView& w, int64_t r, int64_t c) {
  return w.at(r, c);
}

// An I8 matrix's rows in msmodelslim's layout (w8a8-mtp.md 1b): the int8 weight, then
// weight_scale / weight_offset (dynamic) or input_scale / input_offset / deq_scale / quant_bias
// (static).
void int8_tensors(const std::string& name, const tensor::WeightView& w, int64_t row0, int64_t rows,
                  std::vector<TensorToWrite>* out) {
  const std::string prefix = name.substr(0, name.size() - 6);
  out->push_back(raw_tensor(name, DType::kI8, {rows, w.cols}, w.i8() + row0 * w.cols,
                            static_cast<size_t>(rows * w.cols)));
  const float* scale = w.quant.row_scale + row0;
  if (!w.quant.static_activation) {
    const std::vector<float> zeros(static_cast<size_t>(rows), 0.0f);
    out->push_back(raw_tensor(prefix + "weight_scale", DType::kF32, {rows, 1}, scale, rows * 4));
    out->push_back(
        raw_tensor(prefix + "weight_offset", DType::kF32, {rows, 1}, zeros.data(), rows * 4));
    return;
  }
  out->push_back(raw_tensor(prefix + "input_scale", DType::kF32, {1}, &w.quant.input_scale, 4));
  out->push_back(raw_tensor(prefix + "input_offset", DType::kF32, {1}, &w.quant.input_offset, 4));
  out->push_back(raw_tensor(prefix + "deq_scale", DType::kF32, {rows}, scale, rows * 4));
  std::vector<int32_t> bias(static_cast<size_t>(rows), 0);
  if (w.quant.row_bias) std::memcpy(bias.data(), w.quant.row_bias + row0, rows * 4);
  out->push_back(raw_tensor(prefix + "quant_bias", DType::kI32, {rows}, bias.data(), rows * 4));
}

// Rows [row0, row0 + rows) of w as one tensor (BF16/F32 as stored, or FP8 + scales).
void matrix_tensors(const std::string& name, const tensor::WeightView& w, int64_t row0,
                    int64_t rows, bool fp8, DType vector_dtype, std::vector<TensorToWrite>* out) {
  const int64_t cols = w.cols;
  if (w.dtype == DType::kI8) {
    int8_tensors(name, w, row0, rows, out);
    return;
  }
  if (!fp8) {
    const int elem = tensor::dtype_size_bytes(w.dtype);
    const float* f32 = w.dtype == DType::kF32 ? w.f32() + row0 * cols : nullptr;
    const size_t n = static_cast<size_t>(rows * cols);
    // Matrices kept F32 in memory (kv_b_proj, the router) go out as BF16 in a BF16 checkpoint, as
    // in the Hugging Face release, when that loses nothing.
    if (f32 != nullptr && vector_dtype == DType::kBF16 && std::all_of(f32, f32 + n, [](float v) {
          return tensor::bf16_to_f32(tensor::f32_to_bf16(v)) == v;
        })) {
      std::vector<uint16_t> bits(n);
      for (size_t i = 0; i < n; ++i) bits[i] = tensor::f32_to_bf16(f32[i]);
      out->push_back(raw_tensor(name, DType::kBF16, {rows, cols}, bits.data(), n * 2));
      return;
    }
    out->push_back(raw_tensor(name, w.dtype, {rows, cols},
                              static_cast<const uint8_t*>(w.data) + row0 * cols * elem, n * elem));
    return;
  }
  const int64_t block = 128, sr = (rows + block - 1) / block, sc = (cols + block - 1) / block;
  std::vector<float> scales(sr * sc);
  std::vector<uint8_t> q(rows * cols);
  for (int64_t bi = 0; bi < sr; ++bi) {
    for (int64_t bj = 0; bj < sc; ++bj) {
      float amax = 0;
      for (int64_t r = bi * block; r < std::min(rows, (bi + 1) * block); ++r)
        for (int64_t c = bj * block; c < std::min(cols, (bj + 1) * block); ++c)
          amax = std::max(amax, std::abs(element(w, row0 + r, c)));
      // Power-of-two scales (UE8M0, as DeepSeek-V3.1 ships them).
      const float s = std::exp2(std::ceil(std::log2(std::max(amax, 1e-12f) / 448.0f)));
      scales[bi * sc + bj] = s;
      for (int64_t r = bi * block; r < std::min(rows, (bi + 1) * block); ++r) {
        for (int64_t c = bj * block; c < std::min(cols, (bj + 1) * block); ++c) {
          q[r * cols + c] = tensor::f32_to_fp8_e4m3(element(w, row0 + r, c) / s);
        }
      }
    }
  }
  out->push_back(raw_tensor(name, DType::kF8E4M3, {rows, cols}, q.data(), q.size()));
  const std::string scale_name = name.substr(0, name.size() - 6) + "weight_scale_inv";
  out->push_back(raw_tensor(scale_name, DType::kF32, {sr, sc}, scales.data(), scales.size() * 4));
}

void mlp_tensors(const std::string& prefix, const MlpWeights& m, bool fp8, DType vd,
                 std::vector<TensorToWrite>* out) {
  const int64_t inter = m.gate_up.rows() / 2;
  matrix_tensors(prefix + "gate_proj.weight", m.gate_up.view(), 0, inter, fp8, vd, out);
  matrix_tensors(prefix + "up_proj.weight", m.gate_up.view(), inter, inter, fp8, vd, out);
  matrix_tensors(prefix + "down_proj.weight", m.down.view(), 0, m.down.rows(), fp8, vd, out);
}

void layer_tensors(const ModelConfig& c, int layer, const DecoderLayerWeights& w, bool fp8,
                   DType vd, std::vector<TensorToWrite>* out) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  out->push_back(vector_tensor(p + "input_layernorm.weight", w.input_layernorm, vd));
  out->push_back(
      vector_tensor(p + "post_attention_layernorm.weight", w.post_attention_layernorm, vd));
  const AttentionWeights& a = w.attn;
  if (c.q_lora_rank) {
    matrix_tensors(p + "self_attn.q_a_proj.weight", a.q_a_proj.view(), 0, a.q_a_proj.rows(), fp8,
                   vd, out);
    out->push_back(vector_tensor(p + "self_attn.q_a_layernorm.weight", a.q_a_layernorm, vd));
    matrix_tensors(p + "self_attn.q_b_proj.weight", a.q_b_proj.view(), 0, a.q_b_proj.rows(), fp8,
                   vd, out);
  } else {
    matrix_tensors(p + "self_attn.q_proj.weight", a.q_proj.view(), 0, a.q_proj.rows(), fp8, vd,
                   out);
  }
  matrix_tensors(p + "self_attn.kv_a_proj_with_mqa.weight", a.kv_a_proj.view(), 0,
                 a.kv_a_proj.rows(), fp8, vd, out);
  out->push_back(vector_tensor(p + "self_attn.kv_a_layernorm.weight", a.kv_a_layernorm, vd));
  matrix_tensors(p + "self_attn.kv_b_proj.weight", a.kv_b_proj.view(), 0, a.kv_b_proj.rows(), fp8,
                 vd, out);
  matrix_tensors(p + "self_attn.o_proj.weight", a.o_proj.view(), 0, a.o_proj.rows(), fp8, vd, out);
  if (w.dense_mlp) {
    mlp_tensors(p + "mlp.", *w.dense_mlp, fp8, vd, out);
    return;
  }
  const MoeWeights& m = *w.moe;
  matrix_tensors(p + "mlp.gate.weight", m.router.view(), 0, m.router.rows(), false, vd, out);
  if (!m.correction_bias.empty())
    out->push_back(
        vector_tensor(p + "mlp.gate.e_score_correction_bias", m.correction_bias, DType::kF32));
  for (size_t e = 0; e < m.experts.size(); ++e)
    mlp_tensors(p + "mlp.experts." + std::to_string(e) + ".", m.experts[e], fp8, vd, out);
  if (m.shared) mlp_tensors(p + "mlp.shared_experts.", *m.shared, fp8, vd, out);
}

}  // namespace

json config_to_json(const ModelConfig& c) {
  json j = {{"architectures", {"DeepseekV3ForCausalLM"}},
            {"model_type", "deepseek_v3"},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"bos_token_id", c.bos_token_id},
            {"eos_token_id", c.eos_token_id},
            {"first_k_dense_replace", c.first_k_dense_replace},
            {"hidden_act", "silu"},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"kv_lora_rank", c.kv_lora_rank},
            {"max_position_embeddings", c.max_position_embeddings},
            {"moe_intermediate_size", c.moe_intermediate_size},
            {"moe_layer_freq", c.moe_layer_freq},
            {"n_group", c.n_group},
            {"n_routed_experts", c.n_routed_experts},
            {"n_shared_experts", c.n_shared_experts},
            {"norm_topk_prob", c.norm_topk_prob},
            {"num_attention_heads", c.num_attention_heads},
            {"num_experts_per_tok", c.num_experts_per_tok},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_key_value_heads", c.num_attention_heads},
            {"num_nextn_predict_layers", c.num_nextn_predict_layers},
            {"qk_nope_head_dim", c.qk_nope_head_dim},
            {"qk_rope_head_dim", c.qk_rope_head_dim},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"routed_scaling_factor", c.routed_scaling_factor},
            {"scoring_func", "sigmoid"},
            {"tie_word_embeddings", false},
            {"topk_group", c.topk_group},
            {"topk_method", "noaux_tc"},
            {"torch_dtype", c.torch_dtype},
            {"use_cache", true},
            {"v_head_dim", c.v_head_dim},
            {"vocab_size", c.vocab_size}};
  j["q_lora_rank"] = c.q_lora_rank ? json(*c.q_lora_rank) : json(nullptr);
  if (c.yarn.enabled) {
    j["rope_scaling"] = {
        {"beta_fast", c.yarn.beta_fast},
        {"beta_slow", c.yarn.beta_slow},
        {"factor", c.yarn.factor},
        {"mscale", c.yarn.mscale},
        {"mscale_all_dim", c.yarn.mscale_all_dim},
        {"original_max_position_embeddings", c.yarn.original_max_position_embeddings},
        {"type", "yarn"}};
  }
  if (c.quantization) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"scale_fmt", "ue8m0"},
                                {"weight_block_size", {128, 128}}};
  }
  return j;
}

std::vector<TensorToWrite> weights_to_tensors(const ModelConfig& c, const ModelWeights& w,
                                              bool fp8) {
  std::vector<TensorToWrite> out;
  const DType vd = w.embed_tokens.dtype();
  matrix_tensors("model.embed_tokens.weight", w.embed_tokens.view(), 0, w.embed_tokens.rows(),
                 false, vd, &out);
  matrix_tensors("lm_head.weight", w.lm_head.view(), 0, w.lm_head.rows(), false, vd, &out);
  out.push_back(vector_tensor("model.norm.weight", w.norm, vd));
  for (int l = 0; l < c.num_hidden_layers; ++l) layer_tensors(c, l, w.layers[l], fp8, vd, &out);
  for (size_t k = 0; k < w.mtp.size(); ++k) {
    const int l = c.num_hidden_layers + static_cast<int>(k);
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const MtpWeights& m = w.mtp[k];
    out.push_back(vector_tensor(p + "enorm.weight", m.enorm, vd));
    out.push_back(vector_tensor(p + "hnorm.weight", m.hnorm, vd));
    out.push_back(vector_tensor(p + "shared_head.norm.weight", m.shared_head_norm, vd));
    matrix_tensors(p + "eh_proj.weight", m.eh_proj.view(), 0, m.eh_proj.rows(), false, vd, &out);
    layer_tensors(c, l, m.layer, fp8, vd, &out);
  }
  return out;
}

common::Status write_safetensors(const std::string& dir, std::vector<TensorSource> tensors,
                                 int num_shards, const std::string& stem) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return common::invalid_argument(dir + ": cannot create directory (" + ec.message() + ")");
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  size_t total = 0;
  for (const auto& t : tensors) total += t.bytes;
  num_shards = std::max(1, num_shards);
  std::vector<std::vector<const TensorSource*>> shards(1);
  size_t acc = 0;
  for (const auto& t : tensors) {
    shards.back().push_back(&t);
    acc += t.bytes;
    if (acc >= total * shards.size() / num_shards && static_cast<int>(shards.size()) < num_shards)
      shards.emplace_back();
  }
  if (shards.back().empty()) shards.pop_back();
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    if (shards.size() == 1) {
      std::snprintf(name, sizeof(name), "%s.safetensors", stem.c_str());
    } else {
      std::snprintf(name, sizeof(name), "%s-%05zu-of-%05zu.safetensors", stem.c_str(), s + 1,
                    shards.size());
    }
    json header = json::object();
    header["__metadata__"] = {{"format", "pt"}, {"generator", "chunkpipe make-model"}};
    size_t offset = 0;
    for (const TensorSource* t : shards[s]) {
      header[t->name] = {{"dtype", std::string(tensor::dtype_name(t->dtype))},
                         {"shape", t->shape},
                         {"data_offsets", {offset, offset + t->bytes}}};
      offset += t->bytes;
      weight_map[t->name] = name;
    }
    std::string h = header.dump();
    while (h.size() % 8 != 0) h += ' ';
    std::ofstream f(fs::path(dir) / name, std::ios::binary | std::ios::trunc);
    if (!f) return common::invalid_argument(std::string(name) + ": cannot write in " + dir);
    uint64_t len = h.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const TensorSource* t : shards[s]) {
      size_t written = 0;
      t->produce([&](const uint8_t* data, size_t bytes) {
        f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(bytes));
        written += bytes;
      });
      if (written != t->bytes) {
        return common::data_loss(t->name + ": produced " + std::to_string(written) +
                                 " bytes for a tensor of " + std::to_string(t->bytes));
      }
    }
    if (!f) return common::data_loss(std::string(name) + ": write failed");
  }
  const std::string index_name = stem + ".safetensors.index.json";
  fs::remove(fs::path(dir) / index_name);
  if (shards.size() > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream(fs::path(dir) / index_name) << index.dump(2) << "\n";
  }
  return {};
}

common::Status write_safetensors_checkpoint(const std::string& dir,
                                            std::vector<TensorToWrite> tensors, int num_shards,
                                            const std::string& stem) {
  std::vector<TensorSource> sources;
  sources.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) {
    sources.push_back(
        {t.name, t.dtype, t.shape, t.bytes.size(),
         [&t](const TensorSource::Sink& sink) { sink(t.bytes.data(), t.bytes.size()); }});
  }
  return write_safetensors(dir, std::move(sources), num_shards, stem);
}

}  // namespace model
