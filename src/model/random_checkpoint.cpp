// Random checkpoint tensors by table lookup: 16-bit uniform draws (splitmix64, four per draw)
// index 65536 quantiles of the standard normal, precomputed as f32 and as e4m3 codes of 112σ
// (448, e4m3's largest value, is 4σ), which costs about a nanosecond per value where sampling a
// normal and searching its FP8 code cost tens.
#include "model/random_checkpoint.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <future>
#include <string>

#include "tensor/dtype.h"

namespace model {
namespace {

using tensor::DType;

constexpr int64_t kPieceBytes = int64_t{16} << 20;  // bytes produced per sink call, at most
constexpr float kFp8Sigma = 112.0f;                 // the codes' standard deviation

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct NormalTables {
  std::array<float, 65536> value;  // Φ⁻¹((u + 0.5) / 65536)
  std::array<uint8_t, 65536> fp8;  // the nearest e4m3 code of 112 · value
  NormalTables() {
    for (int u = 0; u < 65536; ++u) {
      const double p = (u + 0.5) / 65536.0;
      double lo = -10, hi = 10;  // Φ(x) = erfc(-x / √2) / 2, increasing: bisect
      for (int it = 0; it < 60; ++it) {
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
      }
      value[u] = static_cast<float>(0.5 * (lo + hi));
      fp8[u] = tensor::f32_to_fp8_e4m3(kFp8Sigma * value[u]);
    }
  }
};

const NormalTables& tables() {
  static const NormalTables t;
  return t;
}

// One tensor's generator: what each row holds.
enum class Fill { kNormal, kFp8Codes, kNorm, kBias };

struct Spec {
  std::string name;
  DType dtype;
  int64_t rows, cols;  // a vector is [cols] with rows == 1
  Fill fill;
  float stddev = 1.0f;
  bool vector = false;
};

// Row r of tensor `id`: its elements in `dtype`, into out.
void fill_row(const Spec& s, uint64_t id_seed, int64_t r, uint8_t* out) {
  const NormalTables& t = tables();
  uint64_t state = mix(id_seed ^ (uint64_t(r) * 0x9E3779B97F4A7C15ull));
  uint64_t draw = 0;
  int left = 0;
  auto next16 = [&]() -> uint32_t {
    if (left == 0) {
      draw = mix(state += 0x9E3779B97F4A7C15ull);
      left = 4;
    }
    --left;
    const uint32_t v = uint32_t(draw & 0xffff);
    draw >>= 16;
    return v;
  };
  for (int64_t c = 0; c < s.cols; ++c) {
    float v = 0;
    switch (s.fill) {
      case Fill::kFp8Codes:
        out[c] = t.fp8[next16()];
        continue;
      case Fill::kNormal:
        v = s.stddev * t.value[next16()];
        break;
      case Fill::kNorm:
        v = 0.8f + 0.4f * float(next16()) / 65536.0f;
        break;
      case Fill::kBias:
        v = 0.2f * float(next16()) / 65536.0f;
        break;
    }
    if (s.dtype == DType::kBF16) {
      const uint16_t bits = tensor::f32_to_bf16(v);
      std::memcpy(out + 2 * c, &bits, 2);
    } else {
      std::memcpy(out + 4 * c, &v, 4);
    }
  }
}

// The power-of-two block scales of an FP8 weight of standard deviation `stddev`: 2^e with e the
// nearest whole log2 of stddev / 112, one lower in every other block (by hash), so that the
// kernels meet different scales side by side.
void fill_scales(int64_t blocks_r, int64_t blocks_c, float stddev, uint64_t id_seed, float* out) {
  const int e = static_cast<int>(std::lround(std::log2(stddev / kFp8Sigma)));
  for (int64_t i = 0; i < blocks_r * blocks_c; ++i)
    out[i] = std::ldexp(1.0f, e - int(mix(id_seed + uint64_t(i)) & 1));
}

TensorSource source(const Spec& s, uint64_t seed, uint64_t id, common::ThreadPool& pool) {
  const int64_t elem = tensor::dtype_size_bytes(s.dtype);
  const int64_t row_bytes = s.cols * elem;
  TensorSource src{s.name, s.dtype,
                   s.vector ? std::vector<int64_t>{s.cols} : std::vector<int64_t>{s.rows, s.cols},
                   size_t(s.rows * row_bytes), nullptr};
  const uint64_t id_seed = mix(seed * 0x9E3779B97F4A7C15ull + id);
  // Two pieces in turn: the pool fills the next one (from a helper thread) while the sink
  // writes the last, so that generating and writing overlap.
  src.produce = [s, row_bytes, id_seed, &pool](const TensorSource::Sink& sink) {
    const int64_t rows_per_piece =
        std::max<int64_t>(1, kPieceBytes / std::max<int64_t>(row_bytes, 1));
    const size_t piece_bytes = size_t(std::min(s.rows, rows_per_piece) * row_bytes);
    std::vector<uint8_t> pieces[2] = {std::vector<uint8_t>(piece_bytes),
                                      std::vector<uint8_t>(piece_bytes)};
    auto fill = [&](int64_t r0, uint8_t* out) {
      const int64_t r1 = std::min(s.rows, r0 + rows_per_piece);
      pool.parallel_for(r1 - r0, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) fill_row(s, id_seed, r0 + r, out + r * row_bytes);
      });
    };
    fill(0, pieces[0].data());
    for (int64_t r0 = 0, turn = 0; r0 < s.rows; r0 += rows_per_piece, turn ^= 1) {
      const int64_t next = r0 + rows_per_piece;
      std::future<void> filling;
      if (next < s.rows)
        filling = std::async(std::launch::async, fill, next, pieces[turn ^ 1].data());
      sink(pieces[turn].data(), size_t((std::min(s.rows, next) - r0) * row_bytes));
      if (filling.valid()) filling.get();
    }
  };
  return src;
}

