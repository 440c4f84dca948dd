// AMX-BF16 instantiation of the blocked MLA prefill attention: the same items, online softmax
// and state as mla_flash.h, with q·kᵀ and p·v on tiles at f32 numerics. Every f32 operand
// (q, k, p, v) splits into three bf16 terms whose sum is it exactly, and each product sums the
// six term pairs of order <= 2, as the linears' f32-weight path does. Softmax and the output
// update run on AVX-512. Per query: key blocks of 64 aligned to position 0 and a fixed order, so
// its output does not depend on its chunk or tile. Runs only when amx_bf16_active(); thread-safe
// for disjoint items.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/amx_tiles.h"
#include "kernels/gemm_paths.h"
#include "kernels/mla_attention.h"
#include "kernels/mla_flash.h"
#include "kernels/simd.h"
#include "kernels/target_region.h"
#include "kernels/vec_exp.h"  // before the target pragma: vec_exp512.h builds on it
#include "tensor/aligned_buffer.h"

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,amx-tile,amx-bf16")

#include "kernels/vec_exp512.h"

namespace kernels::detail {
namespace {

constexpr int kKeys = 64;  // keys per block, as the AVX-512 path's (one softmax update each)
constexpr int kStep = 32;  // bf16 values per tile row: dims of q·k, keys of p·v per product
constexpr int kTile = 16;  // queries per tile; keys or value columns of a B tile
constexpr int kTileValues = 512;  // bf16 values in one 16 × 64-byte tile

inline __mmask16 prefix(int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

// x = t[0] + t[1] + t[2] exactly, each term's bits with the low 16 zero (a bf16 in the top half).
inline void split3(__m512 x, __m512i t[3]) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  t[0] = _mm512_and_si512(_mm512_castps_si512(x), top);
  const __m512 r1 = _mm512_sub_ps(x, _mm512_castsi512_ps(t[0]));
  t[1] = _mm512_and_si512(_mm512_castps_si512(r1), top);
  t[2] = _mm512_castps_si512(_mm512_sub_ps(r1, _mm512_castsi512_ps(t[1])));
}

// One row of a B tile: 16 bf16 pairs (even, odd) of one term.
inline void store_pairs(__m512i even, __m512i odd, uint16_t* dst) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  _mm512_store_si512(dst, _mm512_or_si512(_mm512_and_si512(odd, top), _mm512_srli_epi32(even, 16)));
}

// 32 values of one term as bf16 (their top halves: the odd 16-bit words of a, then of b), for an
// A tile row, in one two-source permute.
inline void store_halves(__m512i a, __m512i b, uint16_t* dst) {
  const __m512i odd_words =
      _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                       25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  _mm512_store_si512(dst, _mm512_permutex2var_epi16(a, odd_words, b));
}

// GCC's tile intrinsics paste their tile numbers into the assembly, so they take literals: this
// step is a macro over the tile number. Tile C += (A terms in tiles 4-6) · (B terms at b, one at
// a time in tile 7): B term j against A terms i <= 2 - j, the six pairs of order <= 2 (what is
// dropped is below 2^-21 of each product), in a fixed order.
#define CP_TERM_PRODUCTS(C, b)                 \
  do {                                         \
    _tile_loadd(7, (b), 64);                   \
    _tile_dpbf16ps(C, 4, 7);                   \
    _tile_dpbf16ps(C, 5, 7);                   \
    _tile_dpbf16ps(C, 6, 7);                   \
    _tile_loadd(7, (b) + kTileValues, 64);     \
    _tile_dpbf16ps(C, 4, 7);                   \
    _tile_dpbf16ps(C, 5, 7);                   \
    _tile_loadd(7, (b) + 2 * kTileValues, 64); \
    _tile_dpbf16ps(C, 4, 7);                   \
  } while (0)

class AmxFlashPrefill {
 public:
  AmxFlashPrefill(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                  MlaPrefillState& state)
      : a_(a),
        qk_(a.nope_dim + a.rope_dim),
        qkp_((qk_ + kStep - 1) / kStep * kStep),
        dblocks_(qkp_ / kStep),
        vtiles_((a.v_dim + kTile - 1) / kTile),
        first_pos_(a.context_len - a.num_queries),
        query_block_(state.query_block),
        num_qblocks_((a.num_queries + state.query_block - 1) / state.query_block),
        o_stride_(flash_o_stride(a.v_dim)),
        key_begin_(key_begin),
        key_end_(key_end),
        state_(state) {}

