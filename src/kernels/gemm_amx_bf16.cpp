// AMX-BF16 body of linear at f32 numerics: each f32 activation splits into three bf16 terms
// (successive truncations that sum to it exactly) and tdpbf16ps sums them against the weights.
// BF16 weights take 3 tile products per K step; f32 weights split into three terms as well and
// take 6 (all term pairs of order <= 2), unless a panel's values are all exact in bf16. Each
// thread packs its weight rows into AMX's B layout per call. The row-major form swaps the
// roles for short batches (MoE experts), where packing every weight costs more than the
// products: weight rows are the A tiles, read in place, and the activations' terms are packed
// as B tiles once per call. Thread-safe for disjoint outputs.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/amx_tiles.h"
#include "kernels/gemm_paths.h"
#include "kernels/simd.h"
#include "kernels/target_region.h"
#include "tensor/aligned_buffer.h"

namespace kernels::detail {
namespace {

tensor::AlignedBuffer<uint16_t>& panel_scratch(size_t size) {
  thread_local tensor::AlignedBuffer<uint16_t> buffer;
  if (buffer.size() < size) buffer.resize(size);
  return buffer;
}

// The top 16 bits of 16 f32 bit patterns in a and b, in order.
inline __m256i high_halves(__m256i a, __m256i b) {
  const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(a, 16), _mm256_srli_epi32(b, 16));
  return _mm256_permute4x64_epi64(packed, 0xd8);
}

}  // namespace

void split_bf16x3_rows(const float* x, int64_t ldx, int64_t k, int64_t row_begin, int64_t row_end,
                       int64_t m, uint16_t* out, int64_t mp, int64_t kp) {
  const __m256i top = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t t = row_begin; t < row_end; ++t) {
    uint16_t* hi = out + t * kp;
    uint16_t* mid = hi + mp * kp;
    uint16_t* lo = mid + mp * kp;
    if (t >= m) {
      std::memset(hi, 0, size_t(kp) * 2);
      std::memset(mid, 0, size_t(kp) * 2);
      std::memset(lo, 0, size_t(kp) * 2);
      continue;
    }
    const float* row = x + t * ldx;
    int64_t c = 0;
    for (; c + 16 <= k; c += 16) {
      __m256i h[2], md[2], l[2];
      for (int i = 0; i < 2; ++i) {
        const __m256 v = _mm256_loadu_ps(row + c + 8 * i);
        h[i] = _mm256_and_si256(_mm256_castps_si256(v), top);
        const __m256 r1 = _mm256_sub_ps(v, _mm256_castsi256_ps(h[i]));
        md[i] = _mm256_and_si256(_mm256_castps_si256(r1), top);
        l[i] = _mm256_castps_si256(_mm256_sub_ps(r1, _mm256_castsi256_ps(md[i])));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + c), high_halves(h[0], h[1]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(mid + c), high_halves(md[0], md[1]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + c), high_halves(l[0], l[1]));
    }
    for (; c < k; ++c) {
      uint32_t bits, rbits, lbits;
      std::memcpy(&bits, row + c, 4);
      bits &= 0xffff0000u;
      float h1;
      std::memcpy(&h1, &bits, 4);
      const float r1 = row[c] - h1;
      std::memcpy(&rbits, &r1, 4);
      rbits &= 0xffff0000u;
      float m1;
      std::memcpy(&m1, &rbits, 4);
      const float r2 = r1 - m1;
      std::memcpy(&lbits, &r2, 4);
      hi[c] = static_cast<uint16_t>(bits >> 16);
      mid[c] = static_cast<uint16_t>(rbits >> 16);
      lo[c] = static_cast<uint16_t>(lbits >> 16);
    }
    for (; c < kp; ++c) hi[c] = mid[c] = lo[c] = 0;
  }
}

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,amx-tile,amx-bf16")

