// RMSNorm: AVX2 version and its scalar double-precision reference.
#include "kernels/norm.h"

#include <immintrin.h>

#include <cmath>

namespace kernels {

void rms_norm(const float* x, int64_t rows, int64_t n, int64_t stride, const float* weight,
              float eps, float* out, int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * stride;
    float* yr = out + r * out_stride;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      __m256 a = _mm256_loadu_ps(xr + i), b = _mm256_loadu_ps(xr + i + 8);
      acc0 = _mm256_fmadd_ps(a, a, acc0);
      acc1 = _mm256_fmadd_ps(b, b, acc1);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, _mm256_add_ps(acc0, acc1));
    double sum = 0.0;
    for (float v : lanes) sum += v;
    for (; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
    const __m256 vinv = _mm256_set1_ps(inv);
    i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xr + i), vinv);
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(v, _mm256_loadu_ps(weight + i)));
    }
    for (; i < n; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

void rms_norm_reference(const float* x, int64_t rows, int64_t n, int64_t stride,
                        const float* weight, float eps, float* out, int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i)
      sum += static_cast<double>(x[r * stride + i]) * x[r * stride + i];
    const double inv = 1.0 / std::sqrt(sum / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) {
      out[r * out_stride + i] = static_cast<float>(x[r * stride + i] * inv * weight[i]);
    }
  }
}

}  // namespace kernels
