// MLA attention. Scores and weighted sums run through sgemm on blocks of queries per head
// (prefill) or on cache blocks (decode); softmax is exact (whole row materialized) in f32.
#include "kernels/mla_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/vec_exp.h"
#include "tensor/aligned_buffer.h"

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

}  // namespace

void mla_prefill_attention(const MlaPrefillArgs& a, common::ThreadPool& pool) {
  const int64_t T = a.num_queries, ctx = a.context_len, first_pos = ctx - T;
  const int64_t q_stride = static_cast<int64_t>(a.num_heads) * (a.nope_dim + a.rope_dim);
  const int64_t o_stride = static_cast<int64_t>(a.num_heads) * a.v_dim;
  // Query blocks sized so one block's score rows stay around 1M floats.
  const int64_t qb = std::clamp<int64_t>((int64_t{1} << 20) / std::max<int64_t>(ctx, 1), 16, 256);
  const int64_t num_qblocks = (T + qb - 1) / qb;
  pool.parallel_for(a.num_heads * num_qblocks, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t item = begin; item < end; ++item) {
      const int h = static_cast<int>(item / num_qblocks);
      const int64_t q0 = (item % num_qblocks) * qb, q1 = std::min(T, q0 + qb), nq = q1 - q0;
      const int64_t nk = first_pos + q1;  // keys visible to the block's last query
      auto& s = scores_scratch(static_cast<size_t>(nq * nk));
      const float* qh = a.q + q0 * q_stride + static_cast<int64_t>(h) * (a.nope_dim + a.rope_dim);
      sgemm(nq, nk, a.nope_dim, a.scale, qh, q_stride, a.k_nope + h * a.kv_head_stride,
            a.kv_row_stride, true, 0.0f, s.data(), nk);
      sgemm(nq, nk, a.rope_dim, a.scale, qh + a.nope_dim, q_stride, a.k_pe, a.k_pe_stride, true,
            1.0f, s.data(), nk);
      for (int64_t i = 0; i < nq; ++i)
        softmax_prefix(s.data() + i * nk, first_pos + q0 + i + 1, nk);
      sgemm(nq, a.v_dim, nk, 1.0f, s.data(), nk, a.v + h * a.kv_head_stride, a.kv_row_stride, false,
            0.0f, a.out + q0 * o_stride + static_cast<int64_t>(h) * a.v_dim, o_stride);
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
        const float* kn = a.k_nope + j * a.kv_row_stride + h * a.kv_head_stride;
        const float* kp = a.k_pe + j * a.k_pe_stride;
        double dot = 0.0;
        for (int d = 0; d < a.nope_dim; ++d) dot += static_cast<double>(q[d]) * kn[d];
        for (int d = 0; d < a.rope_dim; ++d) dot += static_cast<double>(q[a.nope_dim + d]) * kp[d];
        scores[j] = dot * a.scale;
        max_v = std::max(max_v, scores[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < visible; ++j) sum += (scores[j] = std::exp(scores[j] - max_v));
      float* o = a.out + (t * a.num_heads + h) * a.v_dim;
      for (int d = 0; d < a.v_dim; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j < visible; ++j) {
          acc += scores[j] * a.v[j * a.kv_row_stride + h * a.kv_head_stride + d];
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
  pool.parallel_for(num_rows, 4, [&](int64_t r0, int64_t r1, int) {
    const int64_t nr = r1 - r0;
    auto& s = scores_scratch(static_cast<size_t>(nr * ctx));
    const float* q = a.q + r0 * row;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t n = std::min(bs, ctx - b * bs);
      const float* blk = a.cache + static_cast<int64_t>(a.block_table[b]) * bs * row;
      sgemm(nr, n, row, a.scale, q, row, blk, row, true, 0.0f, s.data() + b * bs, ctx);
    }
    for (int64_t i = 0; i < nr; ++i) {
      const int64_t t = (r0 + i) / a.num_heads;
      softmax_prefix(s.data() + i * ctx, first_pos + t + 1, ctx);
    }
    float* out = a.out + r0 * a.kv_lora_rank;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t n = std::min(bs, ctx - b * bs);
      const float* blk = a.cache + static_cast<int64_t>(a.block_table[b]) * bs * row;
      sgemm(nr, a.kv_lora_rank, n, 1.0f, s.data() + b * bs, ctx, blk, row, false,
            b == 0 ? 0.0f : 1.0f, out, a.kv_lora_rank);
    }
  });
}

void mla_decode_attention_reference(const MlaDecodeArgs& a) {
  const int64_t T = a.num_queries, ctx = a.context_len, first_pos = ctx - T;
  const int64_t row = a.kv_lora_rank + a.rope_dim;
  auto cache_row = [&](int64_t j) {
    return a.cache + (static_cast<int64_t>(a.block_table[j / a.block_size]) * a.block_size +
                      j % a.block_size) *
                         row;
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
      for (int d = 0; d < a.kv_lora_rank; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j < visible; ++j) acc += scores[j] * cache_row(j)[d];
        o[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace kernels
