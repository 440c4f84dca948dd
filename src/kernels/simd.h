// <immintrin.h> for the kernels, with GCC 12's false warnings inside its own AVX-512 intrinsics
// silenced (GCC bug 105593), the 256-bit horizontal sums and the weight-row loads several kernels
// share (F32, BF16 and FP8 e4m3 with its block scale, each widened to f32 in registers). Baseline
// (AVX2) code only: files compiled for a higher ISA include it before their target region. Pure;
// thread-safe.
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

// FP8 e4m3 widened exactly, in registers: the code's seven magnitude bits placed as an f16's
// exponent and mantissa (sign-extend, shift by 7, clear bit 14) make an f16 of value / 256, which
// F16C widens to f32; f16 subnormals cover e4m3's. The NaN codes 0x7f / 0xff read as ±480 (the
// loader refuses them).
inline __m128i fp8_to_f16_bits(__m128i codes16) {
  return _mm_and_si128(_mm_slli_epi16(codes16, 7), _mm_set1_epi16(static_cast<int16_t>(0xbf80)));
}
inline __m256 fp8x8_div256(const uint8_t* codes) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes));
  return _mm256_cvtph_ps(fp8_to_f16_bits(_mm_cvtepi8_epi16(b)));
}

// The kinds of weight rows the float kernels stream. A row is its data and, for FP8, its block
// scales (value i is fp8(code i) · scale[i >> scale_log2]).
enum class WeightKind { kF32, kBf16, kFp8 };
struct WeightRow {
  const void* data = nullptr;
  const float* scale = nullptr;  // FP8 only
  int scale_log2 = 0;
};

// 256 · the FP8 block scale of `row` at column i, in every lane (zero for the other kinds):
// the factor load8 applies to the codes' value / 256, so that (code / 256) · (256 · scale) rounds
// once to the nearest f32 of fp8 · scale, as dequantizing into f32 does.
template <WeightKind kKind>
inline __m256 block_scale8(const WeightRow& row, int64_t i) {
  if constexpr (kKind == WeightKind::kFp8) {
    return _mm256_set1_ps(row.scale[i >> row.scale_log2] * 256.0f);
  } else {
    return _mm256_setzero_ps();
  }
}

// Eight values of a weight row from i as f32; for FP8, all eight in the block whose
// block_scale8 is `scale` (blocks are 16 or more columns wide, and i a multiple of 8).
template <WeightKind kKind>
inline __m256 load8(const WeightRow& row, int64_t i, __m256 scale) {
  if constexpr (kKind == WeightKind::kFp8) {
    return _mm256_mul_ps(fp8x8_div256(static_cast<const uint8_t*>(row.data) + i), scale);
  } else {
    return load8<kKind == WeightKind::kBf16>(row.data, i);
  }
}
template <WeightKind kKind>
inline float load1(const WeightRow& row, int64_t i) {
  if constexpr (kKind == WeightKind::kFp8) {
    return tensor::fp8_e4m3_to_f32(static_cast<const uint8_t*>(row.data)[i]) *
           row.scale[i >> row.scale_log2];
  } else {
    return load1<kKind == WeightKind::kBf16>(row.data, i);
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