namespace {

// Transposes the 16×16 matrix of 32-bit elements held in r (row i in r[i]) in registers:
// unpacks within 128-bit lanes, then 128-bit lane shuffles. Afterwards r[j] holds column j.
inline void transpose_16x16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
    const __m512d e = _mm512_castps_pd(t[4 * i + 1]), f = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(e, f));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(e, f));
  }
  // r[4i + j] now holds, in 128-bit lane l, column j of rows 4i..4i+3 at columns 4l..4l+3.
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
    r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
    r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xdd);
  }
}

// Accumulator tiles 0-3, a 2 × 2 grid of 16 × 16 blocks, into c [32][32]: tile 0 top left, 1
// top right, 2 bottom left, 3 bottom right.
void store_accumulators(float* c) {
  _tile_stored(0, c, 128);
  _tile_stored(1, c + 16, 128);
  _tile_stored(2, c + 16 * 32, 128);
  _tile_stored(3, c + 16 * 32 + 16, 128);
}

// Writes the 16×16 block c[t][n] (row stride 32 floats) as y[n][t] for n < rows, t < tokens.
void store_transposed_16x16(const float* c, float* y, int64_t ldy, int64_t rows, int64_t tokens) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(c + i * 32);
  transpose_16x16(r);
  const __mmask16 mask = tokens >= 16 ? __mmask16(0xffff) : __mmask16((1u << tokens) - 1);
  for (int64_t n = 0; n < rows; ++n) _mm512_mask_storeu_ps(y + n * ldy, mask, r[n]);
}

// One 16-row half of a weight panel's K block in AMX's B layout: src holds 16 rows of 32 bf16
// (row stride ld elements); tile[q][i] is the bf16 pair q of row i, a 32-bit transpose.
void pack_b_tile(const uint16_t* src, int64_t ld, int32_t* tile) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ld);
  transpose_16x16(r);
  for (int q = 0; q < 16; ++q) _mm512_store_ps(tile + q * 16, r[q]);
}

}  // namespace

void pack_bf16x3_b_tiles(const uint16_t* xs, int64_t mp, int64_t kp, int64_t block_begin,
                         int64_t block_end, uint16_t* tiles) {
  const int64_t kblocks = kp / 32;
  for (int64_t blk = block_begin; blk < block_end; ++blk) {
    for (int64_t kbi = 0; kbi < kblocks; ++kbi) {
      for (int term = 0; term < 3; ++term) {
        pack_b_tile(xs + term * mp * kp + blk * 16 * kp + kbi * 32, kp,
                    reinterpret_cast<int32_t*>(tiles + ((blk * kblocks + kbi) * 3 + term) * 512));
      }
    }
  }
}

