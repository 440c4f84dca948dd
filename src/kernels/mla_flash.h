// Internal to kernels: expanded MLA prefill attention as one blocked online-softmax pass, written
// once over a SIMD traits type S that each ISA's file defines with internal linkage (so every
// instantiation is private to its file and built for its ISA). Traits with kBf16Pairs run q·kᵀ
// and p·v on bf16 pairs (MlaPrefillArgs::bf16). Invariant: a query's output depends only on its
// position and the data, not on its chunk or group (key blocks aligned to position 0, fixed
// arithmetic order per query). Thread-safe for disjoint items.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/mla_attention.h"
#include "tensor/aligned_buffer.h"
#include "tensor/dtype.h"

namespace kernels::detail {

// Queries per work item (one head × one block of queries): the keys a block streams are read
// once per block, so larger blocks read K and V less often (384 against 96: 4-8% faster after
// 12288 tokens). flash_query_block picks the block: at most 384 queries, halved down to 96
// while there are fewer than two items per thread, then evened out over the chunk (no short
// tail block); always a multiple of every ISA's kRows.
inline constexpr int64_t kFlashMaxQueryBlock = 384;
inline constexpr int64_t kFlashMinQueryBlock = 96;
// `multiple`: the path's queries per tile (6 on AVX-512 and AVX2, 16 on AMX).
int64_t flash_query_block(int64_t num_heads, int64_t num_queries, int64_t num_threads,
                          int64_t multiple = 6);

// Floats of MlaPrefillState::o per query: v_dim rounded up to whole slices of every ISA.
inline int64_t flash_o_stride(int v_dim) {
  return (v_dim + 63) / 64 * 64;
}

// bf16 pairs (MlaPrefillArgs::bf16, AVX-512's 64-key blocks): words per query and head in
// MlaPrefillState::q_pairs, and the k_pairs / v_pairs words a segment of keys needs.
inline constexpr int64_t kFlashPairKeys = 64;
inline int64_t flash_qk_pairs(const MlaPrefillArgs& a) {
  return (a.nope_dim + 1) / 2 + (a.rope_dim + 1) / 2;
}
inline int64_t flash_key_blocks(int64_t key_begin, int64_t key_end) {
  return (key_end - key_begin + kFlashPairKeys - 1) / kFlashPairKeys;
}

// Runs work items until `next` passes the last: each thread takes the next one, the blocks with
// the most keys first (the last query blocks of every head), so threads end together.
// Keys [key_begin, key_end) of every item; the first range (key_begin 0) starts each item's
// state, the last (key_end context_len) writes its outputs.
void mla_prefill_items_avx2(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                            MlaPrefillState& state, std::atomic<int64_t>& next);
void mla_prefill_items_avx512(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                              MlaPrefillState& state, std::atomic<int64_t>& next);
// The AVX512_BF16 items (mla_attention_avx512_bf16.cpp), for MlaPrefillArgs::bf16. Call only
// when cpu_features().avx512_bf16.
void mla_prefill_items_avx512_bf16(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                                   MlaPrefillState& state, std::atomic<int64_t>& next);
// Packs the bf16 pairs of keys [key_begin, key_end) of heads [h0, h1) into the state first.
void mla_prefill_pack_avx512_bf16(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                                  MlaPrefillState& state, int64_t h0, int64_t h1);
// The AMX-BF16 items (mla_flash_amx.cpp). Call only when amx_bf16_active().
void mla_prefill_items_amx(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                           MlaPrefillState& state, std::atomic<int64_t>& next);

// S provides: Vec, kWidth (lanes), kRows (queries per register tile), zero(), set1(), load(),
// load_n(p, n) (lanes >= n read as 0, no access past them), store(), fmadd(), add(), sub(),
// mul(), max(), fill_from(v, n, x) (lanes >= n set to x), hmax(), hsum(), exp(), and kBf16Pairs.
// With kBf16Pairs also: Pairs (kWidth lanes of two bf16 each), pair_set1(word), pair_load(p)
// (aligned), dot_pairs(acc, a, b) (acc + a.lo·b.lo + a.hi·b.hi per lane, vdpbf16ps),
// pack_rows(lo, hi, n, dst) (lane j = bf16(lo[j]) | bf16(hi[j]) << 16, hi null or lanes >= n
// as 0, no access past n) and pack_consecutive(p, dst) (kWidth pair words of p[0, 2·kWidth)).
// Work items are one head × one block of queries, head-major.
template <class S>
class FlashPrefill {
 public:
  using Vec = typename S::Vec;
  static constexpr int kWidth = S::kWidth;
  static constexpr int kVecs = 4;  // vectors of keys per block, and of value columns per slice
  static constexpr int kKeys = kVecs * kWidth;
  static constexpr int kRows = S::kRows;
  static_assert(6 % kRows == 0, "flash_query_block rounds blocks to multiples of 6");

