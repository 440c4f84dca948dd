// MLA prefill attention: the blocked online-softmax pass of mla_flash.h, instantiated here for
// AVX2 (the AVX-512 ones are in mla_attention_avx512*.cpp). The absorbed form (decode) is in
// mla_decode.cpp.
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
#include "kernels/mla_flash_avx2_traits.h"
#include "kernels/simd.h"
#include "kernels/vec_exp.h"
#include "tensor/aligned_buffer.h"
#include "tensor/dtype.h"

namespace kernels {
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

}  // namespace kernels
