// MLA attention. Prefill: the blocked online-softmax pass of mla_flash.h, instantiated here for
// AVX2 (the AVX-512 ones are in mla_attention_avx512*.cpp). Decode: sgemm on cache blocks with the
// whole score row materialized, softmax exact in f32.
#include "kernels/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "common/check.h"
#include "common/logging.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/mla_flash.h"
#include "kernels/simd.h"
#include "kernels/vec_exp.h"
#include "tensor/aligned_buffer.h"
#include "tensor/dtype.h"

namespace kernels {
namespace {

tensor::AlignedBuffer<float>& scores_scratch(size_t size) {
  thread_local tensor::AlignedBuffer<float> buffer;
  if (buffer.size() < size) buffer.resize(size);
  return buffer;
}

// In-place softmax of row[0, valid); entries [valid, n) are set to 0.
void softmax_prefix(float* row, int64_t valid, int64_t n) {
  float max_v = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < valid; ++j) max_v = std::max(max_v, row[j]);
  // exp8: std::exp per element was a sixth of a long prefill.
  const __m256 shift = _mm256_set1_ps(max_v);
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= valid; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), shift));
    _mm256_storeu_ps(row + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  for (; j < valid; ++j) {
    row[j] = std::exp(row[j] - max_v);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < valid; ++j) row[j] *= inv;
  for (int64_t j = valid; j < n; ++j) row[j] = 0.0f;
}

// 8 lanes; 3 queries × 4 key vectors keep 12 accumulators, 3 broadcasts and a key in 16 registers.
struct Avx2 {
  using Vec = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kRows = 3;
  static constexpr bool kBf16Pairs = false;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256i prefix_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Vec load_n(const float* p, int n) {
    if (n <= 0) return zero();
    return n >= kWidth ? load(p) : _mm256_maskload_ps(p, prefix_mask(n));
  }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Vec fill_from(Vec v, int n, float x) {
    if (n >= kWidth) return v;
    return _mm256_blendv_ps(_mm256_set1_ps(x), v, _mm256_castsi256_ps(prefix_mask(n)));
  }
  static float hmax(Vec v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  static float hsum(Vec v) { return simd::hsum(v); }
  static Vec exp(Vec v) { return exp8(v); }
};

}  // namespace

namespace detail {

int64_t flash_query_block(int64_t num_heads, int64_t num_queries, int64_t num_threads,
                          int64_t multiple) {
  auto items_for = [&](int64_t block) { return num_heads * ((num_queries + block - 1) / block); };
  int64_t block = kFlashMaxQueryBlock;
  while (block > kFlashMinQueryBlock && items_for(block) < 2 * num_threads) block /= 2;
  const int64_t blocks = (num_queries + block - 1) / block;
  const int64_t even = (num_queries + blocks - 1) / blocks;
  return std::max<int64_t>(multiple, (even + multiple - 1) / multiple * multiple);
}

void mla_prefill_items_avx2(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                            MlaPrefillState& state, std::atomic<int64_t>& next) {
  FlashPrefill<Avx2>(a, key_begin, key_end, state).run(next);
}

}  // namespace detail

std::optional<bool> parse_attention_precision(std::string_view value) {
  if (value == "bf16") return true;
  if (value.empty() || value == "f32") return false;
  return std::nullopt;
}

bool bf16_prefill_attention() {
  static const bool bf16 = [] {
    const char* env = std::getenv("CHUNKPIPE_ATTENTION");
    const std::optional<bool> v = parse_attention_precision(env ? env : "");
    if (!v) {
      LOG(WARNING) << "CHUNKPIPE_ATTENTION=" << env
                   << " is not one of f32, bf16; the attention stays f32";
    }
    return v.value_or(false);
  }();
  return bf16;
}

void mla_prefill_attention(const MlaPrefillArgs& a, common::ThreadPool& pool) {
  thread_local MlaPrefillState state;
  MlaPrefillArgs whole = a;
  whole.key_base = 0;
  mla_prefill_attention_keys(whole, 0, a.context_len, state, pool);
}