  static_assert(64 % kKeys == 0 && kMlaPrefillKeyAlign % kKeys == 0);
  static_assert(!S::kBf16Pairs || kKeys == kFlashPairKeys, "pair blocks are 64 keys");

  FlashPrefill(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end, MlaPrefillState& state)
      : a_(a),
        qk_(a.nope_dim + a.rope_dim),
        first_pos_(a.context_len - a.num_queries),
        query_block_(state.query_block),
        num_qblocks_((a.num_queries + state.query_block - 1) / state.query_block),
        o_stride_(flash_o_stride(a.v_dim)),
        key_begin_(key_begin),
        key_end_(key_end),
        state_(state) {}

  void run(std::atomic<int64_t>& next) {
    const int64_t items = a_.num_heads * num_qblocks_;
    for (int64_t i = next.fetch_add(1); i < items; i = next.fetch_add(1)) {
      // Item i in order of decreasing work: the last query block of every head first.
      const int64_t qblock = num_qblocks_ - 1 - i / a_.num_heads, h = i % a_.num_heads;
      run_item(h * num_qblocks_ + qblock);
    }
  }

  // bf16 pairs (S::kBf16Pairs): packs the kᵀ and v pairs of head h's keys [key_begin, key_end)
  // into the state, once for all of the head's items. Call for every head before run().
  void pack_head_keys(int h) {
    for (int64_t k0 = key_begin_; k0 < key_end_; k0 += kKeys) {
      pack_keys(h, k0, static_cast<int>(std::min<int64_t>(kKeys, key_end_ - k0)));
    }
  }

 private:
  // The item's queries in MlaPrefillState: running max, running sum and unnormalized output.
  struct State {
    float* m;
    float* l;
    float* o;
  };

  void run_item(int64_t item) {
    const int h = static_cast<int>(item / num_qblocks_);
    const int64_t t0 = (item % num_qblocks_) * query_block_;
    const int64_t t1 = std::min(a_.num_queries, t0 + query_block_);
    const int64_t row0 = int64_t{h} * a_.num_queries + t0;
    State st{state_.m.data() + row0, state_.l.data() + row0, state_.o.data() + row0 * o_stride_};
    if (key_begin_ == 0) {
      std::fill(st.m, st.m + (t1 - t0), -std::numeric_limits<float>::infinity());
      std::fill(st.l, st.l + (t1 - t0), 0.0f);
      std::fill(st.o, st.o + (t1 - t0) * o_stride_, 0.0f);
    }
    if constexpr (S::kBf16Pairs) {
      if (key_begin_ == 0) pack_queries(h, t0, t1);
    }
    const int64_t last_key = std::min(first_pos_ + t1 - 1, key_end_ - 1);
    for (int64_t k0 = key_begin_; k0 <= last_key; k0 += kKeys) {
      const int nkeys = static_cast<int>(std::min<int64_t>(kKeys, key_end_ - k0));
      for (int64_t g = t0; g < t1; g += kRows) {
        const int n = static_cast<int>(std::min<int64_t>(kRows, t1 - g));
        if (k0 > first_pos_ + g + n - 1) continue;  // the block is in all n queries' future
        switch (n) {
          case 1:
            step<1>(h, g, t0, k0, nkeys, st);
            break;
          case 2:
            step<2>(h, g, t0, k0, nkeys, st);
            break;
          case 3:
            step<3>(h, g, t0, k0, nkeys, st);
            break;
          case 4:
            if constexpr (kRows >= 4) step<4>(h, g, t0, k0, nkeys, st);
            break;
          case 5:
            if constexpr (kRows >= 5) step<5>(h, g, t0, k0, nkeys, st);
            break;
          case 6:
            if constexpr (kRows >= 6) step<6>(h, g, t0, k0, nkeys, st);
            break;
          default:
            break;
        }
      }
    }
    if (key_end_ < a_.context_len) return;  // more keys to come
    const int64_t o_head = int64_t{a_.num_heads} * a_.v_dim;
    for (int64_t t = t0; t < t1; ++t) {
      const float inv = 1.0f / st.l[t - t0];
      const float* src = st.o + (t - t0) * o_stride_;
      float* dst = a_.out + t * o_head + int64_t{h} * a_.v_dim;
      for (int c = 0; c < a_.v_dim; ++c) dst[c] = src[c] * inv;
    }
  }

