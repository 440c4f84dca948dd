// Multi-head latent attention (MLA) kernels for one sequence's chunk of queries.
// Causality: the chunk's T queries are the last T of a context of context_len tokens, so
// query t (0-based in the chunk) sees keys [0, context_len - T + t].
// Both kernels are thread-safe for distinct outputs and parallelize internally over the pool.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "common/thread_pool.h"
#include "tensor/aligned_buffer.h"

namespace kernels {

// Expanded form (prefill): per-head keys k = [k_nope_h | k_pe] and values v_h are given. Keys
// come transposed (one row per dimension, keys contiguous), the layout a block of keys is
// scored from with whole vectors.
struct MlaPrefillArgs {
  int num_heads = 0;
  int nope_dim = 0;  // dn
  int rope_dim = 0;  // dr
  int v_dim = 0;     // dv
  int64_t num_queries = 0;
  int64_t context_len = 0;
  float scale = 1.0f;
  const float* q = nullptr;  // [T, nh, dn + dr], contiguous
  // k_nope of head h, dimension d, key j: kt_nope[h * kt_head_stride + d * kt_stride + j].
  const float* kt_nope = nullptr;
  int64_t kt_head_stride = 0;
  int64_t kt_stride = 0;
  // k_pe (shared by all heads), dimension d, key j: kt_pe[d * kt_pe_stride + j].
  const float* kt_pe = nullptr;
  int64_t kt_pe_stride = 0;
  // v of head h, key j: the v_dim values at v + j * v_row_stride + h * v_head_stride.
  const float* v = nullptr;
  int64_t v_row_stride = 0;
  int64_t v_head_stride = 0;
  float* out = nullptr;  // [T, nh, dv], contiguous
  // kt_nope, kt_pe and v hold keys from this one on (key j at index j - key_base): a segment of
  // the context, for mla_prefill_attention_keys.
  int64_t key_base = 0;
  // bf16 attention (bf16_prefill_attention()): where the CPU has AVX512_BF16 and no AMX, q, k, v
  // and the softmax weights are rounded to bf16 and multiplied by vdpbf16ps, summed in f32. Other
  // paths ignore it and stay f32 (AMX's three-term tiles included).
  bool bf16 = false;
};

// The process's choice for MlaPrefillArgs::bf16, from CHUNKPIPE_ATTENTION (read once, like
// CHUNKPIPE_ISA): "bf16" turns it on; unset, "" or "f32" leave the attention f32, whose result
// is the same whatever form (expanded or absorbed), chunk or batch a token's attention runs in.
// Under bf16 the forms differ by the rounding, so outputs then depend on chunking and batching,
// as bf16 attention does on GPUs. Any other value is logged and leaves f32.
bool bf16_prefill_attention();
// The value's meaning: true for "bf16"; false for "", "f32"; nullopt for anything else.
std::optional<bool> parse_attention_precision(std::string_view value);

// One blocked pass per (head, block of queries) with an online softmax, on the best ISA path
// (cpu_features()); a query's output does not depend on how the prompt was chunked.
void mla_prefill_attention(const MlaPrefillArgs& args, common::ThreadPool& pool);
void mla_prefill_attention_reference(const MlaPrefillArgs& args);

// The same pass with the keys given a segment at a time, so that a caller that expands keys
// from a latent cache can keep each segment in cache instead of expanding the whole context
// first. Call with key_begin = 0, then each next segment (args.key_base = key_begin and the
// pointers holding that segment) up to context_len; outputs are written by the last call and
// equal mla_prefill_attention's bit for bit. Segment bounds are multiples of
// kMlaPrefillKeyAlign (the last ends at context_len). `state` carries the online softmax of
// every query and head between calls; reuse it across passes to keep its memory.
inline constexpr int64_t kMlaPrefillKeyAlign = 64;
struct MlaPrefillState {
  int64_t query_block = 0;
  std::vector<float> m, l, o;  // per head and query: max, sum, unnormalized output row
  // The bf16 path's operands as bf16 pairs: every query's (per head), and the current segment's
  // keys and values (per head and block of keys).
  tensor::AlignedBuffer<uint32_t> q_pairs, k_pairs, v_pairs;
};
void mla_prefill_attention_keys(const MlaPrefillArgs& args, int64_t key_begin, int64_t key_end,
                                MlaPrefillState& state, common::ThreadPool& pool);

// Absorbed form (decode): MQA over the paged latent cache. Each cache row is
// [c_kv (kv_lora_rank) | k_pe (rope_dim)]; the query per head is [q_nope·W_UK | q_pe].
struct MlaDecodeArgs {
  int num_heads = 0;
  int kv_lora_rank = 0;  // r
  int rope_dim = 0;      // dr
  int64_t num_queries = 0;
  int64_t context_len = 0;
  float scale = 1.0f;
  const float* q = nullptr;  // [T, nh, r + dr], contiguous
  // This layer's cache [num_blocks, block_size, r + dr]: f32, or (cache null) bf16 bits, which
  // the kernel widens a segment at a time; the result is then the f32 cache's of the same values.
  const float* cache = nullptr;
  const uint16_t* cache_bf16 = nullptr;
  const int32_t* block_table = nullptr;  // physical block of logical block i
  int block_size = 0;
  float* out = nullptr;  // [T, nh, r]: attention-weighted latent, contiguous
};

// Flash-decoding: keys in fixed segments of absolute positions, each read from memory once per
// block of query rows and folded into an online softmax; the threads share the work by blocks of
// rows and by splits of keys, merged in order. A query's output depends only on its position and
// the cache: not on the chunk or batch it runs in, nor on the thread count.
void mla_decode_attention(const MlaDecodeArgs& args, common::ThreadPool& pool);
void mla_decode_attention_reference(const MlaDecodeArgs& args);

}  // namespace kernels
