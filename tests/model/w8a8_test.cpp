// W8A8 checkpoints (msmodelslim's layout, `--quantization ascend`): written by the quantizer
// from the BF16, F32 and FP8 fixtures, loaded back, and checked against a dequantize-then-float
// forward, against the float model, as hand-built variants with every tensor type, and as
// corrupt variants whose errors name the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/gemm.h"
#include "model/checkpoint_writer.h"
#include "model/deepseek_v3.h"
#include "model/quant_description.h"
#include "model/sequence_runner.h"
#include "model/w8a8_quantizer.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tensor::DType;

std::string fixture(const std::string& name) {
  return (fs::path(CHUNKPIPE_TEST_DATA_DIR) / name).string();
}

common::ThreadPool& pool() {
  static common::ThreadPool p(2);
  return p;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/chunkpipe_w8a8_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string sub(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

// One temp dir per test binary holding the quantized fixtures (made once).
const TempDir& temp() {
  static TempDir dir;
  return dir;
}

std::string quantized(const std::string& source, bool static_attention) {
  const std::string dst = temp().sub(source + (static_attention ? "-static" : "-dynamic"));
  if (!fs::exists(dst)) {
    model::W8A8QuantizeOptions options;
    options.static_attention = static_attention;
    options.calibration_tokens = 256;
    const common::Status st = model::write_w8a8_checkpoint(fixture(source), dst, options, pool());
    EXPECT_TRUE(st.ok()) << st.message();
  }
  return dst;
}

std::unique_ptr<model::DeepseekV3Model> load(const std::string& dir,
                                             const std::string& quantization = "") {
  model::LoadOptions options;
  options.quantization = quantization;
  auto m = model::DeepseekV3Model::load(dir, options);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<int32_t> ids(int64_t n, int64_t vocab, int64_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * 7919 + seed * 104729 + 5) % vocab);
  return v;
}

model::SequenceLogits run(const model::DeepseekV3Model& m, const std::vector<int32_t>& tokens,
                          int64_t chunk = 0) {
  model::SequenceLogitsOptions o;
  o.all_logits = true;
  o.mtp = !m.weights().mtp.empty();
  o.chunk_size = chunk;
  auto r = model::compute_sequence_logits(m, tokens, o, pool());
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : model::SequenceLogits{};
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

// ---- The fast int8 kernels against the integer reference, through the whole model ----
// (Per linear, kernels_test checks both references: integer bit for bit, dequantize-then-float
// within 1e-5. Through a whole MoE model a dequantized forward is not comparable at 1e-3: one
// activation rounding that flips at a quantization boundary moves a router's top-k.)

class W8A8ReferenceTest : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(W8A8ReferenceTest, FastForwardEqualsTheReferenceForward) {
  const auto [source, static_attention] = GetParam();
  auto m = load(quantized(source, static_attention), "ascend");
  ASSERT_NE(m, nullptr);
  const auto tokens = ids(64, m->config().vocab_size, 1);
  const model::SequenceLogits fast = run(*m, tokens, 24);
  model::SequenceLogits ref;
  {
    kernels::ScopedReferenceLinear reference;
    ref = run(*m, tokens, 24);
  }
  EXPECT_EQ(max_abs_diff(fast.all_logits, ref.all_logits), 0.0) << source;
  EXPECT_EQ(max_abs_diff(fast.mtp_draft_logits, ref.mtp_draft_logits), 0.0) << source;
  // Quantization changed the weights (so the comparison above is not float against float).
  auto f = load(fixture(source));
  ASSERT_NE(f, nullptr);
  EXPECT_GT(max_abs_diff(run(*f, tokens, 24).all_logits, fast.all_logits), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, W8A8ReferenceTest,
                         ::testing::Combine(::testing::Values("tiny-bf16", "tiny-fp8",
                                                              "tiny-noq-f32"),
                                            ::testing::Bool()));

// ---- Against the float model: per-layer cosine, top-1 agreement, KL over 256 positions ----

double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

// Per layer, the cosine between the two models' outputs of that layer given the same input
// (the float model's hidden state entering it), over all tokens of one forward.
std::vector<double> layer_cosines(const model::DeepseekV3Model& q, const model::DeepseekV3Model& f,
                                  const std::vector<int32_t>& tokens) {
  const model::ModelConfig& c = f.config();
  const int64_t T = static_cast<int64_t>(tokens.size()), H = c.hidden_size, bs = 16;
  const int64_t blocks = (T + bs - 1) / bs;
  auto cache = [&] {
    return model::LatentKvCache(c.num_total_layers(), 0, c.num_hidden_layers, blocks, bs,
                                c.kv_cache_row_dim());
  };
  model::LatentKvCache cache_q = cache(), cache_f = cache();
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  model::ForwardBatch batch;
  batch.sequences.push_back({std::span<const int32_t>(tokens), 0, table});
  std::vector<float> hidden(static_cast<size_t>(T * H));
  EXPECT_TRUE(f.embed(batch, hidden.data()).ok());
  std::vector<double> out;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    std::vector<float> hq = hidden;
    EXPECT_TRUE(q.run_layers(batch, l, l + 1, hq.data(), cache_q, pool()).ok());
    EXPECT_TRUE(f.run_layers(batch, l, l + 1, hidden.data(), cache_f, pool()).ok());
    out.push_back(cosine(hq.data(), hidden.data(), T * H));
  }
  return out;
}

TEST(W8A8AccuracyTest, CloseToTheFloatModel) {
  for (bool static_attention : {false, true}) {
    auto q = load(quantized("tiny-bf16", static_attention));
    auto f = load(fixture("tiny-bf16"));
    ASSERT_TRUE(q && f);
    const auto tokens = ids(256, f->config().vocab_size, 2);
    double worst_cos = 1;
    for (double cos : layer_cosines(*q, *f, tokens)) worst_cos = std::min(worst_cos, cos);
    const model::SequenceLogits rq = run(*q, tokens), rf = run(*f, tokens);
    const int64_t V = f->config().vocab_size;
    int agree = 0, clear = 0, clear_agree = 0;
    double kl = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float* a = &rf.all_logits[t * V];
      const float* b = &rq.all_logits[t * V];
      const bool same = std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
      agree += same;
      // Random weights give near-ties; count separately the positions where the float model's
      // top logit leads the next by at least 0.1.
      std::vector<float> sorted(a, a + V);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      if (sorted[0] - sorted[1] >= 0.1f) {
        ++clear;
        clear_agree += same;
      }
      const double ma = *std::max_element(a, a + V), mb = *std::max_element(b, b + V);
      double za = 0, zb = 0;
      for (int64_t v = 0; v < V; ++v) {
        za += std::exp(a[v] - ma);
        zb += std::exp(b[v] - mb);
      }
      for (int64_t v = 0; v < V; ++v) {
        const double pa = std::exp(a[v] - ma) / za, pb = std::exp(b[v] - mb) / zb;
        kl += pa * (std::log(pa) - std::log(pb));
      }
    }
    const double agreement = double(agree) / tokens.size(), mean_kl = kl / tokens.size();
    const double clear_agreement = double(clear_agree) / std::max(clear, 1);
    std::printf(
        "W8A8 %s attention vs BF16 over %zu positions: worst per-layer cosine %.6f, top-1 "
        "agreement %.3f (%.3f at the %d positions with a margin >= 0.1), mean KL %.5f\n",
        static_attention ? "static" : "dynamic", tokens.size(), worst_cos, agreement,
        clear_agreement, clear, mean_kl);
    // Top-1 on random weights: logits are nearly flat and MoE routing flips on small changes,
    // so agreement stays near 0.84 (0.91 at clear margins), short of the 0.95 goal that real
    // weights' margins allow; these bounds guard against regressions.
    EXPECT_GE(clear, 64);
    EXPECT_GE(agreement, 0.78);
    EXPECT_GE(clear_agreement, 0.88);
    if (!static_attention) {
      // The goals hold for dynamic activations (the DeepSeek default for MLP and experts);
      // static attention (per-tensor ranges, clipped for the least error on the calibration
      // sample, no smoothing) stays a little below the cosine goal.
      EXPECT_GE(worst_cos, 0.999);
      EXPECT_LE(mean_kl, 0.02);
    } else {
      EXPECT_GE(worst_cos, 0.998);
      EXPECT_LE(mean_kl, 0.02);
    }
  }
}

// The optional int8 lm_head (LoadOptions::lm_head_int8): the head and the MTP head become I8,
// and the logits stay close to the float head's on 256 positions.
TEST(W8A8AccuracyTest, Int8LmHeadIsCloseToTheFloatHead) {
  auto f = load(fixture("tiny-bf16"));
  model::LoadOptions options;
  options.lm_head_int8 = true;
  auto q = model::DeepseekV3Model::load(fixture("tiny-bf16"), options);
  ASSERT_TRUE(f && q.ok());
  EXPECT_EQ((*q)->weights().lm_head.dtype(), tensor::DType::kI8);
  for (const auto& m : (*q)->weights().mtp)
    EXPECT_TRUE(m.shared_head_head.empty() || m.shared_head_head.dtype() == tensor::DType::kI8);
  const auto tokens = ids(256, f->config().vocab_size, 3);
  const model::SequenceLogits rf = run(*f, tokens), rq = run(**q, tokens);
  const int64_t V = f->config().vocab_size;
  int agree = 0;
  double worst = 1;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const float* a = &rf.all_logits[t * V];
    const float* b = &rq.all_logits[t * V];
    agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
    worst = std::min(worst, cosine(a, b, V));
  }
  std::printf("int8 lm_head vs BF16: worst logits cosine %.6f, top-1 agreement %.3f\n", worst,
              double(agree) / tokens.size());
  EXPECT_GE(worst, 0.999);
  EXPECT_GE(double(agree) / tokens.size(), 0.9);
}

