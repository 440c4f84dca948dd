// Internal to kernels: the absorbed-form (MQA over the latent cache) attention of a block of query
// rows over one split of keys, written once over a SIMD traits type S (mla_flash_avx2_traits.h,
// mla_flash_avx512_traits.h). Invariant: every score is one FMA chain per lane over the row's
// dimensions, then a fixed horizontal sum; every output element one FMA chain over the keys in
// order. No result depends on how rows or keys were tiled. Include it after a file's target
// pragma, with mla_decode_paths.h, gemm.h and simd.h included before it. Thread-safe for disjoint
// outputs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/mla_attention.h"
#include "kernels/mla_decode_paths.h"
#include "kernels/simd.h"

namespace kernels::detail {

template <class S>
class FlashDecode {
 public:
  using Vec = typename S::Vec;
  static constexpr int kWidth = S::kWidth;
  // Score tile: rows × keys accumulators, each a chain over the dimensions (16 of 32 registers
  // on AVX-512, 12 of 16 on AVX2, where 8 left two FMAs a cycle at a 4-cycle latency no slack). The
  // accumulators are reduced kWidth at a time by S::transpose_sum, the last group padded with
  // zeros; its tree over one vector's lanes does not depend on the vector's place or the others.
  static constexpr int kScoreRows = kWidth == 16 ? 4 : 2;
  static constexpr int kScoreKeys = kWidth == 16 ? 4 : 6;
  static constexpr int kScoreTile = kScoreRows * kScoreKeys;
  static constexpr int kSumGroups = (kScoreTile + kWidth - 1) / kWidth;
  // Output tile: S::kRows rows × 4 vectors of columns.
  static constexpr int kRows = S::kRows;
  static constexpr int kVecs = 4;
  static constexpr int kCols = kVecs * kWidth;
  static_assert(64 % kCols == 0, "partial rows are whole 64-column slices");

  FlashDecode(const MlaDecodeArgs& a, DecodeScratch& s)
      : a_(a),
        row_(a.kv_lora_rank + a.rope_dim),
        o_stride_(decode_o_stride(a.kv_lora_rank)),
        first_pos_(a.context_len - a.num_queries),
        dim_steps_((row_ + kWidth - 1) / kWidth),
        s_(s) {}

  void run_split(int64_t r0, int64_t r1, int64_t split, DecodePartial out) {
    const int64_t nr = r1 - r0;
    std::fill_n(out.m, nr, -std::numeric_limits<float>::infinity());
    std::fill_n(out.l, nr, 0.0f);
    std::fill_n(out.o, nr * o_stride_, 0.0f);
    const int64_t k0 = split * kDecodeSplitKeys;
    const int64_t k1 = std::min(k0 + kDecodeSplitKeys, position(r1 - 1) + 1);
    if (s_.scores.size() < size_t(nr * kDecodeSegmentKeys)) {
      s_.scores.resize(size_t(nr * kDecodeSegmentKeys));
    }
    split_end_ = k1;
    for (int64_t s0 = k0; s0 < k1; s0 += kDecodeSegmentKeys) {
      segment(r0, r1, s0, std::min(s0 + kDecodeSegmentKeys, k1), out);
    }
  }

 private:
  int64_t position(int64_t row) const { return first_pos_ + row / a_.num_heads; }

  // Points s_.key_rows at the cache rows of keys [s0, s1): in place in an f32 cache, widened into
  // scratch from a bf16 one.
  void locate_keys(int64_t s0, int64_t s1) {
    const int64_t bs = a_.block_size, n = s1 - s0;
    s_.key_rows.resize(size_t(n));
    if (a_.cache_bf16 && s_.widened.size() < size_t(n * row_)) {
      s_.widened.resize(size_t(kDecodeSegmentKeys * row_));
    }
    for (int64_t j = s0; j < s1;) {
      const int64_t in_block = j % bs, run = std::min(s1 - j, bs - in_block);
      const int64_t at = (int64_t{a_.block_table[j / bs]} * bs + in_block) * row_;
      const float* rows = nullptr;
      if (a_.cache_bf16) {
        float* dst = s_.widened.data() + (j - s0) * row_;
        bf16_to_f32_row(a_.cache_bf16 + at, dst, run * row_);
        rows = dst;
      } else {
        rows = a_.cache + at;
      }
      for (int64_t i = 0; i < run; ++i) s_.key_rows[size_t(j - s0 + i)] = rows + i * row_;
      j += run;
    }
  }