void mla_prefill_attention_keys(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                                MlaPrefillState& state, common::ThreadPool& pool) {
  CHECK(key_begin % kMlaPrefillKeyAlign == 0 && key_begin < key_end && key_end <= a.context_len &&
        (key_end == a.context_len || key_end % kMlaPrefillKeyAlign == 0) && a.key_base == key_begin)
      << "mla_prefill_attention_keys: keys [" << key_begin << ", " << key_end << ") of "
      << a.context_len;
  const bool avx512 = cpu_features().avx512;
  const bool amx = avx512 && amx_bf16_active();
  const bool bf16 = a.bf16 && !amx && cpu_features().avx512_bf16;
  if (key_begin == 0) {
    // Grows only: every item starts its own rows when it runs the first keys.
    state.query_block =
        detail::flash_query_block(a.num_heads, a.num_queries, pool.num_threads(), amx ? 16 : 6);
    const size_t rows = size_t(a.num_heads) * size_t(a.num_queries);
    const size_t o_size = rows * size_t(detail::flash_o_stride(a.v_dim));
    if (state.m.size() < rows) state.m.resize(rows);
    if (state.l.size() < rows) state.l.resize(rows);
    if (state.o.size() < o_size) state.o.resize(o_size);
  }
  if (bf16) {
    const auto grow = [](tensor::AlignedBuffer<uint32_t>& b, int64_t n) {
      if (b.size() < size_t(n)) b.resize(size_t(n));
    };
    const int64_t pairs = detail::flash_qk_pairs(a);
    const int64_t blocks = a.num_heads * detail::flash_key_blocks(key_begin, key_end);
    if (key_begin == 0) grow(state.q_pairs, a.num_heads * a.num_queries * pairs);
    grow(state.k_pairs, blocks * pairs * detail::kFlashPairKeys);
    grow(state.v_pairs, blocks * detail::kFlashPairKeys / 2 * detail::flash_o_stride(a.v_dim));
    pool.parallel_for(a.num_heads, 1, [&](int64_t h0, int64_t h1, int) {
      detail::mla_prefill_pack_avx512_bf16(a, key_begin, key_end, state, h0, h1);
    });
  }
  const int64_t items = a.num_heads * ((a.num_queries + state.query_block - 1) / state.query_block);
  const int64_t parts = std::min<int64_t>(pool.num_threads(), items);
  std::atomic<int64_t> next{0};
  // Every part drains the shared counter, so a thread given several parts needs one call.
  pool.parallel_for(parts, 1, [&](int64_t, int64_t, int) {
    if (amx) {
      detail::mla_prefill_items_amx(a, key_begin, key_end, state, next);
    } else if (bf16) {
      detail::mla_prefill_items_avx512_bf16(a, key_begin, key_end, state, next);
    } else if (avx512) {
      detail::mla_prefill_items_avx512(a, key_begin, key_end, state, next);
    } else {
      detail::mla_prefill_items_avx2(a, key_begin, key_end, state, next);
    }
  });
}

