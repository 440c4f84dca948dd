// The AVX2 traits of the blocked MLA attention kernels (mla_flash.h, mla_decode_flash.h): 8
// lanes, 3 queries × 4 key vectors per prefill register tile (12 accumulators, 3 broadcasts and a
// key in 16 registers), and exp8. Internal linkage: each including file builds its own copy.
#pragma once

#include <immintrin.h>

#include "kernels/simd.h"
#include "kernels/vec_exp.h"

namespace kernels::detail {
namespace {

struct Avx2 {
  using Vec = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kRows = 3;
  static constexpr bool kBf16Pairs = false;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256i prefix_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Vec load_n(const float* p, int n) {
    if (n <= 0) return zero();
    return n >= kWidth ? load(p) : _mm256_maskload_ps(p, prefix_mask(n));
  }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Vec fill_from(Vec v, int n, float x) {
    if (n >= kWidth) return v;
    return _mm256_blendv_ps(_mm256_set1_ps(x), v, _mm256_castsi256_ps(prefix_mask(n)));
  }
  static float hmax(Vec v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  static float hsum(Vec v) { return simd::hsum(v); }
  static Vec exp(Vec v) { return exp8(v); }
  // Lane l = the sum of v[l]'s lanes, in a fixed order: pairs within 128-bit lanes, then the
  // two 128-bit lanes.
  static Vec transpose_sum(const Vec (&v)[kWidth]) {
    Vec a[4], b[2];
    for (int i = 0; i < 4; ++i) {
      a[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                           _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    }
    for (int i = 0; i < 2; ++i) {
      const __m256d x = _mm256_castps_pd(a[2 * i]), y = _mm256_castps_pd(a[2 * i + 1]);
      b[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)),
                           _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20),
                         _mm256_permute2f128_ps(b[0], b[1], 0x31));
  }
};

}  // namespace
}  // namespace kernels::detail