  // scores[i][j] = scale · q_i · k_j for rows [r0, r0 + nr) and the segment's n keys. Tiles past
  // the last row or key repeat it (their results are dropped), so every tile is whole.
  void score(int64_t r0, int64_t nr, int64_t n) {
    const int full = static_cast<int>(row_ / kWidth) * kWidth, tail = static_cast<int>(row_) - full;
    for (int64_t i0 = 0; i0 < nr; i0 += kScoreRows) {
      const float* q[kScoreRows];
      for (int i = 0; i < kScoreRows; ++i)
        q[i] = a_.q + (r0 + std::min<int64_t>(i0 + i, nr - 1)) * row_;
      for (int64_t j0 = 0; j0 < n; j0 += kScoreKeys) {
        const float* k[kScoreKeys];
        for (int j = 0; j < kScoreKeys; ++j)
          k[j] = s_.key_rows[size_t(std::min<int64_t>(j0 + j, n - 1))];
        Vec acc[kScoreTile];
        dot_tile(q, k, full, tail, take_prefetch_span(), acc);
        // Lane i·kScoreKeys + j holds score (i, j).
        alignas(64) float sums[kSumGroups * kWidth];
        if constexpr (kSumGroups == 1) {
          S::store(sums, S::mul(S::transpose_sum(acc), S::set1(a_.scale)));
        } else {
          for (int g = 0; g < kSumGroups; ++g) {
            Vec group[kWidth];
            for (int l = 0; l < kWidth; ++l)
              group[l] = g * kWidth + l < kScoreTile ? acc[g * kWidth + l] : S::zero();
            S::store(sums + g * kWidth, S::mul(S::transpose_sum(group), S::set1(a_.scale)));
          }
        }
        for (int i = 0; i < kScoreRows && i0 + i < nr; ++i) {
          float* out = s_.scores.data() + (i0 + i) * kDecodeSegmentKeys + j0;
          for (int j = 0; j < kScoreKeys && j0 + j < n; ++j) out[j] = sums[i * kScoreKeys + j];
        }
      }
    }
  }

  // Lines of the next segment for one score tile to prefetch, a few per step.
  struct PrefetchSpan {
    const char* at = nullptr;
    int64_t lines = 0;
    int64_t per_step = 0;
  };

  // acc[i·kScoreKeys + j] = per-lane partial sums of q_i · k_j over the row's dimensions, in
  // order, prefetching the span meanwhile. Static, with everything it touches in its arguments,
  // so that the accumulators, keys and pointers stay in registers (16 on AVX2).
  static void dot_tile(const float* const (&q)[kScoreRows], const float* const (&k)[kScoreKeys],
                       int full, int tail, PrefetchSpan pf, Vec (&acc)[kScoreTile]) {
    for (Vec& v : acc) v = S::zero();
    for (int d = 0; d < full; d += kWidth) {
      for (int64_t i = 0; i < pf.per_step && pf.lines > 0; ++i, --pf.lines, pf.at += 64) {
        _mm_prefetch(pf.at, _MM_HINT_T1);
      }
      if constexpr (kWidth == 16) {
        // The keys' vectors first, held in registers, then a row at a time.
        Vec kv[kScoreKeys];
        for (int j = 0; j < kScoreKeys; ++j) {
          kv[j] = S::load(k[j] + d);
          asm("" : "+v"(kv[j]));  // held in a register: loaded once, not once per row
        }
        for (int i = 0; i < kScoreRows; ++i) {
          const Vec qv = S::load(q[i] + d);
          for (int j = 0; j < kScoreKeys; ++j)
            acc[i * kScoreKeys + j] = S::fmadd(qv, kv[j], acc[i * kScoreKeys + j]);
        }
      } else {
        // AVX2: the rows' vectors first, then one key at a time against them. A key array
        // under the barrier was kept in memory by GCC: a store per key per step.
        Vec qv[kScoreRows];
        for (int i = 0; i < kScoreRows; ++i) qv[i] = S::load(q[i] + d);
        for (int j = 0; j < kScoreKeys; ++j) {
          Vec kv = S::load(k[j] + d);
          asm("" : "+v"(kv));  // held in a register: loaded once, not once per row
          for (int i = 0; i < kScoreRows; ++i)
            acc[i * kScoreKeys + j] = S::fmadd(qv[i], kv, acc[i * kScoreKeys + j]);
        }
      }
    }
    if (tail > 0) {
      for (int i = 0; i < kScoreRows; ++i) {
        const Vec qv = S::load_n(q[i] + full, tail);
        for (int j = 0; j < kScoreKeys; ++j) {
          acc[i * kScoreKeys + j] =
              S::fmadd(qv, S::load_n(k[j] + full, tail), acc[i * kScoreKeys + j]);
        }
      }
    }
  }

