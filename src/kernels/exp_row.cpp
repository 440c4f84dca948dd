// exp over a row in double (sampler weights, log-softmax sums): AVX2, four lanes (eight on
// AVX-512: exp_row_avx512.cpp, the same bits), and std::exp references. By hand: libm is scalar
// (~20 ns a call, half of a sampled token's cost over a 129k vocabulary), and neither OpenBLAS nor
// oneDNN has a vector double exp. x = n·ln2 + r (ln2 in fdlibm's hi/lo split), |r| <= ln2/2, Taylor
// to degree 13 (truncation < 1e-17), and 2^n in two factors so that subnormal results keep their
// exponent.
#include "kernels/exp_row.h"

#include <immintrin.h>

#include <cmath>

#include "kernels/cpu_features.h"
#include "kernels/exp_row_paths.h"

namespace kernels {
namespace {

using namespace detail::exp_constants;

// 2^n for n in [-1022, 1023], one per lane.
__m256d pow2(__m128i n) {
  const __m256i biased = _mm256_add_epi64(_mm256_cvtepi32_epi64(n), _mm256_set1_epi64x(1023));
  return _mm256_castsi256_pd(_mm256_slli_epi64(biased, 52));
}

// Inlined so that the loops below run two of its dependent chains of 13 FMAs side by side.
inline __attribute__((always_inline)) __m256d exp4(__m256d x) {
  const __m256d zero_mask =  // NaN, or below the last subnormal
      _mm256_or_pd(_mm256_cmp_pd(x, x, _CMP_UNORD_Q),
                   _mm256_cmp_pd(x, _mm256_set1_pd(kMin), _CMP_LT_OQ));
  const __m256d overflow = _mm256_cmp_pd(x, _mm256_set1_pd(kMax), _CMP_GT_OQ);
  x = _mm256_min_pd(_mm256_max_pd(x, _mm256_set1_pd(kMin)), _mm256_set1_pd(kMax));
  const __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(kLog2e)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(kLn2Hi), x);
  r = _mm256_fnmadd_pd(n, _mm256_set1_pd(kLn2Lo), r);
  __m256d p = _mm256_set1_pd(kCoefficients.c[0]);
  for (int i = 1; i < kDegree - 1; ++i)
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kCoefficients.c[i]));
  // exp(r) = 1 + r + r²·p(r)
  p = _mm256_fmadd_pd(_mm256_mul_pd(r, r), p, _mm256_add_pd(r, _mm256_set1_pd(1.0)));
  // n lies in [-1075, 1024]: two factors 2^(n/2) keep each exponent normal.
  const __m128i ni = _mm256_cvtpd_epi32(n);
  const __m128i half = _mm_srai_epi32(ni, 1);
  const __m256d scaled = _mm256_mul_pd(_mm256_mul_pd(p, pow2(half)), pow2(_mm_sub_epi32(ni, half)));
  const __m256d result = _mm256_blendv_pd(scaled, _mm256_set1_pd(HUGE_VAL), overflow);
  return _mm256_andnot_pd(zero_mask, result);
}

}  // namespace

void exp_shifted(const float* x, int64_t n, float shift, double scale, double* out) {
  if (cpu_features().avx512) return detail::exp_shifted_avx512(x, n, shift, scale, out);
  const __m128 vshift = _mm_set1_ps(shift);
  const __m256d vscale = _mm256_set1_pd(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256d d0 = _mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(x + i), vshift));
    const __m256d d1 = _mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(x + i + 4), vshift));
    _mm256_storeu_pd(out + i, exp4(_mm256_mul_pd(d0, vscale)));
    _mm256_storeu_pd(out + i + 4, exp4(_mm256_mul_pd(d1, vscale)));
  }
  for (; i + 4 <= n; i += 4) {
    const __m256d d = _mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(x + i), vshift));
    _mm256_storeu_pd(out + i, exp4(_mm256_mul_pd(d, vscale)));
  }
  if (i < n) {  // the tail through the same lanes, so every element gets the same function
    float in[4] = {0, 0, 0, 0};
    double res[4];
    for (int64_t j = i; j < n; ++j) in[j - i] = x[j];
    const __m256d d = _mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(in), vshift));
    _mm256_storeu_pd(res, exp4(_mm256_mul_pd(d, vscale)));
    for (int64_t j = i; j < n; ++j) out[j] = res[j - i];
  }
}

double sum_exp_shifted(const float* x, int64_t n, double shift) {
  if (cpu_features().avx512) return detail::sum_exp_shifted_avx512(x, n, shift);
  const __m256d vshift = _mm256_set1_pd(shift);
  __m256d acc = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {  // NaN lanes come out 0
    acc = _mm256_add_pd(acc, exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), vshift)));
    acc1 =
        _mm256_add_pd(acc1, exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)), vshift)));
  }
  acc = _mm256_add_pd(acc, acc1);
  for (; i + 4 <= n; i += 4)
    acc = _mm256_add_pd(acc, exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), vshift)));
  if (i < n) {
    float in[4];
    for (int64_t j = 0; j < 4; ++j) in[j] = i + j < n ? x[i + j] : std::nanf("");
    acc = _mm256_add_pd(acc, exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(in)), vshift)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, acc);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

void exp_shifted_reference(const float* x, int64_t n, float shift, double scale, double* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = x[i] - shift;
    out[i] = std::isnan(d) ? 0.0 : std::exp(static_cast<double>(d) * scale);
  }
}

double sum_exp_shifted_reference(const float* x, int64_t n, double shift) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(x[i])) sum += std::exp(static_cast<double>(x[i]) - shift);
  return sum;
}

}  // namespace kernels
