// The AVX-512 exp row: exp_row.cpp's algorithm (Cody-Waite reduction, Taylor to degree 13) on
// eight doubles, with vscalef for 2^n (exact in the normal range, one rounding into subnormals,
// as the AVX2 path's two factors), so both paths give the same bits. Tails run through masked
// loads and stores. Compiled for AVX-512 by a target pragma over this file's functions; runs
// only when cpu_features().avx512 is set. Thread-safe.
#include <cmath>
#include <cstdint>

#include "kernels/exp_row_paths.h"
#include "kernels/simd.h"  // <immintrin.h> without GCC 12's false warnings in its AVX-512 parts
#include "kernels/target_region.h"

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq")

namespace kernels::detail {
namespace {

using namespace exp_constants;

inline __attribute__((always_inline)) __m512d exp8(__m512d x) {
  const __mmask8 zero = _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q) |  // NaN, or below the last
                        _mm512_cmp_pd_mask(x, _mm512_set1_pd(kMin), _CMP_LT_OQ);  // subnormal
  const __mmask8 overflow = _mm512_cmp_pd_mask(x, _mm512_set1_pd(kMax), _CMP_GT_OQ);
  x = _mm512_min_pd(_mm512_max_pd(x, _mm512_set1_pd(kMin)), _mm512_set1_pd(kMax));
  const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(kLog2e)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(kLn2Hi), x);
  r = _mm512_fnmadd_pd(n, _mm512_set1_pd(kLn2Lo), r);
  __m512d p = _mm512_set1_pd(kCoefficients.c[0]);
  for (int i = 1; i < kDegree - 1; ++i)
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kCoefficients.c[i]));
  p = _mm512_fmadd_pd(_mm512_mul_pd(r, r), p, _mm512_add_pd(r, _mm512_set1_pd(1.0)));
  const __m512d scaled = _mm512_scalef_pd(p, n);
  return _mm512_maskz_mov_pd(static_cast<__mmask8>(~zero),
                             _mm512_mask_blend_pd(overflow, scaled, _mm512_set1_pd(HUGE_VAL)));
}

// Lanes [0, count) of a tail, count in [1, 8).
inline __mmask8 first(int64_t count) {
  return static_cast<__mmask8>((1u << count) - 1);
}

}  // namespace

void exp_shifted_avx512(const float* x, int64_t n, float shift, double scale, double* out) {
  const __m256 vshift = _mm256_set1_ps(shift);
  const __m512d vscale = _mm512_set1_pd(scale);
  auto row = [&](__m256 v) {
    return exp8(_mm512_mul_pd(_mm512_cvtps_pd(_mm256_sub_ps(v, vshift)), vscale));
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {  // two chains side by side
    _mm512_storeu_pd(out + i, row(_mm256_loadu_ps(x + i)));
    _mm512_storeu_pd(out + i + 8, row(_mm256_loadu_ps(x + i + 8)));
  }
  for (; i + 8 <= n; i += 8) _mm512_storeu_pd(out + i, row(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __mmask8 m = first(n - i);
    _mm512_mask_storeu_pd(out + i, m, row(_mm256_maskz_loadu_ps(m, x + i)));
  }
}

double sum_exp_shifted_avx512(const float* x, int64_t n, double shift) {
  const __m512d vshift = _mm512_set1_pd(shift);
  auto term = [&](__m256 v) { return exp8(_mm512_sub_pd(_mm512_cvtps_pd(v), vshift)); };
  __m512d acc = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {  // NaN lanes come out 0
    acc = _mm512_add_pd(acc, term(_mm256_loadu_ps(x + i)));
    acc1 = _mm512_add_pd(acc1, term(_mm256_loadu_ps(x + i + 8)));
  }
  acc = _mm512_add_pd(acc, acc1);
  for (; i + 8 <= n; i += 8) acc = _mm512_add_pd(acc, term(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __mmask8 m = first(n - i);
    acc = _mm512_mask_add_pd(acc, m, acc, term(_mm256_maskz_loadu_ps(m, x + i)));
  }
  return _mm512_reduce_add_pd(acc);
}

}  // namespace kernels::detail

CHUNKPIPE_TARGET_END()
