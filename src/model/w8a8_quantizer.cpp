// W8A8 quantization of a loaded model and the checkpoint writing around it (description JSON,
// config.json without quantization_config, the source's other files copied).
#include "model/w8a8_quantizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/int8_linear.h"
#include "model/checkpoint_writer.h"
#include "model/deepseek_v3.h"
#include "model/quant_description.h"
#include "model/sequence_runner.h"

namespace model {
namespace {

using nlohmann::json;
using tensor::DType;
using tensor::WeightMatrix;

WeightMatrix to_dynamic(const WeightMatrix& m) {
  const tensor::WeightView v = m.view();
  std::vector<float> f(static_cast<size_t>(v.rows * v.cols));
  for (int64_t r = 0; r < v.rows; ++r)
    for (int64_t c = 0; c < v.cols; ++c) f[size_t(r * v.cols + c)] = v.at(r, c);
  WeightMatrix q;
  kernels::quantize_weight_rows(f.data(), v.rows, v.cols, q);
  return q;
}

// Static W8A8 (w8a8-mtp.md 1b, 1h): s_in = (max - min) / 255 over a range that holds 0,
// o_in = round(-128 - min / s_in), deq_scale = s_in · s_w, quant_bias = -o_in · Σ_k Wq.
WeightMatrix to_static(const WeightMatrix& m, ActivationRange range) {
  WeightMatrix q = to_dynamic(m);
  const float lo = std::min(range.min, 0.0f), hi = std::max(range.max, 0.0f);
  const float s_in = hi > lo ? (hi - lo) / 255.0f : 1.0f;
  const float o_in = std::clamp(std::nearbyint(-128.0f - lo / s_in), -128.0f, 127.0f);
  const tensor::WeightView v = q.view();
  for (int64_t r = 0; r < v.rows; ++r) {
    q.mutable_row_bias()[r] = static_cast<int32_t>(-o_in) * v.quant.row_sum[r];
    q.mutable_row_scale()[r] *= s_in;
  }
  q.finish_int8(true, s_in, o_in);
  return q;
}

void quantize_mlp(MlpWeights& m) {
  m.gate_up = to_dynamic(m.gate_up);
  m.down = to_dynamic(m.down);
}

void quantize_layer(DecoderLayerWeights& w, int layer,
                    const std::map<std::string, ActivationRange>& ranges) {
  const std::string prefix = "model.layers." + std::to_string(layer) + ".self_attn.";
  auto attention = [&](WeightMatrix& m, const char* proj) {
    if (m.empty()) return;
    const auto it = ranges.find(prefix + proj + ".weight");
    m = it != ranges.end() ? to_static(m, it->second) : to_dynamic(m);
  };
  attention(w.attn.q_a_proj, "q_a_proj");
  attention(w.attn.q_b_proj, "q_b_proj");
  attention(w.attn.q_proj, "q_proj");
  attention(w.attn.kv_a_proj, "kv_a_proj_with_mqa");
  attention(w.attn.o_proj, "o_proj");
  if (w.dense_mlp) quantize_mlp(*w.dense_mlp);
  if (w.moe) {
    for (MlpWeights& e : w.moe->experts) quantize_mlp(e);
    w.moe->expert_views.clear();
    for (const MlpWeights& e : w.moe->experts) w.moe->expert_views.push_back(e.view());
    if (w.moe->shared) quantize_mlp(*w.moe->shared);
  }
}

// Mean squared error of static W8A8's activation rule on `xs` with the range [lo, hi] (which
// holds 0): q = clamp(round(x / s) + o, -128, 127), x' = (q - o)·s.
double static_quant_mse(const std::vector<float>& xs, float lo, float hi) {
  const float s = hi > lo ? (hi - lo) / 255.0f : 1.0f;
  const float o = std::clamp(std::nearbyint(-128.0f - lo / s), -128.0f, 127.0f);
  double sum = 0;
  for (float x : xs) {
    const float q = std::clamp(std::nearbyint(x / s) + o, -128.0f, 127.0f);
    const double e = double((q - o) * s) - x;
    sum += e * e;
  }
  return xs.empty() ? 0 : sum / double(xs.size());
}

// Per static projection: the observed min and max, and a uniform sample of the inputs (a
// reservoir of up to kSample values, deterministic) to choose the range from.
class RangeObserver : public ActivationObserver {
 public:
  static constexpr size_t kSample = size_t{1} << 16;

  void observe(const std::string& name, const float* x, int64_t rows, int64_t cols) override {
    auto [it, fresh] = inputs_.try_emplace(name);
    Input& in = it->second;
    if (fresh) in.range = ActivationRange{x[0], x[0]};
    for (int64_t i = 0; i < rows * cols; ++i) {
      in.range.min = std::min(in.range.min, x[i]);
      in.range.max = std::max(in.range.max, x[i]);
      ++in.seen;
      if (in.sample.size() < kSample) {
        in.sample.push_back(x[i]);
      } else {
        const uint64_t j = rng_() % in.seen;
        if (j < kSample) in.sample[j] = x[i];
      }
    }
  }

  // The clipped range with the least quantization error on the sample: min and max scaled
  // together by 1, 0.99, ... 0.30 (min/max calibration wastes most of the 255 steps on a few
  // outliers; clipping them costs less than the coarser steps do).
  std::map<std::string, ActivationRange> ranges() const {
    std::map<std::string, ActivationRange> out;
    for (const auto& [name, in] : inputs_) {
      const float lo = std::min(in.range.min, 0.0f), hi = std::max(in.range.max, 0.0f);
      ActivationRange best{lo, hi};
      double best_mse = static_quant_mse(in.sample, lo, hi);
      for (int step = 1; step <= 70; ++step) {
        const float c = 1.0f - 0.01f * step;
        const double mse = static_quant_mse(in.sample, lo * c, hi * c);
        if (mse < best_mse) {
          best_mse = mse;
          best = ActivationRange{lo * c, hi * c};
        }
      }
      out[name] = best;
    }
    return out;
  }

