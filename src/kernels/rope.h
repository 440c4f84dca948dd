// Rotary position embedding with YaRN scaling (DeepSeek-V3 §5), applied to interleaved pairs
// (x[2i], x[2i+1]) as the checkpoint stores them. RopeParams is immutable once computed.
#pragma once

#include <cstdint>
#include <vector>

namespace kernels {

struct YarnConfig {
  bool enabled = false;  // rope_scaling present with type yarn
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct RopeParams {
  std::vector<double> inv_freq;  // [rope_dim / 2]
  double cos_sin_scale = 1.0;    // YaRN attention factor applied to cos and sin
  double softmax_scale = 1.0;    // qk_head_dim^-0.5 · mscale(factor, mscale_all_dim)²
};

double yarn_get_mscale(double scale, double mscale);
RopeParams compute_rope_params(int rope_dim, double rope_theta, int qk_head_dim,
                               const YarnConfig& yarn);

// Rotates, for each token t and head h, the rope_dim floats at
// x + t * token_stride + h * head_stride, by angle positions[t] · inv_freq[i] per pair i.
void apply_rope(float* x, int64_t num_tokens, int num_heads, int64_t token_stride,
                int64_t head_stride, const int32_t* positions, const RopeParams& params);
void apply_rope_reference(float* x, int64_t num_tokens, int num_heads, int64_t token_stride,
                          int64_t head_stride, const int32_t* positions, const RopeParams& params);

}  // namespace kernels