  void run(std::atomic<int64_t>& next) {
    const int64_t qpad = (query_block_ + kTile - 1) / kTile * kTile;
    q_terms_ = scratch(q_buffer_, size_t(3 * qpad * qkp_));
    k_tiles_ = scratch(k_buffer_, size_t(dblocks_ * 4 * 3 * kTileValues));
    v_tiles_ = scratch(v_buffer_, size_t(vtiles_ * 2 * 3 * kTileValues));
    const AmxTileConfig cfg = full_amx_tiles();
    _tile_loadconfig(&cfg);
    const int64_t items = a_.num_heads * num_qblocks_;
    for (int64_t i = next.fetch_add(1); i < items; i = next.fetch_add(1)) {
      const int64_t qblock = num_qblocks_ - 1 - i / a_.num_heads, h = i % a_.num_heads;
      run_item(static_cast<int>(h), qblock);
    }
    _tile_release();
  }

 private:
  static uint16_t* scratch(tensor::AlignedBuffer<uint16_t>& b, size_t n) {
    if (b.size() < n) b.resize(n);
    return b.data();
  }

  void run_item(int h, int64_t qblock) {
    const int64_t t0 = qblock * query_block_;
    const int64_t t1 = std::min(a_.num_queries, t0 + query_block_);
    const int64_t rows = t1 - t0, padded = (rows + kTile - 1) / kTile * kTile;
    const int64_t row0 = int64_t{h} * a_.num_queries + t0;
    float* m = state_.m.data() + row0;
    float* l = state_.l.data() + row0;
    float* o = state_.o.data() + row0 * o_stride_;
    if (key_begin_ == 0) {
      std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
      std::fill(l, l + rows, 0.0f);
      std::fill(o, o + rows * o_stride_, 0.0f);
    }
    // The block's queries as three bf16 planes [padded][qkp] (zero past t1 and past qk): the A
    // tiles.
    split_bf16x3_rows(a_.q + t0 * a_.num_heads * qk_ + int64_t{h} * qk_,
                      int64_t{a_.num_heads} * qk_, qk_, 0, padded, rows, q_terms_, padded, qkp_);
    const int64_t plane = padded * qkp_;
    const int64_t last_key = std::min(first_pos_ + t1 - 1, key_end_ - 1);
    for (int64_t k0 = key_begin_; k0 <= last_key; k0 += kKeys) {
      const int64_t nkeys = std::min<int64_t>(kKeys, key_end_ - k0);
      pack_keys(h, k0, nkeys);
      pack_values(h, k0, nkeys);
      for (int64_t g = t0; g < t1; g += kTile) {
        const int64_t n = std::min<int64_t>(kTile, t1 - g);
        if (k0 > first_pos_ + g + n - 1) continue;  // the block is in all n queries' future
        block(g, t0, n, k0, nkeys, q_terms_ + (g - t0) * qkp_, plane, m, l, o);
      }
    }
    if (key_end_ < a_.context_len) return;  // more keys to come
    const int64_t o_head = int64_t{a_.num_heads} * a_.v_dim;
    for (int64_t t = t0; t < t1; ++t) {
      const float inv = 1.0f / l[t - t0];
      const float* src = o + (t - t0) * o_stride_;
      float* dst = a_.out + t * o_head + int64_t{h} * a_.v_dim;
      for (int c = 0; c < a_.v_dim; ++c) dst[c] = src[c] * inv;
    }
  }

  // kᵀ of keys [k0, k0 + nkeys) as B tiles [dim block][quarter][term]: row q of a tile holds
  // dims (2q, 2q + 1) of the block for 16 keys; keys past nkeys and dims past qk are zero.
  void pack_keys(int h, int64_t k0, int64_t nkeys) {
    for (int db = 0; db < dblocks_; ++db) {
      for (int quarter = 0; quarter < 4; ++quarter) {
        const __mmask16 valid = prefix(nkeys - quarter * kTile);
        const int64_t key = k0 - a_.key_base + quarter * kTile;
        uint16_t* tiles = k_tiles_ + (db * 4 + quarter) * 3 * kTileValues;
        for (int q = 0; q < kTile; ++q) {
          __m512i even[3], odd[3];
          split3(key_values(h, db * kStep + 2 * q, key, valid), even);
          split3(key_values(h, db * kStep + 2 * q + 1, key, valid), odd);
          for (int t = 0; t < 3; ++t)
            store_pairs(even[t], odd[t], tiles + t * kTileValues + q * 32);
        }
      }
    }
  }