void bf16x3_row_major_range_amx(const uint16_t* tiles, int64_t m, const uint16_t* w, int64_t k,
                                float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  const AmxTileConfig cfg = full_amx_tiles();
  _tile_loadconfig(&cfg);
  const int64_t kblocks = k / 32;
  // A short last panel is copied into zeroed rows, so that no tile reads past the weight.
  uint16_t* tail = panel_scratch(size_t(32 * k)).data();
  // Tokens in blocks whose B tiles (three terms: 6·k bytes per token) stay in L2 while every
  // panel of this thread passes over them.
  const int64_t token_block =
      std::clamp<int64_t>((int64_t{768} << 10) / (6 * k) / 32 * 32, 32, 1024);
  alignas(64) float c[32 * 32];
  for (int64_t tb = 0; tb < m; tb += token_block) {
    const int64_t tb_end = std::min(m, tb + token_block);
    for (int64_t n0 = n_begin; n0 < n_end; n0 += 32) {
      const int64_t rows = std::min<int64_t>(32, n_end - n0);
      const uint16_t* a = w + n0 * k;
      if (rows < 32) {
        std::memcpy(tail, a, size_t(rows * k) * 2);
        std::memset(tail + rows * k, 0, size_t((32 - rows) * k) * 2);
        a = tail;
      }
      for (int64_t t0 = tb; t0 < tb_end; t0 += 32) {
        const bool two = tb_end - t0 > 16;  // a second block of 16 tokens
        const uint16_t* b0 = tiles + (t0 / 16) * kblocks * 3 * 512;
        const uint16_t* b1 = b0 + kblocks * 3 * 512;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kbi = 0; kbi < kblocks; ++kbi) {
          _tile_loadd(6, a + kbi * 32, k * 2);
          _tile_loadd(7, a + 16 * k + kbi * 32, k * 2);
          // The activation's terms in order for each K step, as bf16x3_range_amx sums them.
          for (int term = 0; term < 3; ++term) {
            _tile_loadd(4, b0 + (kbi * 3 + term) * 512, 64);
            _tile_dpbf16ps(0, 6, 4);
            _tile_dpbf16ps(2, 7, 4);
            if (two) {
              _tile_loadd(5, b1 + (kbi * 3 + term) * 512, 64);
              _tile_dpbf16ps(1, 6, 5);
              _tile_dpbf16ps(3, 7, 5);
            }
          }
        }
        store_accumulators(c);  // c[weight row][token]
        const int64_t tokens = std::min<int64_t>(32, tb_end - t0);
        for (int64_t ww = 0; ww < rows; ww += 16) {
          for (int64_t tt = 0; tt < tokens; tt += 16) {
            store_transposed_16x16(c + ww * 32 + tt, y + (t0 + tt) * ldy + n0 + ww, ldy,
                                   std::min<int64_t>(16, tokens - tt),
                                   std::min<int64_t>(16, rows - ww));
          }
        }
      }
    }
  }
  _tile_release();
}

