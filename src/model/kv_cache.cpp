// LatentKvCache allocation and access checks.
#include "model/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "common/check.h"
#include "tensor/dtype.h"

namespace model {

LatentKvCache::LatentKvCache(int num_layers, int layer_begin, int layer_end, int64_t num_blocks,
                             int block_size, int64_t row_dim, int64_t expanded_dim,
                             KvCacheDtype dtype)
    : block_size_(block_size),
      num_blocks_(num_blocks),
      row_dim_(row_dim),
      expanded_dim_(expanded_dim),
      dtype_(dtype),
      layers_(num_layers),
      expanded_(num_layers) {
  CHECK(block_size > 0 && num_blocks > 0 && row_dim > 0) << "empty KV cache";
  CHECK(0 <= layer_begin && layer_begin <= layer_end && layer_end <= num_layers) << "layer range";
  for (int l = layer_begin; l < layer_end; ++l) {
    layers_[l].resize(static_cast<size_t>(layer_size_bytes()));
    if (expanded_dim > 0)
      expanded_[l].resize(static_cast<size_t>(num_blocks * block_size * expanded_dim));
  }
}

const char* kv_cache_dtype_name(KvCacheDtype dtype) {
  return dtype == KvCacheDtype::kBf16 ? "bfloat16" : "float32";
}

namespace {

void commit_pages(void* data, size_t bytes) {
  if (bytes == 0) return;
  const long page = sysconf(_SC_PAGESIZE);
  char* p = static_cast<char*>(data);
  // Page-aligned start for madvise; the buffer is 64-byte aligned, large ones page-aligned.
  char* start = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(p) / page * page);
  if (madvise(start, bytes + static_cast<size_t>(p - start), MADV_POPULATE_WRITE) == 0) return;
  for (size_t off = 0; off < bytes; off += static_cast<size_t>(page)) p[off] = p[off];
}

}  // namespace

void LatentKvCache::commit() {
  for (auto& b : layers_) commit_pages(b.data(), b.size());
  for (auto& b : expanded_) commit_pages(b.data(), b.size() * sizeof(float));
}

bool LatentKvCache::has_layer(int layer) const {
  return layer >= 0 && layer < static_cast<int>(layers_.size()) && !layers_[layer].empty();
}

std::byte* LatentKvCache::layer_bytes(int layer) {
  CHECK(has_layer(layer)) << "KV cache has no storage for layer " << layer;
  return layers_[layer].data();
}

const std::byte* LatentKvCache::layer_bytes(int layer) const {
  CHECK(has_layer(layer)) << "KV cache has no storage for layer " << layer;
  return layers_[layer].data();
}

float* LatentKvCache::layer_f32(int layer) {
  CHECK(dtype_ == KvCacheDtype::kF32) << "the KV cache is " << kv_cache_dtype_name(dtype_);
  return reinterpret_cast<float*>(layer_bytes(layer));
}

const float* LatentKvCache::layer_f32(int layer) const {
  CHECK(dtype_ == KvCacheDtype::kF32) << "the KV cache is " << kv_cache_dtype_name(dtype_);
  return reinterpret_cast<const float*>(layer_bytes(layer));
}

const uint16_t* LatentKvCache::layer_bf16(int layer) const {
  CHECK(dtype_ == KvCacheDtype::kBf16) << "the KV cache is " << kv_cache_dtype_name(dtype_);
  return reinterpret_cast<const uint16_t*>(layer_bytes(layer));
}

void LatentKvCache::write_row(int layer, int64_t slot, const float* values) {
  CHECK(slot >= 0 && slot < num_blocks_ * block_size_) << "KV slot " << slot << " out of range";
  std::byte* dst = layer_bytes(layer) + slot * row_bytes();
  if (dtype_ == KvCacheDtype::kF32) {
    std::memcpy(dst, values, static_cast<size_t>(row_bytes()));
    return;
  }
  auto* bits = reinterpret_cast<uint16_t*>(dst);
  for (int64_t d = 0; d < row_dim_; ++d) bits[d] = tensor::f32_to_bf16(values[d]);
}

void LatentKvCache::read_row(int layer, int64_t slot, float* out) const {
  CHECK(slot >= 0 && slot < num_blocks_ * block_size_) << "KV slot " << slot << " out of range";
  const std::byte* src = layer_bytes(layer) + slot * row_bytes();
  if (dtype_ == KvCacheDtype::kF32) {
    std::memcpy(out, src, static_cast<size_t>(row_bytes()));
    return;
  }
  const auto* bits = reinterpret_cast<const uint16_t*>(src);
  for (int64_t d = 0; d < row_dim_; ++d) out[d] = tensor::bf16_to_f32(bits[d]);
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