  // Scores of R queries against keys [k0, k0 + nkeys), dimension by dimension: acc += q[d] · kᵀ[d].
  template <int R, bool kFull>
  void scores(const float* const (&q)[R], const float* kt, int64_t kt_stride, int dims, int nkeys,
              Vec (&acc)[R][kVecs]) const {
    for (int d = 0; d < dims; ++d) {
      const float* row = kt + d * kt_stride;
      Vec b[R];
      for (int i = 0; i < R; ++i) b[i] = S::set1(q[i][d]);
      for (int c = 0; c < kVecs; ++c) {
        const Vec k =
            kFull ? S::load(row + c * kWidth) : S::load_n(row + c * kWidth, nkeys - c * kWidth);
        for (int i = 0; i < R; ++i) acc[i][c] = S::fmadd(b[i], k, acc[i][c]);
      }
    }
  }

  // One key block for R queries starting at chunk index g: scores, online softmax, o += p · v.
  template <int R>
  void step(int h, int64_t g, int64_t t0, int64_t k0, int nkeys, State& st) const {
    const float* q[R];
    for (int i = 0; i < R; ++i) q[i] = a_.q + (g + i) * a_.num_heads * int64_t{qk_} + h * qk_;
    const float* q_pe[R];
    for (int i = 0; i < R; ++i) q_pe[i] = q[i] + a_.nope_dim;
    Vec acc[R][kVecs];
    for (int i = 0; i < R; ++i)
      for (int c = 0; c < kVecs; ++c) acc[i][c] = S::zero();
    const float* kt_nope = a_.kt_nope + h * a_.kt_head_stride + (k0 - a_.key_base);
    const float* kt_pe = a_.kt_pe + (k0 - a_.key_base);
    if constexpr (S::kBf16Pairs) {
      scores_bf16<R>(h, g, k0, acc);
    } else if (nkeys == kKeys) {
      scores<R, true>(q, kt_nope, a_.kt_stride, a_.nope_dim, nkeys, acc);
      scores<R, true>(q_pe, kt_pe, a_.kt_pe_stride, a_.rope_dim, nkeys, acc);
    } else {
      scores<R, false>(q, kt_nope, a_.kt_stride, a_.nope_dim, nkeys, acc);
      scores<R, false>(q_pe, kt_pe, a_.kt_pe_stride, a_.rope_dim, nkeys, acc);
    }

    // Softmax in phases across the R rows, so that their reductions and exponentials overlap:
    // scaled and masked scores and row maxima, then every rescale factor in one vector exp,
    // then the probabilities. A block wholly in the future of a row leaves it unchanged
    // (max -inf, so m stays, alpha is 1 and p is 0).
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const Vec scale = S::set1(a_.scale);
    // Every lane is a visible key for every row unless the block is the context's tail or
    // reaches past the group's first query.
    const bool unmasked = nkeys == kKeys && first_pos_ + g - k0 + 1 >= kKeys;
    int visible[R];
    int used = 0;  // keys any of the R queries sees in this block
    alignas(64) float m_old[kWidth] = {}, m_new[kWidth] = {};
    for (int i = 0; i < R; ++i) {
      visible[i] = static_cast<int>(std::clamp<int64_t>(first_pos_ + g + i - k0 + 1, 0, nkeys));
      used = std::max(used, visible[i]);
      for (int c = 0; c < kVecs; ++c) {
        acc[i][c] = S::mul(acc[i][c], scale);
        if (!unmasked) acc[i][c] = S::fill_from(acc[i][c], visible[i] - c * kWidth, neg_inf);
      }
      m_old[i] = st.m[g + i - t0];
      m_new[i] = std::max(
          m_old[i], S::hmax(S::max(S::max(acc[i][0], acc[i][1]), S::max(acc[i][2], acc[i][3]))));
      st.m[g + i - t0] = m_new[i];
    }
    // alpha = exp(m_old - m_new): 0 on a row's first block, where m_old is -inf.
    alignas(64) float alpha[kWidth];
    S::store(alpha, S::exp(S::sub(S::load(m_old), S::load(m_new))));
    alignas(64) float p[R][kKeys];
    for (int i = 0; i < R; ++i) {
      const Vec shift = S::set1(m_new[i]);
      Vec e[kVecs];
      for (int c = 0; c < kVecs; ++c) {
        e[c] = S::exp(S::sub(acc[i][c], shift));
        if (!unmasked) e[c] = S::fill_from(e[c], visible[i] - c * kWidth, 0.0f);
        S::store(p[i] + c * kWidth, e[c]);
      }
      st.l[g + i - t0] =
          st.l[g + i - t0] * alpha[i] + S::hsum(S::add(S::add(e[0], e[1]), S::add(e[2], e[3])));
    }

    if constexpr (S::kBf16Pairs) {
      update_outputs_bf16<R>(h, g - t0, k0, used, p, alpha, st);
      return;
    }
    const float* v = a_.v + (k0 - a_.key_base) * a_.v_row_stride + h * a_.v_head_stride;
    for (int c0 = 0; c0 < a_.v_dim; c0 += kKeys) {
      const int cols = std::min(kKeys, a_.v_dim - c0);
      Vec o[R][kVecs];
      for (int i = 0; i < R; ++i) {
        const Vec al = S::set1(alpha[i]);
        float* row = st.o + (g + i - t0) * o_stride_ + c0;
        for (int c = 0; c < kVecs; ++c) o[i][c] = S::mul(S::load(row + c * kWidth), al);
      }
      for (int j = 0; j < used; ++j) {
        const float* vrow = v + j * a_.v_row_stride + c0;
        Vec b[R];
        for (int i = 0; i < R; ++i) b[i] = S::set1(p[i][j]);
        for (int c = 0; c < kVecs; ++c) {
          const Vec x = cols == kKeys ? S::load(vrow + c * kWidth)
                                      : S::load_n(vrow + c * kWidth, cols - c * kWidth);
          for (int i = 0; i < R; ++i) o[i][c] = S::fmadd(b[i], x, o[i][c]);
        }
      }
      for (int i = 0; i < R; ++i) {
        float* row = st.o + (g + i - t0) * o_stride_ + c0;
        for (int c = 0; c < kVecs; ++c) S::store(row + c * kWidth, o[i][c]);
      }
    }
  }

