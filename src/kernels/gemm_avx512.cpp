// AVX-512 streaming linear kernel (small M, decode): each weight row is read once per four
// activation rows, 16 lanes at a time, with masked loads for the tail of K; bf16 -> f32 by a
// shift and f32 FMA as on AVX2, but one FMA chain per output (the AVX2 kernel's two chains made
// this path's multi-row tiles slower; docs/ARCHITECTURE.md, "Decode GEMV chains").
// Compiled for AVX-512 by a target pragma that covers only this file's own functions, so no
// shared inline code is built for AVX-512; it runs only when cpu_features().avx512 is set.
#include "kernels/gemm_paths.h"

#include "kernels/simd.h"
#include "kernels/target_region.h"

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq")

namespace kernels::detail {
namespace {

template <bool kBf16>
inline __m512 load16(const void* base, int64_t i) {
  if constexpr (kBf16) {
    __m256i raw = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(base) + i);
  }
}

template <bool kBf16>
inline __m512 load_tail(const void* base, int64_t i, __mmask16 mask) {
  if constexpr (kBf16) {
    __m256i raw = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  } else {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + i);
  }
}

}  // namespace

// The lanes' sum in a fixed tree, written out so that it does not depend on the compiler's
// _mm512_reduce_add_ps: h8[j] = v[8+j] + v[j], h4[j] = h8[4+j] + h8[j], h2[j] = h4[j] +
// h4[j+2], then h2[0] + h2[1]. The tiled kernel applies the same additions across outputs.
float reduce16(__m512 v) {
  const __m256 h8 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
  const __m128 h4 = _mm_add_ps(_mm256_extractf128_ps(h8, 1), _mm256_castps256_ps128(h8));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

namespace {

// out[mb][nb] = dot(w[n0 + nb], x[mb]) for NB weight rows and MB activation rows.
template <bool kBf16, int NB, int MB>
inline void dot_tile(const float* x, int64_t k, const void* w, int64_t n0, float* y, int64_t ldy) {
  const int64_t elem = kBf16 ? 2 : 4;
  const char* rows[NB];
  for (int nb = 0; nb < NB; ++nb) rows[nb] = static_cast<const char*>(w) + (n0 + nb) * k * elem;
  __m512 acc[NB][MB];
  for (int nb = 0; nb < NB; ++nb)
    for (int mb = 0; mb < MB; ++mb) acc[nb][mb] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m512 xv[MB];
    for (int mb = 0; mb < MB; ++mb) xv[mb] = _mm512_loadu_ps(x + mb * k + i);
    for (int nb = 0; nb < NB; ++nb) {
      const __m512 wv = load16<kBf16>(rows[nb], i);
      for (int mb = 0; mb < MB; ++mb) acc[nb][mb] = _mm512_fmadd_ps(wv, xv[mb], acc[nb][mb]);
    }
  }
  if (i < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - i)) - 1u);
    __m512 xv[MB];
    for (int mb = 0; mb < MB; ++mb) xv[mb] = _mm512_maskz_loadu_ps(mask, x + mb * k + i);
    for (int nb = 0; nb < NB; ++nb) {
      const __m512 wv = load_tail<kBf16>(rows[nb], i, mask);
      for (int mb = 0; mb < MB; ++mb) acc[nb][mb] = _mm512_fmadd_ps(wv, xv[mb], acc[nb][mb]);
    }
  }
  for (int nb = 0; nb < NB; ++nb)
    for (int mb = 0; mb < MB; ++mb) y[mb * ldy + n0 + nb] = reduce16(acc[nb][mb]);
}

template <bool kBf16, int NB>
inline void rows_for_weight_block(const float* x, int64_t m, int64_t k, const void* w, int64_t n,
                                  float* y, int64_t ldy) {
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) dot_tile<kBf16, NB, 4>(x + r * k, k, w, n, y + r * ldy, ldy);
  switch (m - r) {
    case 3:
      dot_tile<kBf16, NB, 3>(x + r * k, k, w, n, y + r * ldy, ldy);
      break;
    case 2:
      dot_tile<kBf16, NB, 2>(x + r * k, k, w, n, y + r * ldy, ldy);
      break;
    case 1:
      dot_tile<kBf16, NB, 1>(x + r * k, k, w, n, y + r * ldy, ldy);
      break;
    default:
      break;
  }
}

template <bool kBf16>
void range(const float* x, int64_t m, const tensor::WeightView& w, float* y, int64_t ldy,
           int64_t n_begin, int64_t n_end) {
  int64_t n = n_begin;
  if (m > kSequentialMaxRows)  // else one weight row at a time, in address order
    for (; n + 4 <= n_end; n += 4) rows_for_weight_block<kBf16, 4>(x, m, w.cols, w.data, n, y, ldy);
  for (; n < n_end; ++n) rows_for_weight_block<kBf16, 1>(x, m, w.cols, w.data, n, y, ldy);
}

}  // namespace

void streaming_range_avx512(const float* x, int64_t m, const tensor::WeightView& w, float* y,
                            int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (w.dtype == tensor::DType::kBF16) {
    range<true>(x, m, w, y, ldy, n_begin, n_end);
  } else {
    range<false>(x, m, w, y, ldy, n_begin, n_end);
  }
}

}  // namespace kernels::detail

CHUNKPIPE_TARGET_END()
