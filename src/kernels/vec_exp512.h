// exp of 16 floats at once (AVX-512): exp8's constants, range reduction, polynomial and underflow
// to 0 (vec_exp.h), on 512-bit registers. Include it only after a file's AVX-512 target pragma:
// the function has internal linkage, so each such file gets its own copy built for its target and
// no AVX-512 body can reach an AVX2-only caller. Pure; thread-safe.
#pragma once

#include <immintrin.h>

#include "kernels/vec_exp.h"

namespace kernels {

static inline __m512 exp16(__m512 x) {
  using namespace exp_constants;
  const __m512 lo = _mm512_set1_ps(kLo), hi = _mm512_set1_ps(kHi);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  // p · 2^n in one instruction: the same value as exp8's exponent bits times p.
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~underflow), p, n);
}

}  // namespace kernels