  // bf16 pairs (S::kBf16Pairs), in MlaPrefillState (sized by the caller from flash_qk_pairs and
  // flash_key_blocks). A query's pairs: nope dims (2d, 2d + 1), then rope dims, each part padded
  // with a zero to whole pairs, one row per head and query (state.q_pairs, packed by the item on
  // the pass's first keys). Per head and key block of the segment (state.k_pairs,
  // state.v_pairs): the kᵀ pairs in the same order, kKeys words per pair row; the v pairs of
  // keys (2j, 2j + 1) per value column, o_stride_ words per row; keys past the segment are 0.
  uint32_t* key_block_pairs(int h, int64_t k0) const {
    const int64_t blocks = (key_end_ - key_begin_ + kKeys - 1) / kKeys;
    return state_.k_pairs.data() + (h * blocks + (k0 - key_begin_) / kKeys) * qk_pairs_ * kKeys;
  }
  uint32_t* value_block_pairs(int h, int64_t k0) const {
    const int64_t blocks = (key_end_ - key_begin_ + kKeys - 1) / kKeys;
    return state_.v_pairs.data() + (h * blocks + (k0 - key_begin_) / kKeys) * kKeys / 2 * o_stride_;
  }
  uint32_t* query_pairs(int h, int64_t t) const {
    return state_.q_pairs.data() + (int64_t{h} * a_.num_queries + t) * qk_pairs_;
  }
  static uint32_t pair_word(float lo, float hi) {
    return uint32_t{tensor::f32_to_bf16(lo)} | uint32_t{tensor::f32_to_bf16(hi)} << 16;
  }

  void pack_queries(int h, int64_t t0, int64_t t1) {
    const int nope_pairs = (a_.nope_dim + 1) / 2;
    for (int64_t t = t0; t < t1; ++t) {
      const float* q = a_.q + t * a_.num_heads * int64_t{qk_} + h * qk_;
      uint32_t* dst = query_pairs(h, t);
      for (int d = 0; d < a_.nope_dim; d += 2)
        dst[d / 2] = pair_word(q[d], d + 1 < a_.nope_dim ? q[d + 1] : 0.0f);
      for (int d = 0; d < a_.rope_dim; d += 2)
        dst[nope_pairs + d / 2] =
            pair_word(q[a_.nope_dim + d], d + 1 < a_.rope_dim ? q[a_.nope_dim + d + 1] : 0.0f);
    }
  }

