// BlockPool bookkeeping.
#include "kv/block_pool.h"

#include "common/check.h"

namespace kv {

BlockPool::BlockPool(int32_t num_blocks, bool enable_caching)
    : enable_caching_(enable_caching), blocks_(num_blocks) {
  CHECK(num_blocks > 0) << "BlockPool needs at least one block";
  for (BlockId b = 0; b < num_blocks; ++b) {
    blocks_[b].free_position = free_queue_.insert(free_queue_.end(), b);
    blocks_[b].in_free_queue = true;
  }
}

void BlockPool::evict_hash(Block& b) {
  if (!b.hash) return;
  auto it = cached_.find(*b.hash);
  if (it != cached_.end() && &blocks_[it->second] == &b) cached_.erase(it);
  b.hash.reset();
}

std::vector<BlockId> BlockPool::allocate(int32_t n) {
  CHECK(n <= num_free_blocks()) << "allocate " << n << " blocks with " << num_free_blocks()
                                << " free";
  std::vector<BlockId> out;
  out.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    const BlockId id = free_queue_.front();
    free_queue_.pop_front();
    Block& b = blocks_[id];
    b.in_free_queue = false;
    evict_hash(b);
    b.ref_count = 1;
    out.push_back(id);
  }
  return out;
}

void BlockPool::release(const std::vector<BlockId>& blocks) {
  for (BlockId id : blocks) {
    Block& b = blocks_[id];
    CHECK(b.ref_count > 0) << "release of unreferenced block " << id;
    if (--b.ref_count == 0) {
      if (!enable_caching_) evict_hash(b);
      b.free_position = free_queue_.insert(free_queue_.end(), id);
      b.in_free_queue = true;
    }
  }
}

std::optional<BlockId> BlockPool::lookup(BlockHash hash) const {
  if (!enable_caching_) return std::nullopt;
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

void BlockPool::acquire(BlockId id) {
  Block& b = blocks_[id];
  if (b.in_free_queue) {
    free_queue_.erase(b.free_position);
    b.in_free_queue = false;
  }
  ++b.ref_count;
}

void BlockPool::cache(BlockId id, BlockHash hash) {
  if (!enable_caching_) return;
  Block& b = blocks_[id];
  if (b.hash) return;               // already cached (e.g. a shared prefix block)
  if (cached_.count(hash)) return;  // an identical block is cached already; keep the first
  b.hash = hash;
  cached_[hash] = id;
}

}  // namespace kv