// ---- Hand-built checkpoints in the upstream layout ----

// Every tensor of a checkpoint directory, copied out.
std::vector<model::TensorToWrite> read_tensors(const std::string& dir) {
  auto ck = model::Checkpoint::open(dir);
  EXPECT_TRUE(ck.ok()) << ck.status().message();
  std::vector<model::TensorToWrite> out;
  for (const std::string& name : (*ck)->tensor_names()) {
    const model::TensorInfo* t = (*ck)->find(name).value();
    out.push_back(
        {name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->size_bytes)});
  }
  return out;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// A writable variant of a quantized fixture: tensors and description to edit, then write().
struct Variant {
  std::string dir;
  std::vector<model::TensorToWrite> tensors;
  json description;

  Variant(const std::string& from, const std::string& name) : dir(temp().sub(name)) {
    tensors = read_tensors(from);
    description = read_json(from + "/" + model::kQuantDescriptionFile);
    fs::create_directories(dir);
    fs::copy_file(from + "/config.json", dir + "/config.json",
                  fs::copy_options::overwrite_existing);
  }
  model::TensorToWrite* find(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return &t;
    ADD_FAILURE() << "no tensor " << name;
    return nullptr;
  }
  void erase(const std::string& name) {
    std::erase_if(tensors, [&](const auto& t) { return t.name == name; });
  }
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
           size_t bytes, const std::string& type) {
    erase(name);
    const auto* p = static_cast<const uint8_t*>(data);
    tensors.push_back({name, dtype, std::move(shape), std::vector<uint8_t>(p, p + bytes)});
    description[name] = type;
  }
  void write() {
    ASSERT_TRUE(model::write_safetensors_checkpoint(dir, tensors, 2, "quant_model_weights").ok());
    std::ofstream(dir + "/" + model::kQuantDescriptionFile) << description.dump();
  }
};

