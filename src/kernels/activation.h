// SwiGLU gating: out[r, i] = silu(gu[r, i]) · gu[r, inter + i] over rows of a fused
// [gate | up] projection. Stateless; thread-safe for distinct outputs.
#pragma once

#include <cstdint>

namespace kernels {

void silu_mul(const float* gate_up, int64_t rows, int64_t inter, float* out);
void silu_mul_reference(const float* gate_up, int64_t rows, int64_t inter, float* out);

}  // namespace kernels