  // Dimension d of 16 keys from index `key` (the valid ones; the others and dims past qk 0).
  __m512 key_values(int h, int d, int64_t key, __mmask16 valid) const {
    if (d >= qk_) return _mm512_setzero_ps();
    const float* row = d < a_.nope_dim ? a_.kt_nope + h * a_.kt_head_stride + d * a_.kt_stride
                                       : a_.kt_pe + (d - a_.nope_dim) * a_.kt_pe_stride;
    return _mm512_maskz_loadu_ps(valid, row + key);
  }

  // v of keys [k0, k0 + nkeys) as B tiles [column tile][key half][term]: row q holds keys
  // (2q, 2q + 1) of the half for 16 value columns; keys past nkeys and columns past dv are zero.
  void pack_values(int h, int64_t k0, int64_t nkeys) {
    const float* v = a_.v + (k0 - a_.key_base) * a_.v_row_stride + h * a_.v_head_stride;
    for (int c = 0; c < vtiles_; ++c) {
      const __mmask16 cols = prefix(a_.v_dim - c * kTile);
      for (int half = 0; half < 2; ++half) {
        uint16_t* tiles = v_tiles_ + (c * 2 + half) * 3 * kTileValues;
        for (int q = 0; q < kTile; ++q) {
          __m512i even[3], odd[3];
          const int64_t j = half * kStep + 2 * q;
          split3(_mm512_maskz_loadu_ps(j < nkeys ? cols : 0, v + j * a_.v_row_stride + c * kTile),
                 even);
          split3(_mm512_maskz_loadu_ps(j + 1 < nkeys ? cols : 0,
                                       v + (j + 1) * a_.v_row_stride + c * kTile),
                 odd);
          for (int t = 0; t < 3; ++t)
            store_pairs(even[t], odd[t], tiles + t * kTileValues + q * 32);
        }
      }
    }
  }

  // One key block for the n (<= 16) queries from chunk index g: scores on tiles, the online
  // softmax on AVX-512, then o = o·α + p·v with p·v on tiles.
  void block(int64_t g, int64_t t0, int64_t n, int64_t k0, int64_t nkeys, const uint16_t* q,
             int64_t plane, float* m, float* l, float* o) {
    alignas(64) float s[kTile * kKeys];
    // Scores: tiles 0-3 (16 keys each); q terms in 4-6, one k term at a time in 7.
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int db = 0; db < dblocks_; ++db) {
      _tile_loadd(4, q + db * kStep, qkp_ * 2);
      _tile_loadd(5, q + plane + db * kStep, qkp_ * 2);
      _tile_loadd(6, q + 2 * plane + db * kStep, qkp_ * 2);
      const uint16_t* kt = k_tiles_ + db * 4 * 3 * kTileValues;
      CP_TERM_PRODUCTS(0, kt);
      CP_TERM_PRODUCTS(1, kt + 3 * kTileValues);
      CP_TERM_PRODUCTS(2, kt + 6 * kTileValues);
      CP_TERM_PRODUCTS(3, kt + 9 * kTileValues);
    }
    _tile_stored(0, s, kKeys * 4);
    _tile_stored(1, s + kTile, kKeys * 4);
    _tile_stored(2, s + 2 * kTile, kKeys * 4);
    _tile_stored(3, s + 3 * kTile, kKeys * 4);