void bf16x3_range_amx(const uint16_t* xs, int64_t mp, int64_t kp, int64_t m, const AmxWeightRows& w,
                      int64_t k, const AmxOutput& out, int64_t n_begin, int64_t n_end) {
  const AmxTileConfig cfg = full_amx_tiles();
  _tile_loadconfig(&cfg);
  // This thread's weight rows, 32 at a time, each weight term of a panel as
  // [kp / 32][2 tiles][16 pairs][16 rows][2]; terms[p]: how many terms panel p uses.
  const int64_t panels = (n_end - n_begin + 31) / 32;
  const int64_t term_size = kp * 32, panel_size = (w.f32 != nullptr ? 3 : 1) * term_size;
  uint16_t* packed = panel_scratch(size_t(panels * panel_size + 3 * term_size)).data();
  uint16_t* rows_tmp = packed + panels * panel_size;  // [3][32][kp]: the panel's rows, split
  thread_local std::vector<int> terms;
  terms.assign(size_t(panels), 1);
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t n0 = n_begin + p * 32, rows = std::min<int64_t>(32, n_end - n0);
    // BF16 rows that are whole, consecutive and a multiple of 32 long are gathered in place;
    // others are first copied (or split, for f32) into rows_tmp with zero padding.
    const bool in_place = w.f32 == nullptr && rows == 32 && k == kp &&
                          w.physical_row(n0 + 31) - w.physical_row(n0) == 31;
    const uint16_t* src = in_place ? w.bf16 + w.physical_row(n0) * k : rows_tmp;
    uint64_t low_terms = 0;  // any bit of a second or third term in the panel
    for (int64_t r = 0; r < 32 && !in_place; ++r) {
      uint16_t* dst = rows_tmp + r * kp;
      if (r >= rows) {
        for (int t = 0; t < 3; ++t) std::memset(dst + t * term_size, 0, size_t(kp) * 2);
      } else if (w.f32 != nullptr) {
        split_bf16x3_rows(w.f32 + w.physical_row(n0 + r) * k, k, k, 0, 1, 1, dst, 32, kp);
        for (int t = 1; t < 3; ++t) {
          for (int64_t c = 0; c < kp; c += 4) {  // kp is a multiple of 32
            uint64_t bits;
            std::memcpy(&bits, dst + t * term_size + c, 8);
            low_terms |= bits;
          }
        }
      } else {
        std::memcpy(dst, w.bf16 + w.physical_row(n0 + r) * k, size_t(k) * 2);
        std::memset(dst + k, 0, size_t(kp - k) * 2);
      }
    }
    terms[size_t(p)] = low_terms != 0 ? 3 : 1;
    for (int t = 0; t < terms[size_t(p)]; ++t) {
      uint16_t* term = packed + p * panel_size + t * term_size;
      for (int64_t kb = 0; kb < kp; kb += 32) {
        for (int half = 0; half < 2; ++half) {
          pack_b_tile(src + t * term_size + half * 16 * kp + kb, kp,
                      reinterpret_cast<int32_t*>(term + kb * 32 + half * 512));
        }
      }
    }
  }
  // Tokens in blocks whose three terms stay in cache while every panel passes over them: 32
  // tokens (one tile row pair, in L1) when K is short, as in the MLA expansion (K = 512 or
  // less), so that every panel reads them from L1; else as many as fit in L2.
  const int64_t token_block =
      6 * 32 * kp <= (int64_t{96} << 10)
          ? 32
          : std::clamp<int64_t>((int64_t{768} << 10) / (6 * kp) / 32 * 32, 32, 1024);
  const int64_t plane = mp * kp;
  alignas(64) float c[32 * 32];
  for (int64_t tb = 0; tb < m; tb += token_block) {
    const int64_t tb_end = std::min(m, tb + token_block);
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t n0 = n_begin + p * 32, rows = std::min<int64_t>(32, n_end - n0);
      const uint16_t* panel = packed + p * panel_size;
      const int w_terms = terms[size_t(p)];
      for (int64_t t0 = tb; t0 < tb_end; t0 += 32) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kb = 0; kb < kp; kb += 32) {
          // Activation term i against weight term j for i + j <= 2. Term i is below 2^-7i of its
          // value, so the dropped pairs are below 2^-21 of the product: f32 accuracy for a sum.
          for (int j = 0; j < w_terms; ++j) {
            _tile_loadd(6, panel + j * term_size + kb * 32, 64);
            _tile_loadd(7, panel + j * term_size + kb * 32 + 512, 64);
            for (int part = 0; part < 3 - j; ++part) {
              const uint16_t* a = xs + part * plane + t0 * kp + kb;
              _tile_loadd(4, a, kp * 2);
              _tile_loadd(5, a + 16 * kp, kp * 2);
              _tile_dpbf16ps(0, 4, 6);
              _tile_dpbf16ps(1, 4, 7);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
          }
        }
        store_accumulators(c);
        const int64_t tokens = std::min<int64_t>(32, m - t0);
        if (out.transposed) {
          for (int64_t tt = 0; tt < tokens; tt += 16) {
            for (int64_t nn = 0; nn < rows; nn += 16) {
              store_transposed_16x16(c + tt * 32 + nn, out.y + (n0 + nn) * out.ldy + t0 + tt,
                                     out.ldy, std::min<int64_t>(16, rows - nn),
                                     std::min<int64_t>(16, tokens - tt));
            }
          }
        } else {
          // Runs of columns inside one group, each a copy per token.
          const int64_t group = out.group_cols > 0 ? out.group_cols : n_end;
          for (int64_t nn = 0; nn < rows;) {
            const int64_t j = n0 + nn, run = std::min(rows - nn, group - j % group);
            float* dst = out.y + j / group * out.group_stride + j % group + t0 * out.ldy;
            for (int64_t t = 0; t < tokens; ++t)
              std::memcpy(dst + t * out.ldy, c + t * 32 + nn, size_t(run) * sizeof(float));
            nn += run;
          }
        }
      }
    }
  }
  _tile_release();
}

CHUNKPIPE_TARGET_END()

}  // namespace kernels::detail