TensorSource scale_source(const std::string& name, int64_t rows, int64_t cols, float stddev,
                          uint64_t seed, uint64_t id) {
  const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
  const uint64_t id_seed = mix(seed * 0x9E3779B97F4A7C15ull + id);
  TensorSource src{name, DType::kF32, {br, bc}, size_t(br * bc * 4), nullptr};
  src.produce = [=](const TensorSource::Sink& sink) {
    std::vector<float> scales(size_t(br * bc));
    fill_scales(br, bc, stddev, id_seed, scales.data());
    sink(reinterpret_cast<const uint8_t*>(scales.data()), scales.size() * 4);
  };
  return src;
}

class Builder {
 public:
  Builder(uint64_t seed, bool fp8, common::ThreadPool& pool)
      : seed_(seed), fp8_(fp8), pool_(pool) {}

  void linear(const std::string& name, int64_t rows, int64_t cols) {
    const float stddev = 1.0f / std::sqrt(float(cols));
    if (!fp8_) return add({name, DType::kBF16, rows, cols, Fill::kNormal, stddev});
    add({name, DType::kF8E4M3, rows, cols, Fill::kFp8Codes, stddev});
    out_.push_back(scale_source(name.substr(0, name.size() - 6) + "weight_scale_inv", rows, cols,
                                stddev, seed_, next_id_++));
  }
  void bf16_matrix(const std::string& name, int64_t rows, int64_t cols, float stddev) {
    add({name, DType::kBF16, rows, cols, Fill::kNormal, stddev});
  }
  void norm(const std::string& name, int64_t n) {
    add({name, DType::kBF16, 1, n, Fill::kNorm, 1.0f, true});
  }
  void bias(const std::string& name, int64_t n) {
    add({name, DType::kF32, 1, n, Fill::kBias, 1.0f, true});
  }
  void mlp(const std::string& p, int64_t inter, int64_t h) {
    linear(p + "gate_proj.weight", inter, h);
    linear(p + "up_proj.weight", inter, h);
    linear(p + "down_proj.weight", h, inter);
  }
  void layer(const ModelConfig& c, int l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int64_t h = c.hidden_size, nh = c.num_attention_heads, r = c.kv_lora_rank;
    norm(p + "input_layernorm.weight", h);
    norm(p + "post_attention_layernorm.weight", h);
    if (c.q_lora_rank) {
      linear(p + "self_attn.q_a_proj.weight", *c.q_lora_rank, h);
      norm(p + "self_attn.q_a_layernorm.weight", *c.q_lora_rank);
      linear(p + "self_attn.q_b_proj.weight", nh * c.qk_head_dim(), *c.q_lora_rank);
    } else {
      linear(p + "self_attn.q_proj.weight", nh * c.qk_head_dim(), h);
    }
    linear(p + "self_attn.kv_a_proj_with_mqa.weight", r + c.qk_rope_head_dim, h);
    norm(p + "self_attn.kv_a_layernorm.weight", r);
    linear(p + "self_attn.kv_b_proj.weight", nh * (c.qk_nope_head_dim + c.v_head_dim), r);
    linear(p + "self_attn.o_proj.weight", h, nh * c.v_head_dim);
    if (!c.is_moe_layer(l)) return mlp(p + "mlp.", c.intermediate_size, h);
    bf16_matrix(p + "mlp.gate.weight", c.n_routed_experts, h, 1.0f / std::sqrt(float(h)));
    if (c.topk_method == kernels::TopkMethod::kNoauxTc)
      bias(p + "mlp.gate.e_score_correction_bias", c.n_routed_experts);
    for (int e = 0; e < c.n_routed_experts; ++e)
      mlp(p + "mlp.experts." + std::to_string(e) + ".", c.moe_intermediate_size, h);
    if (c.n_shared_experts > 0)
      mlp(p + "mlp.shared_experts.", c.moe_intermediate_size * c.n_shared_experts, h);
  }
  std::vector<TensorSource> take() { return std::move(out_); }

 private:
  void add(const Spec& s) { out_.push_back(source(s, seed_, next_id_++, pool_)); }

  uint64_t seed_;
  bool fp8_;
  common::ThreadPool& pool_;
  uint64_t next_id_ = 0;
  std::vector<TensorSource> out_;
};

}  // namespace

std::vector<TensorSource> random_checkpoint_tensors(const ModelConfig& c, uint64_t seed, bool fp8,
                                                    common::ThreadPool& pool) {
  Builder b(seed, fp8, pool);
  const int64_t h = c.hidden_size, v = c.vocab_size;
  b.bf16_matrix("model.embed_tokens.weight", v, h, 1.0f);
  b.bf16_matrix("lm_head.weight", v, h, 1.0f / std::sqrt(float(h)));
  b.norm("model.norm.weight", h);
  for (int l = 0; l < c.num_hidden_layers; ++l) b.layer(c, l);
  for (int k = 0; k < c.num_nextn_predict_layers; ++k) {
    const int l = c.num_hidden_layers + k;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    b.norm(p + "enorm.weight", h);
    b.norm(p + "hnorm.weight", h);
    b.norm(p + "shared_head.norm.weight", h);
    b.bf16_matrix(p + "eh_proj.weight", h, 2 * h, 1.0f / std::sqrt(float(2 * h)));
    b.layer(c, l);
  }
  return b.take();
}

}  // namespace model