void mla_prefill_attention_reference(const MlaPrefillArgs& a) {
  const int64_t T = a.num_queries, ctx = a.context_len, first_pos = ctx - T;
  const int qk_dim = a.nope_dim + a.rope_dim;
  std::vector<double> scores(static_cast<size_t>(ctx));
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < a.num_heads; ++h) {
      const float* q = a.q + (t * a.num_heads + h) * qk_dim;
      const int64_t visible = first_pos + t + 1;
      double max_v = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        const float* kn = a.kt_nope + h * a.kt_head_stride + j;
        const float* kp = a.kt_pe + j;
        double dot = 0.0;
        for (int d = 0; d < a.nope_dim; ++d) dot += static_cast<double>(q[d]) * kn[d * a.kt_stride];
        for (int d = 0; d < a.rope_dim; ++d)
          dot += static_cast<double>(q[a.nope_dim + d]) * kp[d * a.kt_pe_stride];
        scores[j] = dot * a.scale;
        max_v = std::max(max_v, scores[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < visible; ++j) sum += (scores[j] = std::exp(scores[j] - max_v));
      float* o = a.out + (t * a.num_heads + h) * a.v_dim;
      for (int d = 0; d < a.v_dim; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j < visible; ++j) {
          acc += scores[j] * a.v[j * a.v_row_stride + h * a.v_head_stride + d];
        }
        o[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

void mla_decode_attention(const MlaDecodeArgs& a, common::ThreadPool& pool) {
  const int64_t T = a.num_queries, ctx = a.context_len, first_pos = ctx - T;
  const int64_t row = a.kv_lora_rank + a.rope_dim;
  const int64_t bs = a.block_size;
  const int64_t num_rows = T * a.num_heads;  // one query row per (token, head)
  const int64_t num_blocks = (ctx + bs - 1) / bs;
  CHECK((a.cache != nullptr) != (a.cache_bf16 != nullptr)) << "mla_decode_attention: one cache";
  pool.parallel_for(num_rows, 4, [&](int64_t r0, int64_t r1, int) {
    const int64_t nr = r1 - r0;
    auto& s = scores_scratch(static_cast<size_t>(nr * ctx));
    // Logical block b's first n rows as f32: in place, or widened from bf16 into L2-sized scratch
    // (both passes widen again rather than hold the whole context).
    thread_local tensor::AlignedBuffer<float> widened;
    auto block = [&](int64_t b, int64_t n) -> const float* {
      const int64_t first = static_cast<int64_t>(a.block_table[b]) * bs * row;
      if (a.cache) return a.cache + first;
      if (widened.size() < size_t(bs * row)) widened.resize(size_t(bs * row));
      bf16_to_f32_row(a.cache_bf16 + first, widened.data(), n * row);
      return widened.data();
    };
    const float* q = a.q + r0 * row;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t n = std::min(bs, ctx - b * bs);
      sgemm(nr, n, row, a.scale, q, row, block(b, n), row, true, 0.0f, s.data() + b * bs, ctx);
    }
    for (int64_t i = 0; i < nr; ++i) {
      const int64_t t = (r0 + i) / a.num_heads;
      softmax_prefix(s.data() + i * ctx, first_pos + t + 1, ctx);
    }
    float* out = a.out + r0 * a.kv_lora_rank;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t n = std::min(bs, ctx - b * bs);
      sgemm(nr, a.kv_lora_rank, n, 1.0f, s.data() + b * bs, ctx, block(b, n), row, false,
            b == 0 ? 0.0f : 1.0f, out, a.kv_lora_rank);
    }
  });
}

void mla_decode_attention_reference(const MlaDecodeArgs& a) {
  const int64_t T = a.num_queries, ctx = a.context_len, first_pos = ctx - T;
  const int64_t row = a.kv_lora_rank + a.rope_dim;
  std::vector<float> widened(static_cast<size_t>(row));
  auto cache_row = [&](int64_t j) {
    const int64_t at =
        (static_cast<int64_t>(a.block_table[j / a.block_size]) * a.block_size + j % a.block_size) *
        row;
    if (a.cache) return a.cache + at;
    for (int64_t d = 0; d < row; ++d)
      widened[size_t(d)] = tensor::bf16_to_f32(a.cache_bf16[at + d]);
    return static_cast<const float*>(widened.data());
  };
  std::vector<double> scores(static_cast<size_t>(ctx));
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < a.num_heads; ++h) {
      const float* q = a.q + (t * a.num_heads + h) * row;
      const int64_t visible = first_pos + t + 1;
      double max_v = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        const float* kv = cache_row(j);
        double dot = 0.0;
        for (int64_t d = 0; d < row; ++d) dot += static_cast<double>(q[d]) * kv[d];
        scores[j] = dot * a.scale;
        max_v = std::max(max_v, scores[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < visible; ++j) sum += (scores[j] = std::exp(scores[j] - max_v));
      float* o = a.out + (t * a.num_heads + h) * a.kv_lora_rank;
      std::vector<double> acc(static_cast<size_t>(a.kv_lora_rank), 0.0);
      for (int64_t j = 0; j < visible; ++j) {
        const float* kv = cache_row(j);
        for (int d = 0; d < a.kv_lora_rank; ++d) acc[size_t(d)] += scores[j] * kv[d];
      }
      for (int d = 0; d < a.kv_lora_rank; ++d) o[d] = static_cast<float>(acc[size_t(d)] / sum);
    }
  }
}

}  // namespace kernels
