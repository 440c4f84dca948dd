// LatentKvCache: the paged MLA cache storage of one worker. Per decoder layer (MTP layers
// included, indexed after the main stack) a [num_blocks, block_size, kv_lora_rank + rope_dim]
// f32 array holding RMSNorm(c_kv) ‖ RoPE(k_pe) per token. Block ids come from the caller's
// block tables. Optionally (chunkpipe extension, off by default) a second per-layer array holds
// each token's expanded k_nope ‖ v for every head, so chunked prefill reads history instead of
// re-expanding it from the latent on every chunk. Not thread-safe: one forward at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/aligned_buffer.h"

namespace model {

class LatentKvCache {
 public:
  // Allocates storage for layers in [layer_begin, layer_end) of num_layers; others stay empty.
  LatentKvCache(int num_layers, int layer_begin, int layer_end, int64_t num_blocks, int block_size,
                int64_t row_dim, int64_t expanded_dim = 0);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t row_dim() const { return row_dim_; }
  bool has_layer(int layer) const;
  // Commits every page of the cache now (its memory is otherwise committed on first touch):
  // for a cache written from outside the forward, such as a PD decoder's pulls, which ran 3x
  // slower into fresh pages (bench/kv_pull_bench --cache-blocks). Call before any use.
  void commit();
  float* layer(int layer);
  const float* layer(int layer) const;
  // Row of `slot` (= block_id * block_size + offset) in a layer.
  float* row(int layer, int64_t slot) { return this->layer(layer) + slot * row_dim_; }

  // Expanded rows [num_heads * (nope_dim + v_dim)] per slot; expanded_dim() 0 when disabled.
  int64_t expanded_dim() const { return expanded_dim_; }
  float* expanded_row(int layer, int64_t slot);
  const float* expanded_row(int layer, int64_t slot) const;

  static int64_t bytes_per_block(int num_layers, int block_size, int64_t row_dim,
                                 int64_t expanded_dim = 0) {
    return static_cast<int64_t>(num_layers) * block_size * (row_dim + expanded_dim) *
           static_cast<int64_t>(sizeof(float));
  }

 private:
  int block_size_;
  int64_t num_blocks_;
  int64_t row_dim_;
  int64_t expanded_dim_;
  std::vector<tensor::AlignedBuffer<float>> layers_;
  std::vector<tensor::AlignedBuffer<float>> expanded_;
};

}  // namespace model
