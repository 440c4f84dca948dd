// MLA absorbed-form attention over the paged latent cache (flash-decoding): the work split into
// blocks of query rows and splits of keys, the per-split partial softmax states merged in split
// order, and the AVX2 instantiation of mla_decode_flash.h. Hand-written rather than sgemm because
// OpenBLAS's per-element sums change with the call's shape, and a query's output must depend only
// on its position and the cache: not on its chunk, batch, thread count or work split.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/check.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/mla_attention.h"
#include "kernels/mla_decode_flash.h"
#include "kernels/mla_decode_paths.h"
#include "kernels/mla_flash_avx2_traits.h"
#include "tensor/aligned_buffer.h"
#include "tensor/dtype.h"

namespace kernels {
namespace detail {

void mla_decode_split_avx2(const MlaDecodeArgs& a, int64_t r0, int64_t r1, int64_t split,
                           DecodePartial out, DecodeScratch& scratch) {
  FlashDecode<Avx2>(a, scratch).run_split(r0, r1, split, out);
}

}  // namespace detail

namespace {

using detail::DecodePartial;

// Query rows (token, head) per block: each block reads every key of its splits once.
constexpr int64_t kMaxRowBlock = 64;

DecodePartial offset(DecodePartial p, int64_t rows, int64_t o_stride) {
  return {p.m + rows, p.l + rows, p.o + rows * o_stride};
}

// acc ⊕= p over nr rows: the softmax state of two disjoint key ranges, acc's keys first.
void fold(int64_t nr, int r, int64_t o_stride, DecodePartial acc, DecodePartial p) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < nr; ++i) {
    float* ao = acc.o + i * o_stride;
    const float* po = p.o + i * o_stride;
    if (p.m[i] == neg_inf) continue;  // the range held no key this row sees
    if (acc.m[i] == neg_inf) {
      acc.m[i] = p.m[i];
      acc.l[i] = p.l[i];
      std::copy_n(po, r, ao);
      continue;
    }
    const float m = std::max(acc.m[i], p.m[i]);
    const float wa = std::exp(acc.m[i] - m), wp = std::exp(p.m[i] - m);
    acc.m[i] = m;
    acc.l[i] = wa * acc.l[i] + wp * p.l[i];
    for (int d = 0; d < r; ++d) ao[d] = wa * ao[d] + wp * po[d];
  }
}

void write_outputs(const MlaDecodeArgs& a, int64_t r0, int64_t nr, int64_t o_stride,
                   DecodePartial acc) {
  const int r = a.kv_lora_rank;
  for (int64_t i = 0; i < nr; ++i) {
    const float inv = 1.0f / acc.l[i];
    float* out = a.out + (r0 + i) * r;
    for (int d = 0; d < r; ++d) out[d] = acc.o[i * o_stride + d] * inv;
  }
}

// Partial states, m and l then o rows, for `rows` rows.
struct PartialBuffer {
  std::vector<float> ml;
  tensor::AlignedBuffer<float> o;
  DecodePartial reserve(int64_t rows, int64_t o_stride) {
    if (ml.size() < size_t(2 * rows)) ml.resize(size_t(2 * rows));
    if (o.size() < size_t(rows * o_stride)) o.resize(size_t(rows * o_stride));
    return {ml.data(), ml.data() + rows, o.data()};
  }
};

}  // namespace

void mla_decode_attention(const MlaDecodeArgs& a, common::ThreadPool& pool) {
  CHECK((a.cache != nullptr) != (a.cache_bf16 != nullptr)) << "mla_decode_attention: one cache";
  const auto run_split =
      cpu_features().avx512 ? detail::mla_decode_split_avx512 : detail::mla_decode_split_avx2;
  const int64_t rows = a.num_queries * a.num_heads;
  const int64_t splits = (a.context_len + detail::kDecodeSplitKeys - 1) / detail::kDecodeSplitKeys;
  const int64_t o_stride = detail::decode_o_stride(a.kv_lora_rank);
  const int64_t threads = pool.num_threads();
  // Blocks of rows as large as amortizes each key's read, halved while there are too few items
  // for the threads (which only adds reads of a short context): one each when all items are
  // alike, two each when a shorter last split makes them uneven. The outputs do not depend on it.
  const int64_t min_items = splits == 1 ? threads : 2 * threads;
  int64_t block = std::min(rows, kMaxRowBlock);
  while (block > 4 && (rows + block - 1) / block * splits < min_items) block = (block + 1) / 2;
  const int64_t blocks = (rows + block - 1) / block;

  if (splits == 1 || blocks >= 2 * threads) {
    // Rows enough: each block runs its splits in order, folding each into the running state.
    pool.parallel_for_dynamic(blocks, 1, [&](int64_t b0, int64_t b1, int) {
      thread_local detail::DecodeScratch scratch;
      thread_local PartialBuffer acc_buffer, split_buffer;
      const DecodePartial acc = acc_buffer.reserve(block, o_stride);
      const DecodePartial part = split_buffer.reserve(block, o_stride);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r0 = b * block, r1 = std::min(rows, r0 + block);
        run_split(a, r0, r1, 0, acc, scratch);
        for (int64_t k = 1; k < splits; ++k) {
          run_split(a, r0, r1, k, part, scratch);
          fold(r1 - r0, a.kv_lora_rank, o_stride, acc, part);
        }
        write_outputs(a, r0, r1 - r0, o_stride, acc);
      }
    });
    return;
  }

  // Few rows over many keys: every (block, split) is an item, a block's splits consecutive so
  // that each thread's share holds whole blocks; the partials meet in split order.
  thread_local PartialBuffer partials;
  const DecodePartial all = partials.reserve(rows * splits, o_stride);
  auto partial = [&](int64_t split, int64_t r0) {
    return offset(all, split * rows + r0, o_stride);
  };
  pool.parallel_for_dynamic(blocks * splits, 1, [&](int64_t i0, int64_t i1, int) {
    thread_local detail::DecodeScratch scratch;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / splits, k = i % splits;
      const int64_t r0 = b * block, r1 = std::min(rows, r0 + block);
      run_split(a, r0, r1, k, partial(k, r0), scratch);
    }
  });
  pool.parallel_for(rows, 1, [&](int64_t r0, int64_t r1, int) {
    const DecodePartial acc = partial(0, r0);
    for (int64_t k = 1; k < splits; ++k) {
      fold(r1 - r0, a.kv_lora_rank, o_stride, acc, partial(k, r0));
    }
    write_outputs(a, r0, r1 - r0, o_stride, acc);
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
