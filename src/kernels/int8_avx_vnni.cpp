// AVX-VNNI int8 body (VEX vpdpbusd on 256-bit registers, for CPUs with AVX-VNNI and no
// AVX-512): the unsigned-offset form of int8_avx512_vnni.cpp, 32 values of K per instruction,
// the tail in scalar code with the same offset. The target pragma covers only this file.
#include "kernels/gemm_paths.h"
#include "kernels/int8_paths.h"
#include "kernels/simd.h"
#include "kernels/target_region.h"

CHUNKPIPE_TARGET_BEGIN("avxvnni")

namespace kernels::detail {
namespace {

template <int NB, int MB>
inline void dot_tile(const int8_t* xq, const float* act_scale, int64_t k,
                     const tensor::WeightView& w, int64_t n0, float* y, int64_t ldy) {
  const int8_t* rows[NB];
  for (int nb = 0; nb < NB; ++nb) rows[nb] = w.i8() + (n0 + nb) * k;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i acc[NB][MB];
  for (int nb = 0; nb < NB; ++nb)
    for (int mb = 0; mb < MB; ++mb) acc[nb][mb] = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    __m256i xv[MB];
    for (int mb = 0; mb < MB; ++mb) {
      xv[mb] = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + mb * k + i)), flip);
    }
    for (int nb = 0; nb < NB; ++nb) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[nb] + i));
      for (int mb = 0; mb < MB; ++mb)
        acc[nb][mb] = _mm256_dpbusd_avx_epi32(acc[nb][mb], xv[mb], wv);
    }
  }
  for (int nb = 0; nb < NB; ++nb) {
    const int64_t correction = 128 * int64_t{w.quant.row_sum[n0 + nb]};
    for (int mb = 0; mb < MB; ++mb) {
      int64_t dot = simd::hsum(acc[nb][mb]);
      for (int64_t j = i; j < k; ++j) dot += (int32_t(xq[mb * k + j]) + 128) * rows[nb][j];
      y[mb * ldy + n0 + nb] = int8_output(dot - correction, n0 + nb, act_scale[mb], w.quant);
    }
  }
}

template <int NB>
inline void tokens_for_weight_block(const int8_t* xq, const float* act_scale, int64_t m,
                                    const tensor::WeightView& w, int64_t n, float* y, int64_t ldy) {
  const int64_t k = w.cols;
  int64_t r = 0;
  for (; r + 2 <= m; r += 2) dot_tile<NB, 2>(xq + r * k, act_scale + r, k, w, n, y + r * ldy, ldy);
  if (r < m) dot_tile<NB, 1>(xq + r * k, act_scale + r, k, w, n, y + r * ldy, ldy);
}

}  // namespace

void int8_range_avx_vnni(const int8_t* xq, const float* act_scale, int64_t m,
                         const tensor::WeightView& w, float* y, int64_t ldy, int64_t n_begin,
                         int64_t n_end) {
  int64_t n = n_begin;
  if (m > kSequentialMaxRows)  // else one weight row at a time, in address order
    for (; n + 4 <= n_end; n += 4) tokens_for_weight_block<4>(xq, act_scale, m, w, n, y, ldy);
  for (; n < n_end; ++n) tokens_for_weight_block<1>(xq, act_scale, m, w, n, y, ldy);
}

}  // namespace kernels::detail

CHUNKPIPE_TARGET_END()
