// AVX512_BF16 linear kernel for bf16 activations (ActivationPrecision::kBf16): x is rounded to
// bf16 and packed once per call as 16-token blocks of K pairs; each weight row's pairs are
// broadcast from the row-major BF16 weight in place (no weight packing) into vdpbf16ps, which
// multiplies the bf16 pairs exactly and accumulates in f32. Compiled for AVX512_BF16 by a target
// pragma over this file's own functions; runs only when cpu_features().avx512_bf16 is set.
// Pure functions of their arguments; thread-safe for disjoint outputs.
#include "kernels/gemm_paths.h"
#include "kernels/simd.h"
#include "kernels/target_region.h"

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

#include "kernels/staged_tiles.h"

namespace kernels::detail {
namespace {

// One token row's 32 values from i (masked past k), rounded to bf16 to nearest even by
// vcvtne2ps2bf16, as 16 pair words: values (i+2j, i+2j+1), the even one in the low half. The
// instruction treats f32 denormals as zero, where tensor::f32_to_bf16 keeps them as bf16
// denormals; vdpbf16ps treats those as zero, so the products agree.
inline __m512i pairs16(const float* row, int64_t i, int64_t k) {
  const int64_t left = k - i;
  const __mmask16 lo_mask = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
  const __mmask16 hi_mask = left >= 32
                                ? __mmask16(0xffff)
                                : (left <= 16 ? __mmask16(0) : __mmask16((1u << (left - 16)) - 1u));
  const __m512 lo = _mm512_maskz_loadu_ps(lo_mask, row + i);       // values i..i+15
  const __m512 hi = _mm512_maskz_loadu_ps(hi_mask, row + i + 16);  // i+16..i+31
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // lo fills the low 16 bf16 values
}

// acc[r][v] += pairs of weight row r (of the NR rows from w) against token vector v, over all K
// pairs; then stage[(v * 16 + t) * ld + r] = token t's output of row r, for all 16 · TV tokens.
template <int NR, int TV>
inline void tile(const uint32_t* xt, int64_t block_words, int64_t kp2, const uint16_t* w, int64_t k,
                 float* stage, int64_t ld) {
  const uint32_t* rows[NR];
  for (int r = 0; r < NR; ++r) rows[r] = reinterpret_cast<const uint32_t*>(w + r * k);
  __m512 acc[NR][TV];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < TV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp2; ++p) {
    __m512bh xv[TV];
    for (int v = 0; v < TV; ++v) xv[v] = (__m512bh)_mm512_load_si512(xt + v * block_words + p * 16);
    for (int r = 0; r < NR; ++r) {
      const __m512bh wv = (__m512bh)_mm512_set1_epi32(static_cast<int>(rows[r][p]));
      for (int v = 0; v < TV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], xv[v], wv);
    }
  }
  alignas(64) float out[16];
  for (int v = 0; v < TV; ++v) {
    for (int r = 0; r < NR; ++r) {
      _mm512_store_ps(out, acc[r][v]);
      for (int t = 0; t < 16; ++t) stage[(v * 16 + t) * ld + r] = out[t];
    }
  }
}

// The GEMV form, for the few token rows of a decode step: lanes run along K. Each output sums
// its 32-value blocks into two accumulators, even blocks into the first and odd into the
// second (two vdpbf16ps chains in flight per output, which one core needs to read a weight row
// at DRAM speed), then adds the two and reduces the 16 lanes. Every output is formed this way
// whatever the tile, so a token's outputs do not depend on how many rows share the call.
// NR weight rows (row stride k) against MB token rows of xb (row stride k, bf16 bits). With
// kStream (decode's one row at a time), each 128-byte step also asks for the lines 4 KiB
// ahead (kPrefetchValues), as the int8 GEMV does: the hardware prefetchers alone leave one
// core short of the DRAM rate on rows of 1-4 KiB.
constexpr int64_t kPrefetchValues = 4096 / sizeof(uint16_t);

// acc[r][t] += the 32-value block at i of weight row r against token row t; with kMasked, only
// the values below k (the rest read as zero). Always inlined, so acc stays in registers.
template <int NR, int MB, bool kMasked>
__attribute__((always_inline)) inline void gemv_block(__m512 (&acc)[NR][MB], const uint16_t* xb,
                                                      int64_t k, const uint16_t* w, int64_t i) {
  [[maybe_unused]] const __mmask32 mask = kMasked ? __mmask32((1u << (k - i)) - 1u) : 0;
  auto load = [&](const uint16_t* p) __attribute__((always_inline)) {
    if constexpr (kMasked) return (__m512bh)_mm512_maskz_loadu_epi16(mask, p);
    return (__m512bh)_mm512_loadu_si512(p);
  };
  __m512bh xv[MB];
  for (int t = 0; t < MB; ++t) xv[t] = load(xb + t * k + i);
  for (int r = 0; r < NR; ++r) {
    const __m512bh wv = load(w + r * k + i);
    for (int t = 0; t < MB; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xv[t], wv);
  }
}