TEST(W8A8FormatTest, EveryTensorTypeLoads) {
  const std::string base = quantized("tiny-bf16", true);
  Variant v(base, "every-type");
  const std::string l1 = "model.layers.1.";
  // W8A8_MIX: the static set and the dynamic set on one layer (o_proj of layer 1).
  {
    const std::string p = l1 + "self_attn.o_proj.";
    const model::TensorToWrite* w = v.find(p + "weight");
    const int64_t rows = w->shape[0], cols = w->shape[1];
    std::vector<float> scale(static_cast<size_t>(rows)), zeros(static_cast<size_t>(rows), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float amax = 0;
      for (int64_t c = 0; c < cols; ++c)
        amax = std::max(amax, std::abs(float(int8_t(w->bytes[size_t(r * cols + c)]))));
      scale[size_t(r)] = 0.01f / std::max(amax, 1.0f);
    }
    v.add(p + "weight_scale", DType::kF32, {rows, 1}, scale.data(), scale.size() * 4, "W8A8_MIX");
    v.add(p + "weight_offset", DType::kF32, {rows, 1}, zeros.data(), zeros.size() * 4, "W8A8_MIX");
    for (const char* side : {"weight", "input_scale", "input_offset", "deq_scale", "quant_bias"})
      v.description[p + side] = "W8A8_MIX";
  }
  // deq_scale as I64 bit patterns on layer 2's kv_a.
  {
    const std::string name = "model.layers.2.self_attn.kv_a_proj_with_mqa.deq_scale";
    model::TensorToWrite* t = v.find(name);
    std::vector<int64_t> bits(t->bytes.size() / 4);
    for (size_t i = 0; i < bits.size(); ++i) {
      uint32_t b;
      std::memcpy(&b, &t->bytes[4 * i], 4);
      bits[i] = int64_t(b);
    }
    v.add(name, DType::kI64, {int64_t(bits.size())}, bits.data(), bits.size() * 8, "W8A8");
  }
  // W4A8_DYNAMIC expert 3 of layer 1: int4 pairs along the output rows, values in [-8, 7].
  std::vector<int8_t> int4_values;
  {
    const std::string p = l1 + "mlp.experts.3.gate_proj.";
    const model::TensorToWrite* w = v.find(p + "weight");
    const int64_t rows = w->shape[0], cols = w->shape[1];
    int4_values.resize(size_t(rows * cols));
    std::vector<uint8_t> packed(size_t(rows / 2 * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        int4_values[size_t(r * cols + c)] = int8_t((r * 5 + c * 3) % 16 - 8);
    for (int64_t j = 0; j < rows / 2; ++j)
      for (int64_t c = 0; c < cols; ++c)
        packed[size_t(j * cols + c)] = uint8_t((int4_values[size_t((2 * j + 1) * cols + c)] << 4) |
                                               (int4_values[size_t(2 * j * cols + c)] & 0xF));
    v.add(p + "weight", DType::kI8, {rows / 2, cols}, packed.data(), packed.size(), "W4A8_DYNAMIC");
    v.description[p + "weight_scale"] = "W4A8_DYNAMIC";
    v.description[p + "weight_offset"] = "W4A8_DYNAMIC";
  }
  // Smoothing biases on layer 0's norms (zeros: the logits must not move).
  const int64_t H = 128;
  std::vector<float> zeros(size_t(H), 0.0f);
  v.add("model.layers.0.input_layernorm.bias", DType::kF32, {H}, zeros.data(), H * 4, "FLOAT");
  // QuaRot: is_rot_used with rot.weight = identity.
  std::vector<float> eye(size_t(H * H), 0.0f);
  for (int64_t i = 0; i < H; ++i) eye[size_t(i * H + i)] = 1.0f;
  v.add("rot.weight", DType::kF32, {H, H}, eye.data(), eye.size() * 4, "FLOAT");
  v.description["is_rot_used"] = true;
  v.write();

  auto m = load(v.dir, "ascend");
  ASSERT_NE(m, nullptr);
  const auto& layer1 = m->weights().layers[1];
  const tensor::WeightView o = layer1.attn.o_proj.view();
  EXPECT_EQ(o.dtype, DType::kI8);
  EXPECT_FALSE(o.quant.static_activation) << "W8A8_MIX runs dynamically";
  {
    // ... except on a decode-only KV consumer, where upstream runs its static set.
    model::LoadOptions consumer;
    consumer.w8a8_mix_static = true;
    auto d = model::DeepseekV3Model::load(v.dir, consumer);
    ASSERT_TRUE(d.ok()) << d.status().message();
    const tensor::WeightView od = (*d)->weights().layers[1].attn.o_proj.view();
    EXPECT_TRUE(od.quant.static_activation);
    EXPECT_NE(od.quant.row_bias, nullptr);
  }
  const tensor::WeightView gu = layer1.moe->experts[3].gate_up.view();
  ASSERT_EQ(gu.dtype, DType::kI8);
  for (int64_t i = 0; i < int64_t(int4_values.size()); ++i)
    ASSERT_EQ(gu.i8()[i], int4_values[size_t(i)]) << "int4 element " << i;
  EXPECT_FALSE(m->weights().mtp_rotation.empty());
  EXPECT_TRUE(m->weights().layers[2].attn.kv_a_proj.view().quant.static_activation);
  // The I64 deq_scale equals the F32 one it was made from.
  auto base_model = load(base);
  ASSERT_NE(base_model, nullptr);
  const auto a = m->weights().layers[2].attn.kv_a_proj.view().quant;
  const auto b = base_model->weights().layers[2].attn.kv_a_proj.view().quant;
  const int64_t n = m->weights().layers[2].attn.kv_a_proj.rows();
  EXPECT_EQ(0, std::memcmp(a.row_scale, b.row_scale, size_t(n) * 4));
  const auto r = run(*m, ids(16, 512, 3));
  EXPECT_EQ(r.all_logits.size(), size_t(16 * 512));
}

TEST(W8A8FormatTest, NormBiasAndRotationAreApplied) {
  const std::string base = quantized("tiny-bf16", false);
  auto plain = load(base);
  ASSERT_NE(plain, nullptr);
  const auto tokens = ids(12, 512, 4);
  const model::SequenceLogits expected = run(*plain, tokens);
  const int64_t H = 128;
  for (const char* what : {"zero bias", "bias", "identity rotation", "rotation"}) {
    Variant v(base, std::string("apply-") + what);
    const std::string s = what;
    if (s.find("bias") != std::string::npos) {
      std::vector<float> bias(size_t(H), s == "bias" ? 0.05f : 0.0f);
      v.add("model.layers.1.post_attention_layernorm.bias", DType::kF32, {H}, bias.data(), H * 4,
            "FLOAT");
    } else {
      // A permutation is orthogonal; it must change the draft (the MTP sees a rotated state).
      std::vector<float> rot(size_t(H * H), 0.0f);
      for (int64_t i = 0; i < H; ++i) rot[size_t(i * H + (s == "rotation" ? (i + 1) % H : i))] = 1;
      v.add("rot.weight", DType::kF32, {H, H}, rot.data(), rot.size() * 4, "FLOAT");
      v.description["is_rot_used"] = true;
    }
    v.write();
    auto m = load(v.dir);
    ASSERT_NE(m, nullptr) << what;
    const model::SequenceLogits got = run(*m, tokens);
    const double d_logits = max_abs_diff(got.all_logits, expected.all_logits);
    const double d_draft = max_abs_diff(got.mtp_draft_logits, expected.mtp_draft_logits);
    if (s == "zero bias" || s == "identity rotation") {
      EXPECT_EQ(d_logits, 0.0) << what;
      EXPECT_EQ(d_draft, 0.0) << what;
    } else if (s == "bias") {
      EXPECT_GT(d_logits, 1e-3) << what;
    } else {
      EXPECT_EQ(d_logits, 0.0) << "the main model does not see rot.weight";
      EXPECT_GT(d_draft, 1e-3) << what;
    }
  }
}

// ---- Corrupt variants: refused, naming the tensor ----

struct Corruption {
  const char* name;
  const char* expected;  // a substring of the error
  void (*apply)(Variant&);
};

const std::string kO = "model.layers.1.self_attn.o_proj.";
const std::string kGate = "model.layers.1.mlp.experts.0.gate_proj.";

const Corruption kCorruptions[] = {
    {"missing weight_scale", "mlp.experts.0.gate_proj.weight_scale",
     [](Variant& v) { v.erase(kGate + "weight_scale"); }},
    {"weight_scale of a wrong dtype", "mlp.experts.0.gate_proj.weight_scale' has dtype I32",
     [](Variant& v) { v.find(kGate + "weight_scale")->dtype = DType::kI32; }},
    {"unknown type", "quantization type 'W2A2'",
     [](Variant& v) { v.description[kGate + "weight"] = "W2A2"; }},
    {"I8 weight listed FLOAT", "o_proj.weight' is I8",
     [](Variant& v) { v.description[kO + "weight"] = "FLOAT"; }},
    {"I8 weight without a type", "o_proj.weight' is in the checkpoint but has no quantization type",
     [](Variant& v) { v.description.erase(kO + "weight"); }},
    {"quant_bias of a wrong dtype", "o_proj.quant_bias' has dtype F32",
     [](Variant& v) { v.find(kO + "quant_bias")->dtype = DType::kF32; }},
    {"missing deq_scale", "o_proj.deq_scale", [](Variant& v) { v.erase(kO + "deq_scale"); }},
    {"weight of a wrong dtype", "o_proj.weight' has dtype BF16",
     [](Variant& v) {
       model::TensorToWrite* t = v.find(kO + "weight");
       t->dtype = DType::kBF16;
       t->shape[1] /= 2;
     }},
    {"kv_b_proj quantized", "kv_b_proj.weight' is listed as W8A8_DYNAMIC",
     [](Variant& v) {
       v.description["model.layers.1.self_attn.kv_b_proj.weight"] = "W8A8_DYNAMIC";
     }},
    {"asymmetric weights", "weight_offset' is non-zero",
     [](Variant& v) {
       model::TensorToWrite* t = v.find(kGate + "weight_offset");
       const float one = 1.0f;
       std::memcpy(t->bytes.data(), &one, 4);
     }},
    {"quantized KV cache", "kv_cache_type 'C8'",
     [](Variant& v) { v.description["kv_cache_type"] = "C8"; }},
};

TEST(W8A8FormatTest, CorruptVariantsAreRefusedNamingTheTensor) {
  const std::string base = quantized("tiny-bf16", true);
  int i = 0;
  for (const Corruption& c : kCorruptions) {
    Variant v(base, "corrupt-" + std::to_string(i++));
    c.apply(v);
    v.write();
    auto m = model::DeepseekV3Model::load(v.dir);
    ASSERT_FALSE(m.ok()) << c.name << " loaded";
    EXPECT_NE(m.status().message().find(c.expected), std::string::npos)
        << c.name << ": " << m.status().message();
  }
}

TEST(W8A8FormatTest, AscendNeedsTheDescriptionAndI8NeedsAscend) {
  auto m = model::DeepseekV3Model::load(fixture("tiny-bf16"), {.quantization = "ascend"});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("quant_model_description.json"), std::string::npos);
  Variant v(quantized("tiny-bf16", false), "no-description");
  v.write();
  fs::remove(v.dir + "/" + model::kQuantDescriptionFile);
  auto n = model::DeepseekV3Model::load(v.dir);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("is I8, but the directory has no"), std::string::npos)
      << n.status().message();
}