  // The next segment's cache bytes, as runs within blocks, fetched into L2 a few lines per score
  // step: the current segment's products run from L2 while memory delivers the next one at an
  // even rate (prefetching only ahead of the first rows asked for the keys in bursts).
  void plan_prefetch(int64_t s0, int64_t s1, int64_t steps) {
    prefetch_runs_.clear();
    run_index_ = 0;
    line_ = 0;
    const int64_t bs = a_.block_size;
    const int64_t value_bytes = a_.cache_bf16 ? 2 : 4;
    int64_t lines = 0;
    for (int64_t j = s0; j < s1;) {
      const int64_t in_block = j % bs, run = std::min(s1 - j, bs - in_block);
      const int64_t at = (int64_t{a_.block_table[j / bs]} * bs + in_block) * row_;
      const char* base = a_.cache_bf16 ? reinterpret_cast<const char*>(a_.cache_bf16 + at)
                                       : reinterpret_cast<const char*>(a_.cache + at);
      const int64_t run_lines = (run * row_ * value_bytes + 63) / 64;
      prefetch_runs_.push_back({base, run_lines});
      lines += run_lines;
      j += run;
    }
    lines_per_step_ = steps > 0 ? std::min<int64_t>(2, (lines + steps - 1) / steps) : 0;
  }

  // The next lines for one tile's dim_steps_ steps, within one run (a tile at a run's end takes
  // fewer; the next tile goes on from the next run).
  PrefetchSpan take_prefetch_span() {
    PrefetchSpan span;
    if (run_index_ >= prefetch_runs_.size() || lines_per_step_ == 0) return span;
    const PrefetchRun& run = prefetch_runs_[run_index_];
    span.at = run.base + line_ * 64;
    span.lines = std::min(run.lines - line_, lines_per_step_ * dim_steps_);
    span.per_step = lines_per_step_;
    line_ += span.lines;
    if (line_ == run.lines) line_ = 0, ++run_index_;
    return span;
  }

  // The online-softmax step of rows [r0, r1) over keys [s0, s1).
  void segment(int64_t r0, int64_t r1, int64_t s0, int64_t s1, DecodePartial st) {
    const int64_t nr = r1 - r0, n = s1 - s0;
    locate_keys(s0, s1);
    const int64_t next_end = std::min(s1 + kDecodeSegmentKeys, split_end_);
    plan_prefetch(
        s1, std::max(s1, next_end),
        (nr + kScoreRows - 1) / kScoreRows * ((n + kScoreKeys - 1) / kScoreKeys) * dim_steps_);
    score(r0, nr, n);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    std::vector<float>& alpha = s_.alpha;
    alpha.assign(size_t(nr), 1.0f);
    int64_t used = 0;  // keys any row sees
    for (int64_t i = 0; i < nr; ++i) {
      float* p = s_.scores.data() + i * kDecodeSegmentKeys;
      const int valid = static_cast<int>(std::clamp<int64_t>(position(r0 + i) + 1 - s0, 0, n));
      used = std::max<int64_t>(used, valid);
      Vec mx = S::set1(neg_inf);
      for (int j = 0; j < valid; j += kWidth)
        mx = S::max(mx, S::fill_from(S::load_n(p + j, valid - j), valid - j, neg_inf));
      const float m = std::max(st.m[i], S::hmax(mx));
      if (m == neg_inf) {  // nothing seen yet, nothing now
        std::fill_n(p, n, 0.0f);
        continue;
      }
      alpha[size_t(i)] = std::exp(st.m[i] - m);  // 0 on the row's first keys
      st.m[i] = m;
      const Vec shift = S::set1(m);
      Vec sum = S::zero();
      for (int j = 0; j < valid; j += kWidth) {
        const Vec e =
            S::fill_from(S::exp(S::sub(S::load_n(p + j, valid - j), shift)), valid - j, 0.0f);
        S::store(p + j, e);  // lanes past `valid` are 0, inside the row's 128
        sum = S::add(sum, e);
      }
      st.l[i] = alpha[size_t(i)] * st.l[i] + S::hsum(sum);
      std::fill(p + valid, p + n, 0.0f);
    }
    update_outputs(nr, used, st);
  }

