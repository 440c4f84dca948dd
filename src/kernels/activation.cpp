// SwiGLU activation. exp() dominates; the loop is simple enough for the compiler to vectorize.
#include "kernels/activation.h"

#include <cmath>

namespace kernels {

void silu_mul(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * inter;
    const float* u = g + inter;
    float* o = out + r * inter;
    for (int64_t i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void silu_mul_reference(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inter; ++i) {
      double g = gate_up[r * 2 * inter + i], u = gate_up[r * 2 * inter + inter + i];
      out[r * inter + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
    }
  }
}

}  // namespace kernels