template <int NR, int MB, bool kStream>
inline void gemv_tile(const uint16_t* xb, int64_t k, const uint16_t* w, float* y, int64_t ldy) {
  __m512 even[NR][MB], odd[NR][MB];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < MB; ++t) even[r][t] = odd[r][t] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    if constexpr (kStream) {
      for (int r = 0; r < NR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + r * k + i + kPrefetchValues), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w + r * k + i + kPrefetchValues + 32),
                     _MM_HINT_T0);
      }
    }
    gemv_block<NR, MB, false>(even, xb, k, w, i);
    gemv_block<NR, MB, false>(odd, xb, k, w, i + 32);
  }
  // The last 1-63 values: an even block (whole or masked), then a masked odd one.
  if (i + 32 <= k) {
    gemv_block<NR, MB, false>(even, xb, k, w, i);
    if (i + 32 < k) gemv_block<NR, MB, true>(odd, xb, k, w, i + 32);
  } else if (i < k) {
    gemv_block<NR, MB, true>(even, xb, k, w, i);
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < MB; ++t)
      y[t * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(even[r][t], odd[r][t]));
}

template <int NR>
inline void gemv_rows(const uint16_t* xb, int64_t m, int64_t k, const uint16_t* w, float* y,
                      int64_t ldy) {
  constexpr bool kStream = NR == 1;
  int64_t t = 0;
  constexpr int kMaxTokens = NR == 4 ? 2 : 4;
  for (; t + kMaxTokens <= m; t += kMaxTokens)
    gemv_tile<NR, kMaxTokens, kStream>(xb + t * k, k, w, y + t * ldy, ldy);
  switch (m - t) {
    case 3:
      if constexpr (kMaxTokens > 3) gemv_tile<NR, 3, kStream>(xb + t * k, k, w, y + t * ldy, ldy);
      break;
    case 2:
      gemv_tile<NR, 2, kStream>(xb + t * k, k, w, y + t * ldy, ldy);
      break;
    case 1:
      gemv_tile<NR, 1, kStream>(xb + t * k, k, w, y + t * ldy, ldy);
      break;
    default:
      break;
  }
}

}  // namespace

void pack_bf16_pairs_avx512(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t block_begin,
                            int64_t block_end, uint32_t* out) {
  const int64_t kp2 = k / 2;
  for (int64_t b = block_begin; b < block_end; ++b) {
    uint32_t* block = out + b * kp2 * 16;
    for (int64_t i = 0; i < k; i += 32) {
      // 16 tokens × 16 pairs, transposed so that each stored vector is one pair of 16 tokens.
      alignas(64) uint32_t words[16][16];
      for (int t = 0; t < 16; ++t) {
        const int64_t token = b * 16 + t;
        const __m512i v = token < m ? pairs16(x + token * ldx, i, k) : _mm512_setzero_si512();
        _mm512_store_si512(words[t], v);
      }
      const int64_t pairs = std::min<int64_t>(16, (k - i) / 2);
      for (int64_t j = 0; j < pairs; ++j)
        for (int t = 0; t < 16; ++t) block[(i / 2 + j) * 16 + t] = words[t][j];
    }
  }
}

void bf16_pairs_range_avx512(const uint32_t* blocks, int64_t m, const uint16_t* w, int64_t k,
                             float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  const int64_t kp2 = k / 2;
  const int64_t block_words = kp2 * 16;
  auto run_tile = [&](auto rows, auto vectors, int64_t b, int64_t n, float* stage) {
    tile<rows(), vectors()>(blocks + b * block_words, block_words, kp2, w + n * k, k, stage,
                            kChunkRows);
  };
  // The chunk's outputs go to y a token row at a time, in whole vectors.
  auto flush = [&](int64_t b, int tv, int64_t nc, int64_t cols, const float* stage) {
    const __mmask16 tail = __mmask16((1u << (cols % 16 ? cols % 16 : 16)) - 1u);
    const int64_t tokens = std::min<int64_t>(16 * tv, m - b * 16);
    for (int64_t t = 0; t < tokens; ++t) {
      const float* src = stage + t * kChunkRows;
      float* dst = y + (b * 16 + t) * ldy + nc;
      int64_t c = 0;
      for (; c + 16 < cols; c += 16) _mm512_storeu_ps(dst + c, _mm512_load_ps(src + c));
      _mm512_mask_storeu_ps(dst + c, tail, _mm512_maskz_loadu_ps(tail, src + c));
    }
  };
  staged_tiles<float>((m + 15) / 16, l2_pass_blocks(32 * k), n_begin, n_end, run_tile, flush);
}

void round_bf16_rows_avx512(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) _mm512_storeu_si512(out + i, pairs16(x + i, 0, 32));
  if (i < n) {
    const __mmask32 mask = __mmask32((1ull << (n - i)) - 1u);
    _mm512_mask_storeu_epi16(out + i, mask, pairs16(x + i, 0, n - i));
  }
}

void bf16_gemv_range_avx512(const uint16_t* xb, int64_t m, const uint16_t* w, int64_t k, float* y,
                            int64_t ldy, int64_t n_begin, int64_t n_end) {
  int64_t n = n_begin;
  if (m > kSequentialMaxRows)  // else one weight row at a time, in address order
    for (; n + 4 <= n_end; n += 4) gemv_rows<4>(xb, m, k, w + n * k, y + n, ldy);
  for (; n < n_end; ++n) gemv_rows<1>(xb, m, k, w + n * k, y + n, ldy);
}

}  // namespace kernels::detail

CHUNKPIPE_TARGET_END()