  // o = alpha · o + p · v, rows in tiles of up to kRows (as even as they split: 8 rows run as
  // 4 + 4, not 6 + 2, whose 2-row tile waits on loads), columns in slices of kCols.
  void update_outputs(int64_t nr, int64_t used, DecodePartial st) {
    const int64_t tiles = (nr + kRows - 1) / kRows;
    for (int64_t t = 0, i0 = 0; t < tiles; ++t) {
      const int64_t rows = (nr - i0) / (tiles - t);  // the remaining rows over the remaining tiles
      const int64_t at = i0;
      i0 += rows;
      switch (rows) {
        case 1:
          update_tile<1>(at, used, st);
          break;
        case 2:
          update_tile<2>(at, used, st);
          break;
        case 3:
          update_tile<3>(at, used, st);
          break;
        case 4:
          if constexpr (kRows >= 4) update_tile<4>(at, used, st);
          break;
        case 5:
          if constexpr (kRows >= 5) update_tile<5>(at, used, st);
          break;
        case 6:
          if constexpr (kRows >= 6) update_tile<6>(at, used, st);
          break;
        default:
          break;
      }
    }
  }

  // R rows' output tiles stay in registers while the keys stream by.
  template <int R>
  void update_tile(int64_t i0, int64_t used, DecodePartial st) {
    const int r = a_.kv_lora_rank;
    const float* p_rows[R];
    Vec alpha[R];
    for (int i = 0; i < R; ++i) {
      p_rows[i] = s_.scores.data() + (i0 + i) * kDecodeSegmentKeys;
      alpha[i] = S::set1(s_.alpha[size_t(i0 + i)]);
    }
    for (int c0 = 0; c0 < r; c0 += kCols) {
      const int cols = std::min(kCols, r - c0);
      Vec o[R][kVecs];
      for (int i = 0; i < R; ++i) {
        const float* src = st.o + (i0 + i) * o_stride_ + c0;
        for (int c = 0; c < kVecs; ++c) o[i][c] = S::mul(S::load(src + c * kWidth), alpha[i]);
      }
      if (cols == kCols) {
        accumulate<R, true>(p_rows, used, c0, cols, o);
      } else {
        accumulate<R, false>(p_rows, used, c0, cols, o);
      }
      for (int i = 0; i < R; ++i) {
        float* dst = st.o + (i0 + i) * o_stride_ + c0;
        for (int c = 0; c < kVecs; ++c) S::store(dst + c * kWidth, o[i][c]);
      }
    }
  }

  template <int R, bool kFull>
  void accumulate(const float* const (&p_rows)[R], int64_t used, int c0, int cols,
                  Vec (&o)[R][kVecs]) const {
    // The R weights broadcast first, then a column vector at a time: R·kVecs accumulators, R
    // weights and one vector (16 registers on AVX2 at R = 3).
    for (int64_t j = 0; j < used; ++j) {
      const float* v = s_.key_rows[size_t(j)] + c0;
      Vec p[R];
      for (int i = 0; i < R; ++i) p[i] = S::set1(p_rows[i][j]);
      for (int c = 0; c < kVecs; ++c) {
        const Vec x =
            kFull ? S::load(v + c * kWidth) : S::load_n(v + c * kWidth, cols - c * kWidth);
        for (int i = 0; i < R; ++i) o[i][c] = S::fmadd(p[i], x, o[i][c]);
      }
    }
  }

  struct PrefetchRun {
    const char* base;
    int64_t lines;
  };

  const MlaDecodeArgs& a_;
  const int64_t row_, o_stride_, first_pos_;
  const int64_t dim_steps_;  // vectors per cache row: the steps of one score tile
  DecodeScratch& s_;
  std::vector<PrefetchRun> prefetch_runs_;
  size_t run_index_ = 0;
  int64_t line_ = 0, lines_per_step_ = 0;
  int64_t split_end_ = 0;
};

}  // namespace kernels::detail