    // Online softmax per row, in two phases so that every row's rescale factor comes from one
    // vector exp; rows past n get p = 0.
    alignas(64) uint16_t p_terms[3][kTile * kKeys];
    alignas(64) float m_old[kTile], m_new[kTile], alpha[kTile];
    const __m512 scale = _mm512_set1_ps(a_.scale);
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int r = 0; r < kTile; ++r) {
      if (r >= n) {
        m_old[r] = m_new[r] = 0.0f;
        continue;
      }
      const int64_t visible = std::clamp<int64_t>(first_pos_ + g + r - k0 + 1, 0, nkeys);
      float* row = s + r * kKeys;
      __m512 mx = neg_inf;
      for (int c = 0; c < 4; ++c) {
        __m512 x = _mm512_mul_ps(_mm512_load_ps(row + c * kTile), scale);
        if (visible < kKeys) x = _mm512_mask_blend_ps(prefix(visible - c * kTile), neg_inf, x);
        _mm512_store_ps(row + c * kTile, x);
        mx = _mm512_max_ps(mx, x);
      }
      m_old[r] = m[g - t0 + r];
      m_new[r] = std::max(m_old[r], _mm512_reduce_max_ps(mx));
      m[g - t0 + r] = m_new[r];
    }
    // α = exp(m_old - m_new) for all rows at once (0 on a row's first block, where m_old is -inf).
    _mm512_store_ps(alpha, exp16(_mm512_sub_ps(_mm512_load_ps(m_old), _mm512_load_ps(m_new))));
    for (int r = 0; r < kTile; ++r) {
      if (r >= n) {
        for (int t = 0; t < 3; ++t) std::memset(p_terms[t] + r * kKeys, 0, kKeys * 2);
        continue;
      }
      const __m512 shift = _mm512_set1_ps(m_new[r]);
      const float* row = s + r * kKeys;
      __m512 e[4];
      for (int c = 0; c < 4; ++c)
        e[c] = exp16(_mm512_sub_ps(_mm512_load_ps(row + c * kTile), shift));
      l[g - t0 + r] =
          l[g - t0 + r] * alpha[r] +
          _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3])));
      for (int c = 0; c < 4; c += 2) {
        __m512i lo[3], hi[3];
        split3(e[c], lo);
        split3(e[c + 1], hi);
        for (int t = 0; t < 3; ++t) store_halves(lo[t], hi[t], p_terms[t] + r * kKeys + c * kTile);
      }
    }

    // p·v: tiles 0-3 (16 value columns each); per half of the keys, p terms in 4-6 and one v term
    // at a time in 7.
    alignas(64) float pv[kTile * 64];
    for (int c0 = 0; c0 < vtiles_; c0 += 4) {
      const int tiles = std::min(4, vtiles_ - c0);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int half = 0; half < 2; ++half) {
        _tile_loadd(4, p_terms[0] + half * kStep, kKeys * 2);
        _tile_loadd(5, p_terms[1] + half * kStep, kKeys * 2);
        _tile_loadd(6, p_terms[2] + half * kStep, kKeys * 2);
        const uint16_t* vt = v_tiles_ + (c0 * 2 + half) * 3 * kTileValues;
        if (tiles > 0) CP_TERM_PRODUCTS(0, vt);
        if (tiles > 1) CP_TERM_PRODUCTS(1, vt + 6 * kTileValues);
        if (tiles > 2) CP_TERM_PRODUCTS(2, vt + 12 * kTileValues);
        if (tiles > 3) CP_TERM_PRODUCTS(3, vt + 18 * kTileValues);
      }
      _tile_stored(0, pv, 256);
      _tile_stored(1, pv + 16, 256);
      _tile_stored(2, pv + 32, 256);
      _tile_stored(3, pv + 48, 256);
      for (int r = 0; r < n; ++r) {
        const __m512 al = _mm512_set1_ps(alpha[r]);
        float* row = o + (g - t0 + r) * o_stride_ + c0 * kTile;
        for (int c = 0; c < tiles; ++c) {
          const __m512 x = _mm512_loadu_ps(row + c * kTile);
          _mm512_storeu_ps(row + c * kTile,
                           _mm512_fmadd_ps(x, al, _mm512_load_ps(pv + r * 64 + c * kTile)));
        }
      }
    }
  }

  const MlaPrefillArgs& a_;
  const int qk_, qkp_, dblocks_, vtiles_;  // qkp_: qk rounded up to whole dim blocks
  const int64_t first_pos_;
  const int64_t query_block_;
  const int64_t num_qblocks_;
  const int64_t o_stride_;
  const int64_t key_begin_, key_end_;
  MlaPrefillState& state_;
  uint16_t *q_terms_ = nullptr, *k_tiles_ = nullptr, *v_tiles_ = nullptr;
  static thread_local tensor::AlignedBuffer<uint16_t> q_buffer_, k_buffer_, v_buffer_;
};

thread_local tensor::AlignedBuffer<uint16_t> AmxFlashPrefill::q_buffer_;
thread_local tensor::AlignedBuffer<uint16_t> AmxFlashPrefill::k_buffer_;
thread_local tensor::AlignedBuffer<uint16_t> AmxFlashPrefill::v_buffer_;

}  // namespace

void mla_prefill_items_amx(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                           MlaPrefillState& state, std::atomic<int64_t>& next) {
  AmxFlashPrefill(a, key_begin, key_end, state).run(next);
}

}  // namespace kernels::detail

#undef CP_TERM_PRODUCTS

CHUNKPIPE_TARGET_END()