  // kᵀ pairs and v pairs of head h's keys [k0, k0 + nkeys).
  void pack_keys(int h, int64_t k0, int nkeys) {
    uint32_t* const k_pairs = key_block_pairs(h, k0);
    const auto pack_dims = [&](const float* kt, int64_t stride, int dims, uint32_t* dst) {
      for (int d = 0; d < dims; d += 2, dst += kKeys) {
        const float* hi = d + 1 < dims ? kt + (d + 1) * stride : nullptr;
        for (int c = 0; c < kVecs; ++c) {
          S::pack_rows(kt + d * stride + c * kWidth, hi ? hi + c * kWidth : nullptr,
                       nkeys - c * kWidth, dst + c * kWidth);
        }
      }
    };
    pack_dims(a_.kt_nope + h * a_.kt_head_stride + (k0 - a_.key_base), a_.kt_stride, a_.nope_dim,
              k_pairs);
    pack_dims(a_.kt_pe + (k0 - a_.key_base), a_.kt_pe_stride, a_.rope_dim,
              k_pairs + (a_.nope_dim + 1) / 2 * kKeys);
    const float* v = a_.v + (k0 - a_.key_base) * a_.v_row_stride + h * a_.v_head_stride;
    for (int j = 0; j < kKeys; j += 2) {
      uint32_t* dst = value_block_pairs(h, k0) + j / 2 * o_stride_;
      const float* lo = j < nkeys ? v + j * a_.v_row_stride : nullptr;
      const float* hi = j + 1 < nkeys ? v + (j + 1) * a_.v_row_stride : nullptr;
      for (int c = 0; c < o_stride_; c += kWidth) {
        if (lo == nullptr) {
          S::pack_rows(nullptr, nullptr, 0, dst + c);
        } else {
          S::pack_rows(lo + c, hi ? hi + c : nullptr, a_.v_dim - c, dst + c);
        }
      }
    }
  }

  // acc += q · kᵀ for head h's R queries from g against the key block at k0, a pair of dims a
  // step.
  template <int R>
  void scores_bf16(int h, int64_t g, int64_t k0, Vec (&acc)[R][kVecs]) const {
    const uint32_t* q = query_pairs(h, g);
    const uint32_t* k_pairs = key_block_pairs(h, k0);
    for (int d = 0; d < qk_pairs_; ++d) {
      const uint32_t* krow = k_pairs + d * kKeys;
      typename S::Pairs b[R];
      for (int i = 0; i < R; ++i) b[i] = S::pair_set1(q[i * qk_pairs_ + d]);
      for (int c = 0; c < kVecs; ++c) {
        const typename S::Pairs k = S::pair_load(krow + c * kWidth);
        for (int i = 0; i < R; ++i) acc[i][c] = S::dot_pairs(acc[i][c], b[i], k);
      }
    }
  }

  // o = alpha · o + p · v for the R rows, p rounded to bf16 pairs of keys; keys from `used` on
  // have p = 0 (and v pairs past the block's keys are 0).
  template <int R>
  void update_outputs_bf16(int h, int64_t i0, int64_t k0, int used, const float (&p)[R][kKeys],
                           const float* alpha, State& st) const {
    const uint32_t* v_pairs = value_block_pairs(h, k0);
    alignas(64) uint32_t pp[R][kKeys / 2];
    for (int i = 0; i < R; ++i)
      for (int c = 0; c < kKeys; c += 2 * kWidth) S::pack_consecutive(p[i] + c, pp[i] + c / 2);
    const int pairs = (used + 1) / 2;
    for (int c0 = 0; c0 < a_.v_dim; c0 += kKeys) {
      Vec o[R][kVecs];
      for (int i = 0; i < R; ++i) {
        const Vec al = S::set1(alpha[i]);
        float* row = st.o + (i0 + i) * o_stride_ + c0;
        for (int c = 0; c < kVecs; ++c) o[i][c] = S::mul(S::load(row + c * kWidth), al);
      }
      for (int j = 0; j < pairs; ++j) {
        const uint32_t* vrow = v_pairs + j * o_stride_ + c0;
        typename S::Pairs b[R];
        for (int i = 0; i < R; ++i) b[i] = S::pair_set1(pp[i][j]);
        for (int c = 0; c < kVecs; ++c) {
          const typename S::Pairs x = S::pair_load(vrow + c * kWidth);
          for (int i = 0; i < R; ++i) o[i][c] = S::dot_pairs(o[i][c], b[i], x);
        }
      }
      for (int i = 0; i < R; ++i) {
        float* row = st.o + (i0 + i) * o_stride_ + c0;
        for (int c = 0; c < kVecs; ++c) S::store(row + c * kWidth, o[i][c]);
      }
    }
  }

  const MlaPrefillArgs& a_;
  const int qk_;
  const int64_t qk_pairs_ = flash_qk_pairs(a_);
  const int64_t first_pos_;
  const int64_t query_block_;
  const int64_t num_qblocks_;
  const int64_t o_stride_;
  const int64_t key_begin_, key_end_;
  MlaPrefillState& state_;
};

}  // namespace kernels::detail
