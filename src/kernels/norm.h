// RMSNorm over rows: out[r] = x[r] · rsqrt(mean(x[r]²) + eps) · weight, in f32 (in place allowed).
// Stateless; thread-safe for distinct outputs.
#pragma once

#include <cstdint>

namespace kernels {

// x and out have row stride `stride` (>= n).
void rms_norm(const float* x, int64_t rows, int64_t n, int64_t stride, const float* weight,
              float eps, float* out, int64_t out_stride);
void rms_norm_reference(const float* x, int64_t rows, int64_t n, int64_t stride,
                        const float* weight, float eps, float* out, int64_t out_stride);

}  // namespace kernels
