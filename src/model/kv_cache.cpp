// LatentKvCache allocation and access checks.
#include "model/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "common/check.h"

namespace model {

LatentKvCache::LatentKvCache(int num_layers, int layer_begin, int layer_end, int64_t num_blocks,
                             int block_size, int64_t row_dim, int64_t expanded_dim)
    : block_size_(block_size),
      num_blocks_(num_blocks),
      row_dim_(row_dim),
      expanded_dim_(expanded_dim),
      layers_(num_layers),
      expanded_(num_layers) {
  CHECK(block_size > 0 && num_blocks > 0 && row_dim > 0) << "empty KV cache";
  CHECK(0 <= layer_begin && layer_begin <= layer_end && layer_end <= num_layers) << "layer range";
  for (int l = layer_begin; l < layer_end; ++l) {
    layers_[l].resize(static_cast<size_t>(num_blocks * block_size * row_dim));
    if (expanded_dim > 0)
      expanded_[l].resize(static_cast<size_t>(num_blocks * block_size * expanded_dim));
  }
}

void LatentKvCache::commit() {
  const long page = sysconf(_SC_PAGESIZE);
  for (auto* buffers : {&layers_, &expanded_}) {
    for (auto& b : *buffers) {
      if (b.empty()) continue;
      char* p = reinterpret_cast<char*>(b.data());
      const size_t bytes = b.size() * sizeof(float);
      // Page-aligned start for madvise; the buffer is 64-byte aligned, large ones page-aligned.
      char* start = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(p) / page * page);
      if (madvise(start, bytes + static_cast<size_t>(p - start), MADV_POPULATE_WRITE) == 0)
        continue;
      for (size_t off = 0; off < bytes; off += static_cast<size_t>(page)) p[off] = p[off];
    }
  }
}

bool LatentKvCache::has_layer(int layer) const {
  return layer >= 0 && layer < static_cast<int>(layers_.size()) && !layers_[layer].empty();
}

float* LatentKvCache::layer(int layer) {
  CHECK(has_layer(layer)) << "KV cache has no storage for layer " << layer;
  return layers_[layer].data();
}

const float* LatentKvCache::layer(int layer) const {
  CHECK(has_layer(layer)) << "KV cache has no storage for layer " << layer;
  return layers_[layer].data();
}

float* LatentKvCache::expanded_row(int layer, int64_t slot) {
  CHECK(has_layer(layer) && expanded_dim_ > 0) << "no expanded KV rows for layer " << layer;
  return expanded_[layer].data() + slot * expanded_dim_;
}

const float* LatentKvCache::expanded_row(int layer, int64_t slot) const {
  CHECK(has_layer(layer) && expanded_dim_ > 0) << "no expanded KV rows for layer " << layer;
  return expanded_[layer].data() + slot * expanded_dim_;
}

}  // namespace model
