// The AVX-512 traits of the blocked MLA prefill attention (mla_flash.h): 16 lanes, 6 queries
// × 64 keys per register tile (24 accumulators), and exp16 with exp8's constants, so both f32
// ISA paths agree to rounding order. Include it only after a file's AVX-512 target pragma: the
// traits have internal linkage, so each including file builds its own copy for its target.
#pragma once

#include <immintrin.h>

#include "kernels/vec_exp512.h"

namespace kernels::detail {
namespace {

struct Avx512 {
  using Vec = __m512;
  static constexpr int kWidth = 16;
  static constexpr int kRows = 6;
  static constexpr bool kBf16Pairs = false;
  static __mmask16 prefix(int n) {
    if (n <= 0) return 0;
    return n >= kWidth ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
  }
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(prefix(n), p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Vec fill_from(Vec v, int n, float x) {
    return _mm512_mask_blend_ps(prefix(n), _mm512_set1_ps(x), v);
  }
  static float hmax(Vec v) { return _mm512_reduce_max_ps(v); }
  static float hsum(Vec v) { return _mm512_reduce_add_ps(v); }
  static Vec exp(Vec x) { return exp16(x); }  // exp8's function on 16 lanes (vec_exp512.h)
  // Lane l = the sum of v[l]'s lanes, in a fixed order: pairs within 128-bit lanes, then the
  // four 128-bit lanes (45 instructions for what 16 separate reductions do in about 130).
  static Vec transpose_sum(const Vec (&v)[kWidth]) {
    Vec a[8], b[4];
    for (int i = 0; i < 8; ++i) {
      a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                           _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    }
    for (int i = 0; i < 4; ++i) {
      const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
      b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const Vec d01 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88),
                                  _mm512_shuffle_f32x4(b[0], b[1], 0xdd));
    const Vec d23 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88),
                                  _mm512_shuffle_f32x4(b[2], b[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d01, d23, 0x88),
                         _mm512_shuffle_f32x4(d01, d23, 0xdd));
  }
};

}  // namespace
}  // namespace kernels::detail
