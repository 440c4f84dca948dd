// YaRN frequency blend and the interleaved rotation. The fast path computes cos/sin once per
// token (in double, so large positions keep their precision) and reuses them for every head.
#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kernels {

double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

RopeParams compute_rope_params(int rope_dim, double rope_theta, int qk_head_dim,
                               const YarnConfig& yarn) {
  RopeParams p;
  const int half = rope_dim / 2;
  p.inv_freq.resize(half);
  p.softmax_scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim));
  std::vector<double> extra(half), inter(half);
  for (int i = 0; i < half; ++i) {
    extra[i] = 1.0 / std::pow(rope_theta, 2.0 * i / rope_dim);
    inter[i] = extra[i] / yarn.factor;
  }
  if (!yarn.enabled) {
    p.inv_freq = extra;
    return p;
  }
  auto corr_dim = [&](double num_rotations) {
    return rope_dim *
           std::log(yarn.original_max_position_embeddings /
                    (num_rotations * 2 * std::numbers::pi)) /
           (2 * std::log(rope_theta));
  };
  double low = std::max(std::floor(corr_dim(yarn.beta_fast)), 0.0);
  double high = std::min(std::ceil(corr_dim(yarn.beta_slow)), static_cast<double>(rope_dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    p.inv_freq[i] = inter[i] * ramp + extra[i] * (1.0 - ramp);
  }
  p.cos_sin_scale =
      yarn_get_mscale(yarn.factor, yarn.mscale) / yarn_get_mscale(yarn.factor, yarn.mscale_all_dim);
  if (yarn.mscale_all_dim != 0.0) {
    double m = yarn_get_mscale(yarn.factor, yarn.mscale_all_dim);
    p.softmax_scale *= m * m;
  }
  return p;
}

void apply_rope(float* x, int64_t num_tokens, int num_heads, int64_t token_stride,
                int64_t head_stride, const int32_t* positions, const RopeParams& params) {
  const size_t half = params.inv_freq.size();
  std::vector<float> cos_t(half), sin_t(half);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (size_t i = 0; i < half; ++i) {
      double angle = positions[t] * params.inv_freq[i];
      cos_t[i] = static_cast<float>(std::cos(angle) * params.cos_sin_scale);
      sin_t[i] = static_cast<float>(std::sin(angle) * params.cos_sin_scale);
    }
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + t * token_stride + h * head_stride;
      for (size_t i = 0; i < half; ++i) {
        float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cos_t[i] - b * sin_t[i];
        v[2 * i + 1] = a * sin_t[i] + b * cos_t[i];
      }
    }
  }
}

void apply_rope_reference(float* x, int64_t num_tokens, int num_heads, int64_t token_stride,
                          int64_t head_stride, const int32_t* positions, const RopeParams& params) {
  const size_t half = params.inv_freq.size();
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + t * token_stride + h * head_stride;
      for (size_t i = 0; i < half; ++i) {
        double angle = positions[t] * params.inv_freq[i];
        double c = std::cos(angle) * params.cos_sin_scale,
               s = std::sin(angle) * params.cos_sin_scale;
        double a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = static_cast<float>(a * c - b * s);
        v[2 * i + 1] = static_cast<float>(a * s + b * c);
      }
    }
  }
}

}  // namespace kernels
