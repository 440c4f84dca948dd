// <immintrin.h> for the kernels, with GCC 12's false warnings inside its own AVX-512 intrinsics
// silenced (GCC bug 105593), the 256-bit horizontal sums and the weight-row loads several kernels
// share. Baseline (AVX2) code only: files compiled for a higher ISA include it before their target
// region. Pure; thread-safe.
#pragma once

#if defined(__clang__)
#include <immintrin.h>
#else
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <cstdint>

#include "tensor/dtype.h"

namespace kernels::simd {

// Eight values of a weight row from i as f32: BF16 widened exactly (a shift), or F32.
template <bool kBf16>
inline __m256 load8(const void* row, int64_t i) {
  if constexpr (kBf16) {
    const __m128i raw =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  }
}

// Value i of a BF16 or F32 weight row as f32.
template <bool kBf16>
inline float load1(const void* row, int64_t i) {
  if constexpr (kBf16) {
    return tensor::bf16_to_f32(static_cast<const uint16_t*>(row)[i]);
  } else {
    return static_cast<const float*>(row)[i];
  }
}

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

}  // namespace kernels::simd