 private:
  struct Input {
    ActivationRange range;
    uint64_t seen = 0;
    std::vector<float> sample;
  };
  std::map<std::string, Input> inputs_;
  std::mt19937_64 rng_{0x5eed};
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every tensor's type: an I8 weight is W8A8 (static, with deq_scale) or W8A8_DYNAMIC, its
// side tensors share its type, everything else is FLOAT.
json description_of(const std::vector<TensorToWrite>& tensors) {
  std::map<std::string, std::string> layer_type;  // "<prefix>" -> type
  std::set<std::string> names;
  for (const auto& t : tensors) names.insert(t.name);
  for (const auto& t : tensors) {
    if (t.dtype != DType::kI8 || !ends_with(t.name, "weight")) continue;
    const std::string prefix = t.name.substr(0, t.name.size() - 6);
    layer_type[prefix] = names.count(prefix + "deq_scale") ? "W8A8" : "W8A8_DYNAMIC";
  }
  json d = {{"model_quant_type", "W8A8_DYNAMIC"},
            {"version", "1.0.0"},
            {"group_size", 0},
            {"metadata", json::object()},
            {"optional", json::object()}};
  for (const auto& t : tensors) {
    std::string type = "FLOAT";
    const size_t dot = t.name.rfind('.');
    if (dot != std::string::npos) {
      const auto it = layer_type.find(t.name.substr(0, dot + 1));
      if (it != layer_type.end()) type = it->second;
    }
    d[t.name] = type;
  }
  return d;
}

}  // namespace

void quantize_weights_w8a8(ModelWeights& weights, const ModelConfig& config,
                           const std::map<std::string, ActivationRange>& static_ranges) {
  for (int l = 0; l < static_cast<int>(weights.layers.size()); ++l)
    if (!weights.layers[l].input_layernorm.empty())
      quantize_layer(weights.layers[l], l, static_ranges);
  for (size_t k = 0; k < weights.mtp.size(); ++k)
    quantize_layer(weights.mtp[k].layer, config.num_hidden_layers + static_cast<int>(k),
                   static_ranges);
}

common::Status write_w8a8_checkpoint(const std::string& src_dir, const std::string& dst_dir,
                                     const W8A8QuantizeOptions& options, common::ThreadPool& pool) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(src_dir) / kQuantDescriptionFile)) {
    return common::invalid_argument(src_dir + " already holds a W8A8 checkpoint (" +
                                    kQuantDescriptionFile + ")");
  }
  if (fs::exists(dst_dir) && fs::equivalent(src_dir, dst_dir)) {
    return common::invalid_argument("the destination must differ from the source");
  }
  LoadOptions load;
  load.quantization = "fp8";
  CP_ASSIGN_OR_RETURN(auto model, DeepseekV3Model::load(src_dir, load));
  const ModelConfig config = model->config();
  RangeObserver observer;
  if (options.static_attention) {
    std::vector<int32_t> ids(static_cast<size_t>(std::max<int64_t>(options.calibration_tokens, 2)));
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int32_t>((int64_t(i) * 7919 + 13) % config.vocab_size);
    model->set_activation_observer(&observer);
    SequenceLogitsOptions run;
    run.mtp = !model->weights().mtp.empty();
    CP_ASSIGN_OR_RETURN(SequenceLogits unused, compute_sequence_logits(*model, ids, run, pool));
    (void)unused;
    model->set_activation_observer(nullptr);
  }
  ModelWeights weights = std::move(*model).take_weights();
  quantize_weights_w8a8(weights, config, observer.ranges());
  std::vector<TensorToWrite> tensors = weights_to_tensors(config, weights, false);
  // deq_scale is F32 for a BF16 model and otherwise I64 holding the f32 bits (msmodelslim).
  if (config.torch_dtype != "bfloat16") {
    for (TensorToWrite& t : tensors) {
      if (!ends_with(t.name, ".deq_scale")) continue;
      std::vector<uint8_t> wide(t.bytes.size() * 2, 0);
      for (size_t i = 0; i < t.bytes.size() / 4; ++i) std::memcpy(&wide[8 * i], &t.bytes[4 * i], 4);
      t.dtype = DType::kI64;
      t.bytes = std::move(wide);
    }
  }
  const json description = description_of(tensors);
  CP_RETURN_IF_ERROR(write_safetensors_checkpoint(dst_dir, std::move(tensors), options.num_shards,
                                                  "quant_model_weights"));
  std::ofstream(fs::path(dst_dir) / kQuantDescriptionFile) << description.dump(2) << "\n";
  // config.json as the v1 saver leaves it: the source's, without quantization_config.
  std::ifstream in(fs::path(src_dir) / "config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  json cfg = json::parse(ss.str(), nullptr, false);
  if (cfg.is_discarded()) return common::invalid_argument(src_dir + "/config.json: not JSON");
  cfg.erase("quantization_config");
  std::ofstream(fs::path(dst_dir) / "config.json") << cfg.dump(2) << "\n";
  for (const auto& entry : fs::directory_iterator(src_dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || ends_with(name, ".safetensors") ||
        ends_with(name, ".safetensors.index.json") || name == "config.json")
      continue;
    std::error_code ec;
    fs::copy_file(entry.path(), fs::path(dst_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return common::invalid_argument(name + ": cannot copy to " + dst_dir);
  }
  return {};
}

}  // namespace model
