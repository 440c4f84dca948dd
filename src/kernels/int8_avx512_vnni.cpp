// AVX512-VNNI int8 body: vpdpbusd multiplies unsigned by signed bytes, so each activation byte
// is offset by 128 (xq ^ 0x80) and 128·Σ_k Wq[n, k] (Int8Quant::row_sum) is taken off after.
// 64 values of K per instruction; masked loads cover the tail (zeros on both sides contribute
// 128·0). The target pragma covers only this file's functions (see gemm_avx512.cpp).
#include "kernels/gemm_paths.h"
#include "kernels/int8_paths.h"

#include "kernels/simd.h"
#include "kernels/target_region.h"

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

#include "kernels/dpbusd_avx512.h"

namespace kernels::detail {
namespace {

inline int32_t hsum(__m512i v) {
  return simd::hsum(_mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

// Decode (m <= kSequentialMaxRows) reads each weight row once, in address order; the line
// kPrefetchBytes ahead is asked for as each line is read. The hardware prefetchers alone held one
// core to 20-22 GB/s on 512-byte rows (the experts' down projections of the `small` model) where
// the same rows in BF16 stream at 27; with the prefetch 24-27, and 2048-byte rows 23-28 against
// 14-22 (one Zen 5 core, 512 MB of matrices per pass).
constexpr int64_t kPrefetchBytes = 4096;

template <int NB, int MB, bool kStream = false>
inline void dot_tile(const int8_t* xq, const float* act_scale, int64_t k,
                     const tensor::WeightView& w, int64_t n0, float* y, int64_t ldy) {
  const int8_t* rows[NB];
  for (int nb = 0; nb < NB; ++nb) rows[nb] = w.i8() + (n0 + nb) * k;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i acc[NB][MB];
  for (int nb = 0; nb < NB; ++nb)
    for (int mb = 0; mb < MB; ++mb) acc[nb][mb] = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    if constexpr (kStream) {
      for (int nb = 0; nb < NB; ++nb)
        _mm_prefetch(reinterpret_cast<const char*>(rows[nb] + i + kPrefetchBytes), _MM_HINT_T0);
    }
    __m512i xv[MB];
    for (int mb = 0; mb < MB; ++mb)
      xv[mb] = _mm512_xor_si512(_mm512_loadu_si512(xq + mb * k + i), flip);
    for (int nb = 0; nb < NB; ++nb) {
      const __m512i wv = _mm512_loadu_si512(rows[nb] + i);
      for (int mb = 0; mb < MB; ++mb) acc[nb][mb] = dpbusd(acc[nb][mb], xv[mb], wv);
    }
  }
  if (i < k) {
    const __mmask64 mask = (~uint64_t{0}) >> (64 - (k - i));
    __m512i xv[MB];
    for (int mb = 0; mb < MB; ++mb)
      xv[mb] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, xq + mb * k + i), flip);
    for (int nb = 0; nb < NB; ++nb) {
      const __m512i wv = _mm512_maskz_loadu_epi8(mask, rows[nb] + i);
      for (int mb = 0; mb < MB; ++mb) acc[nb][mb] = dpbusd(acc[nb][mb], xv[mb], wv);
    }
  }
  for (int nb = 0; nb < NB; ++nb) {
    const int64_t correction = 128 * int64_t{w.quant.row_sum[n0 + nb]};
    for (int mb = 0; mb < MB; ++mb) {
      const int64_t dot = int64_t{hsum(acc[nb][mb])} - correction;
      y[mb * ldy + n0 + nb] = int8_output(dot, n0 + nb, act_scale[mb], w.quant);
    }
  }
}

template <int NB>
inline void tokens_for_weight_block(const int8_t* xq, const float* act_scale, int64_t m,
                                    const tensor::WeightView& w, int64_t n, float* y, int64_t ldy) {
  const int64_t k = w.cols;
  static_assert(kSequentialMaxRows == 2);
  if (m == 1) return dot_tile<NB, 1, true>(xq, act_scale, k, w, n, y, ldy);
  if (m == 2) return dot_tile<NB, 2, true>(xq, act_scale, k, w, n, y, ldy);
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) dot_tile<NB, 4>(xq + r * k, act_scale + r, k, w, n, y + r * ldy, ldy);
  switch (m - r) {
    case 3:
      dot_tile<NB, 3>(xq + r * k, act_scale + r, k, w, n, y + r * ldy, ldy);
      break;
    case 2:
      dot_tile<NB, 2>(xq + r * k, act_scale + r, k, w, n, y + r * ldy, ldy);
      break;
    case 1:
      dot_tile<NB, 1>(xq + r * k, act_scale + r, k, w, n, y + r * ldy, ldy);
      break;
    default:
      break;
  }
}

}  // namespace

void int8_range_avx512_vnni(const int8_t* xq, const float* act_scale, int64_t m,
                            const tensor::WeightView& w, float* y, int64_t ldy, int64_t n_begin,
                            int64_t n_end) {
  int64_t n = n_begin;
  if (m > kSequentialMaxRows)  // else one weight row at a time, in address order
    for (; n + 4 <= n_end; n += 4) tokens_for_weight_block<4>(xq, act_scale, m, w, n, y, ldy);
  for (; n < n_end; ++n) tokens_for_weight_block<1>(xq, act_scale, m, w, n, y, ldy);
}

}  // namespace kernels::detail

CHUNKPIPE_TARGET_END()
