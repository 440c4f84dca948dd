// AVX512-VNNI int8 tiles for many tokens: the quantized activations are packed once per call as
// 16-token blocks of K quads (each token's 4 bytes, offset by 128 to unsigned, in one 32-bit
// word), and each weight row's quad is broadcast from the row-major int8 weight in place into
// vpdpbusd, so an accumulator holds one row's dots for 16 tokens: no horizontal sums, six rows
// × four token vectors per tile (the layout of gemm_avx512_bf16.cpp). Outputs equal the other
// int8 paths bit for bit (integer sums, the same epilogue). Thread-safe for disjoint outputs.
#include <algorithm>
#include <cstring>

#include "kernels/int8_paths.h"
#include "kernels/simd.h"
#include "kernels/target_region.h"

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

#include "kernels/dpbusd_avx512.h"
#include "kernels/staged_tiles.h"

namespace kernels::detail {
namespace {

// Row r's quad q as one word; the last quad of a row with K % 4 != 0 is read byte by byte (the
// bytes past K, which a word load would take from the next row or past the weight, face zero
// activation bytes).
inline uint32_t weight_quad(const int8_t* row, int64_t q, int64_t k) {
  uint32_t word = 0;
  std::memcpy(&word, row + 4 * q, size_t(std::min<int64_t>(4, k - 4 * q)));
  return word;
}

inline uint32_t load_word(const int8_t* p) {
  uint32_t word;
  std::memcpy(&word, p, 4);
  return word;
}

template <int NR, int TV>
inline void tile(const uint32_t* xt, int64_t block_words, int64_t k, const int8_t* w,
                 int32_t* stage, int64_t ld) {
  const int64_t full = k / 4;
  const int8_t* rows[NR];
  for (int r = 0; r < NR; ++r) rows[r] = w + r * k;
  __m512i acc[NR][TV];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < TV; ++v) acc[r][v] = _mm512_setzero_si512();
  for (int64_t q = 0; q < full; ++q) {
    __m512i xv[TV];
    for (int v = 0; v < TV; ++v) xv[v] = _mm512_load_si512(xt + v * block_words + q * 16);
    for (int r = 0; r < NR; ++r) {
      const __m512i wv = _mm512_set1_epi32(static_cast<int>(load_word(rows[r] + 4 * q)));
      for (int v = 0; v < TV; ++v) acc[r][v] = dpbusd(acc[r][v], xv[v], wv);
    }
  }
  if (full * 4 < k) {
    __m512i xv[TV];
    for (int v = 0; v < TV; ++v) xv[v] = _mm512_load_si512(xt + v * block_words + full * 16);
    for (int r = 0; r < NR; ++r) {
      const __m512i wv = _mm512_set1_epi32(static_cast<int>(weight_quad(rows[r], full, k)));
      for (int v = 0; v < TV; ++v) acc[r][v] = dpbusd(acc[r][v], xv[v], wv);
    }
  }
  alignas(64) int32_t out[16];
  for (int v = 0; v < TV; ++v) {
    for (int r = 0; r < NR; ++r) {
      _mm512_store_si512(out, acc[r][v]);
      for (int t = 0; t < 16; ++t) stage[(v * 16 + t) * ld + r] = out[t];
    }
  }
}

// Eight int32 values widened to int64.
inline __m512i widen(const int32_t* p, __mmask8 mask) {
  return _mm512_cvtepi32_epi64(_mm256_maskz_loadu_epi32(mask, p));
}

// y[n0 .. n0 + cols) of one token from its dots: (dot − 128 · row_sum + bias) in int64, then
// × act_scale × row_scale in f32, the order int8_output uses.
inline void finish_row(const int32_t* dots, int64_t n0, int64_t cols, float act_scale,
                       const tensor::Int8Quant& q, float* y) {
  const __m512 scale = _mm512_set1_ps(act_scale);
  for (int64_t c = 0; c < cols; c += 16) {
    const int64_t width = std::min<int64_t>(16, cols - c);
    const __mmask16 mask = __mmask16((1u << width) - 1u);
    __m256 halves[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t at = c + 8 * h;
      const __mmask8 m8 = __mmask8(mask >> (8 * h));
      __m512i exact = _mm512_sub_epi64(widen(dots + at, m8),
                                       _mm512_slli_epi64(widen(q.row_sum + n0 + at, m8), 7));
      if (q.row_bias) exact = _mm512_add_epi64(exact, widen(q.row_bias + n0 + at, m8));
      halves[h] = _mm512_cvtepi64_ps(exact);
    }
    const __m512 f = _mm512_insertf32x8(_mm512_castps256_ps512(halves[0]), halves[1], 1);
    const __m512 out =
        _mm512_mul_ps(_mm512_mul_ps(f, scale), _mm512_maskz_loadu_ps(mask, q.row_scale + n0 + c));
    _mm512_mask_storeu_ps(y + c, mask, out);
  }
}

}  // namespace

void pack_int8_quads_avx512(const int8_t* xq, int64_t m, int64_t k, int64_t block_begin,
                            int64_t block_end, uint32_t* out) {
  const int64_t quads = (k + 3) / 4;
  for (int64_t b = block_begin; b < block_end; ++b) {
    uint32_t* block = out + b * quads * 16;
    for (int t = 0; t < 16; ++t) {
      const int64_t token = b * 16 + t;
      const int8_t* row = xq + token * k;
      for (int64_t q = 0; q < quads; ++q) {
        // Bytes past K stay zero, so they add nothing whatever the weight bytes facing them.
        uint32_t word = 0;
        if (token < m) {
          std::memcpy(&word, row + 4 * q, size_t(std::min<int64_t>(4, k - 4 * q)));
          const uint32_t flip =
              k - 4 * q >= 4 ? 0x80808080u : (0x80808080u >> (8 * (4 - (k - 4 * q))));
          word ^= flip;
        }
        block[q * 16 + t] = word;
      }
    }
  }
}

void int8_tiles_range_avx512_vnni(const uint32_t* blocks, const float* act_scale, int64_t m,
                                  const tensor::WeightView& w, float* y, int64_t ldy,
                                  int64_t n_begin, int64_t n_end) {
  const int64_t k = w.cols, quads = (k + 3) / 4;
  const int64_t block_words = quads * 16;
  auto run_tile = [&](auto rows, auto vectors, int64_t b, int64_t n, int32_t* stage) {
    tile<rows(), vectors()>(blocks + b * block_words, block_words, k, w.i8() + n * k, stage,
                            kChunkRows);
  };
  auto flush = [&](int64_t b, int tv, int64_t nc, int64_t cols, const int32_t* stage) {
    const int64_t tokens = std::min<int64_t>(16 * tv, m - b * 16);
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t token = b * 16 + t;
      finish_row(stage + t * kChunkRows, nc, cols, act_scale[token], w.quant, y + token * ldy + nc);
    }
  };
  staged_tiles<int32_t>((m + 15) / 16, l2_pass_blocks(64 * quads), n_begin, n_end, run_tile, flush);
}

}  // namespace kernels::detail

CHUNKPIPE_TARGET_END()
