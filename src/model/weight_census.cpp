// Walks every matrix and vector of a ModelWeights and adds up its bytes by dtype.
#include "model/weight_census.h"

#include <cstdio>

namespace model {
namespace {

class Counter {
 public:
  void add(const tensor::WeightMatrix& m) {
    if (m.empty()) return;
    const int64_t bytes = int64_t(m.size_bytes());
    switch (m.dtype()) {
      case tensor::DType::kBF16:
        c_.bf16_bytes += bytes;
        break;
      case tensor::DType::kF8E4M3:
        c_.fp8_bytes += bytes + int64_t(m.fp8_scale_count() * sizeof(float));
        break;
      case tensor::DType::kI8:  // per-row scale and row sum (and static bias) beside the codes
        c_.i8_bytes += bytes + m.rows() * 12;
        break;
      default:
        c_.f32_bytes += bytes;
    }
  }
  void add(const Vector& v) { c_.f32_bytes += int64_t(v.size() * sizeof(float)); }
  void add(const MlpWeights& w) {
    add(w.gate_up);
    add(w.down);
  }
  void add(const DecoderLayerWeights& l) {
    for (const Vector* v : {&l.input_layernorm, &l.post_attention_layernorm,
                            &l.input_layernorm_bias, &l.post_attention_layernorm_bias})
      add(*v);
    const AttentionWeights& a = l.attn;
    for (const tensor::WeightMatrix* m : {&a.q_a_proj, &a.q_b_proj, &a.q_proj, &a.kv_a_proj,
                                          &a.kv_b_proj, &a.o_proj, &a.absorb_uk_t, &a.absorb_uv})
      add(*m);
    for (const Vector* v :
         {&a.q_a_layernorm, &a.q_a_layernorm_bias, &a.kv_a_layernorm, &a.kv_a_layernorm_bias})
      add(*v);
    if (l.dense_mlp) add(*l.dense_mlp);
    if (l.moe) {
      add(l.moe->router);
      add(l.moe->correction_bias);
      for (const MlpWeights& e : l.moe->experts) add(e);
      if (l.moe->shared) add(*l.moe->shared);
    }
  }
  WeightCensus result() const { return c_; }

 private:
  WeightCensus c_;
};

}  // namespace

std::string gib_text(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f GiB", double(bytes) / double(int64_t{1} << 30));
  return buf;
}

WeightCensus weight_census(const ModelWeights& w) {
  Counter c;
  c.add(w.embed_tokens);
  c.add(w.lm_head);
  c.add(w.norm);
  c.add(w.mtp_rotation);
  for (const DecoderLayerWeights& l : w.layers) c.add(l);
  for (const MtpWeights& m : w.mtp) {
    for (const Vector* v : {&m.enorm, &m.hnorm, &m.shared_head_norm}) c.add(*v);
    c.add(m.eh_proj);
    c.add(m.embed_tokens);
    c.add(m.shared_head_head);
    c.add(m.layer);
  }
  return c.result();
}

std::string census_line(const WeightCensus& c) {
  std::string line = "weights " + gib_text(c.total()) + ":";
  const char* sep = " ";
  auto part = [&](const char* name, int64_t bytes) {
    if (bytes == 0) return;
    line += sep + std::string(name) + " " + gib_text(bytes);
    sep = ", ";
  };
  part("FP8", c.fp8_bytes);
  part("I8", c.i8_bytes);
  part("BF16", c.bf16_bytes);
  part("F32", c.f32_bytes);
  return line;
}

}  // namespace model
