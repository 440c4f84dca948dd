// LatentKvCache: the paged MLA cache storage of one worker. Per decoder layer (MTP layers
// included, indexed after the main stack) a [num_blocks, block_size, kv_lora_rank + rope_dim]
// array holding RMSNorm(c_kv) ‖ RoPE(k_pe) per token, in f32 or bf16 (KvCacheDtype; rows are
// rounded to nearest even when written, and every reader sees the same rounded values). Block
// ids come from the caller's block tables. Optionally (chunkpipe extension, off by default) a
// second per-layer f32 array holds each token's expanded k_nope ‖ v for every head, so chunked
// prefill reads history instead of re-expanding it. Not thread-safe: one forward at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/aligned_buffer.h"

namespace model {

// vLLM's kv_cache_dtype "auto" is the model's dtype: bf16 under bf16 activations, else f32.
enum class KvCacheDtype { kF32, kBf16 };
const char* kv_cache_dtype_name(KvCacheDtype dtype);

class LatentKvCache {
 public:
  // Allocates storage for layers in [layer_begin, layer_end) of num_layers; others stay empty.
  LatentKvCache(int num_layers, int layer_begin, int layer_end, int64_t num_blocks, int block_size,
                int64_t row_dim, int64_t expanded_dim = 0, KvCacheDtype dtype = KvCacheDtype::kF32);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t row_dim() const { return row_dim_; }
  KvCacheDtype dtype() const { return dtype_; }
  int64_t value_bytes() const { return value_bytes(dtype_); }
  int64_t row_bytes() const { return row_dim_ * value_bytes(); }
  bool has_layer(int layer) const;
  // Commits every page of the cache now (its memory is otherwise committed on first touch):
  // for a cache written from outside the forward, such as a PD decoder's pulls, which ran 3x
  // slower into fresh pages (bench/kv_pull_bench --cache-blocks). Call before any use.
  void commit();
  // A layer's storage as bytes: num_blocks · block_size rows of row_bytes(), slot after slot
  // (slot = block_id · block_size + offset). What KV transfer moves.
  std::byte* layer_bytes(int layer);
  const std::byte* layer_bytes(int layer) const;
  int64_t layer_size_bytes() const { return num_blocks_ * block_size_ * row_bytes(); }
  // Typed views of a layer; each CHECKs the cache's dtype.
  float* layer_f32(int layer);
  const float* layer_f32(int layer) const;
  const uint16_t* layer_bf16(int layer) const;
  // Stores row_dim values at `slot`, rounded to bf16 in a bf16 cache.
  void write_row(int layer, int64_t slot, const float* values);
  // The row at `slot` as f32 (exact for either dtype).
  void read_row(int layer, int64_t slot, float* out) const;

  // Expanded rows [num_heads * (nope_dim + v_dim)] per slot; expanded_dim() 0 when disabled.
  int64_t expanded_dim() const { return expanded_dim_; }
  float* expanded_row(int layer, int64_t slot);
  const float* expanded_row(int layer, int64_t slot) const;

  static int64_t value_bytes(KvCacheDtype dtype) { return dtype == KvCacheDtype::kBf16 ? 2 : 4; }
  static int64_t bytes_per_block(int num_layers, int block_size, int64_t row_dim,
                                 int64_t expanded_dim = 0,
                                 KvCacheDtype dtype = KvCacheDtype::kF32) {
    return static_cast<int64_t>(num_layers) * block_size *
           (row_dim * value_bytes(dtype) + expanded_dim * static_cast<int64_t>(sizeof(float)));
  }

 private:
  int block_size_;
  int64_t num_blocks_;
  int64_t row_dim_;
  int64_t expanded_dim_;
  KvCacheDtype dtype_;
  std::vector<tensor::AlignedBuffer<std::byte>> layers_;
  std::vector<tensor::AlignedBuffer<float>> expanded_;
};

}  // namespace model