// TP shards: column-parallel layers keep their rows' scales; a row-parallel static layer
// (o_proj) adds quant_bias on rank 0 only, so the all-reduce adds it once.
TEST(W8A8FormatTest, TensorParallelShardsSplitScalesAndBias) {
  const std::string dir = quantized("tiny-bf16", true);
  auto whole = load(dir);
  ASSERT_NE(whole, nullptr);
  const auto& w = whole->weights().layers[1].attn;
  for (int rank = 0; rank < 2; ++rank) {
    model::LoadOptions lo;
    lo.tp = {rank, 2, false};
    auto shard = model::DeepseekV3Model::load(dir, lo);
    ASSERT_TRUE(shard.ok()) << shard.status().message();
    const auto& s = (*shard)->weights().layers[1].attn;
    // q_b_proj: this rank's half of the rows, with their scales.
    const int64_t half = w.q_b_proj.rows() / 2;
    ASSERT_EQ(s.q_b_proj.rows(), half);
    EXPECT_EQ(0, std::memcmp(s.q_b_proj.view().quant.row_scale,
                             w.q_b_proj.view().quant.row_scale + rank * half, size_t(half) * 4));
    EXPECT_EQ(0, std::memcmp(s.q_b_proj.view().data,
                             w.q_b_proj.view().i8() + rank * half * w.q_b_proj.cols(),
                             size_t(half * w.q_b_proj.cols())));
    // o_proj: half of the columns, every row, the bias on rank 0 only.
    const tensor::WeightView so = s.o_proj.view(), wo = w.o_proj.view();
    ASSERT_EQ(so.cols, wo.cols / 2);
    ASSERT_TRUE(so.quant.static_activation);
    bool any_bias = false;
    for (int64_t r = 0; r < so.rows; ++r) {
      EXPECT_EQ(so.quant.row_bias[r], rank == 0 ? wo.quant.row_bias[r] : 0) << "row " << r;
      any_bias |= wo.quant.row_bias[r] != 0;
      EXPECT_EQ(so.quant.row_scale[r], wo.quant.row_scale[r]);
    }
    EXPECT_TRUE(any_bias) << "the calibrated offset gives o_proj a quant_bias";
  }
}

TEST(W8A8FormatTest, QuantizerRefusesAQuantizedSource) {
  const common::Status st =
      model::write_w8a8_checkpoint(quantized("tiny-bf16", false), temp().sub("twice"), {}, pool());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("already holds a W8A8 checkpoint"), std::string::npos);
}

}  // namespace
