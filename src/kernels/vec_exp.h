// exp of 8 floats at once (AVX2 + FMA), for softmax rows: Cody-Waite range reduction by ln 2
// and a degree-6 polynomial (Cephes expf), within 2 ulp of std::exp over [-87, 88]; inputs below
// -87.3 give 0 (the largest softmax input is 0, so such terms are below f32's resolution).
// Pure; thread-safe.
#pragma once

#include <immintrin.h>

namespace kernels {

// The constants of exp8, shared with its 16-lane twin (mla_attention_avx512.cpp) so that both
// paths compute the same function.
namespace exp_constants {
inline constexpr float kLo = -87.3f, kHi = 88.7f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
// Degree-6 polynomial, highest coefficient first.
inline constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_constants

inline __m256 exp8(__m256 x) {
  using namespace exp_constants;
  const __m256 lo = _mm256_set1_ps(kLo), hi = _mm256_set1_ps(kHi);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  // x = n·ln2 + r, |r| <= ln2/2
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // · 2^n through the exponent bits
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

}  // namespace kernels
