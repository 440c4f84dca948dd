// KvCacheManager: prefix lookup, slot allocation, caching and freeing.
#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "common/check.h"
#include "kv/block_hasher.h"

namespace kv {

KvCacheManager::KvCacheManager(int32_t num_blocks, int block_size, bool enable_prefix_caching)
    : block_size_(block_size),
      enable_prefix_caching_(enable_prefix_caching),
      pool_(num_blocks, enable_prefix_caching) {
  CHECK(block_size > 0) << "block size must be positive";
}

int64_t KvCacheManager::acquire_cached_prefix(const std::string& request_id,
                                              std::span<const int32_t> prompt,
                                              std::string_view cache_salt) {
  Entry& e = requests_[request_id];
  CHECK(e.blocks.empty()) << "request " << request_id << " already holds blocks";
  if (!enable_prefix_caching_ || prompt.empty()) return 0;
  ++stats_.requests;
  stats_.queries += static_cast<int64_t>(prompt.size());
  e.hashes.clear();
  extend_block_hashes(prompt, block_size_, &e.hashes, root_hash(cache_salt));
  // The last prompt token must be computed to produce logits.
  const size_t max_blocks = (prompt.size() - 1) / block_size_;
  for (size_t i = 0; i < std::min(max_blocks, e.hashes.size()); ++i) {
    auto block = pool_.lookup(e.hashes[i]);
    if (!block) break;
    e.blocks.push_back(*block);
  }
  if (recompute_last_matched_block_ && !e.blocks.empty()) e.blocks.pop_back();
  for (BlockId b : e.blocks) pool_.acquire(b);
  e.num_cached_blocks = e.blocks.size();
  const int64_t cached_tokens = static_cast<int64_t>(e.blocks.size()) * block_size_;
  stats_.hits += cached_tokens;
  return cached_tokens;
}

int64_t KvCacheManager::share_prefix(const std::string& request_id, const std::string& from,
                                     int64_t num_tokens) {
  auto source = requests_.find(from);
  if (source == requests_.end() || from == request_id) return 0;
  const std::vector<BlockId> blocks = source->second.blocks;  // before requests_ may rehash
  Entry& e = requests_[request_id];
  CHECK(e.blocks.empty()) << "request " << request_id << " already holds blocks";
  const size_t n =
      std::min(static_cast<size_t>(std::max<int64_t>(num_tokens, 0) / block_size_), blocks.size());
  e.blocks.assign(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(n));
  if (recompute_last_matched_block_ && !e.blocks.empty()) e.blocks.pop_back();
  for (BlockId b : e.blocks) pool_.acquire(b);
  return static_cast<int64_t>(e.blocks.size()) * block_size_;
}

bool KvCacheManager::allocate_slots(const std::string& request_id, int64_t num_tokens) {
  Entry& e = requests_[request_id];
  const int64_t needed = (num_tokens + block_size_ - 1) / block_size_;
  const int64_t extra = needed - static_cast<int64_t>(e.blocks.size());
  if (extra <= 0) return true;
  if (!pool_.can_allocate(static_cast<int32_t>(extra))) return false;
  auto blocks = pool_.allocate(static_cast<int32_t>(extra));
  e.blocks.insert(e.blocks.end(), blocks.begin(), blocks.end());
  return true;
}

void KvCacheManager::cache_full_blocks(const std::string& request_id,
                                       std::span<const int32_t> token_ids,
                                       int64_t num_computed_tokens, std::string_view cache_salt) {
  if (!enable_prefix_caching_) return;
  auto it = requests_.find(request_id);
  CHECK(it != requests_.end()) << "unknown request " << request_id;
  Entry& e = it->second;
  const size_t full = std::min<size_t>(num_computed_tokens / block_size_, e.blocks.size());
  if (full <= e.num_cached_blocks) return;
  extend_block_hashes(token_ids.first(full * block_size_), block_size_, &e.hashes,
                      root_hash(cache_salt));
  for (size_t i = e.num_cached_blocks; i < full; ++i) pool_.cache(e.blocks[i], e.hashes[i]);
  e.num_cached_blocks = full;
}

void KvCacheManager::free(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  // Tail first, so the request's prefix blocks stay cached longest.
  std::vector<BlockId> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.release(reversed);
  requests_.erase(it);
}

const std::vector<BlockId>& KvCacheManager::block_table(const std::string& request_id) const {
  static const std::vector<BlockId> kEmpty;
  auto it = requests_.find(request_id);
  return it == requests_.end() ? kEmpty : it->second.blocks;
}

}  // namespace kv
