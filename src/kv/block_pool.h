// BlockPool: the KV cache's physical blocks as ids. Tracks reference counts, a free queue in
// eviction order (least recently freed first), and the prefix-cache map from block hash to
// block. Pure bookkeeping, no tensors. Not thread-safe: owned by the scheduler thread.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace kv {

using BlockId = int32_t;
using BlockHash = uint64_t;

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, bool enable_caching);

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_free_blocks() const { return static_cast<int32_t>(free_queue_.size()); }
  // Fraction of blocks referenced by requests (0..1).
  double usage() const { return 1.0 - static_cast<double>(num_free_blocks()) / num_blocks(); }

  // Takes n blocks from the head of the free queue (evicting their cached hashes). CHECKs that
  // n <= num_free_blocks(); callers ask can_allocate() first.
  std::vector<BlockId> allocate(int32_t n);
  bool can_allocate(int32_t n) const { return n <= num_free_blocks(); }

  // Drops one reference per block; blocks reaching zero join the free queue's tail in the given
  // order (callers pass a request's blocks tail-first so its prefix is evicted last).
  void release(const std::vector<BlockId>& blocks);

  // Prefix cache: the block holding `hash`, if cached.
  std::optional<BlockId> lookup(BlockHash hash) const;
  // Adds a reference to a cached block (taking it off the free queue if it was unreferenced).
  void acquire(BlockId block);
  // Records that `block` (full, referenced) holds content `hash`.
  void cache(BlockId block, BlockHash hash);

  int32_t ref_count(BlockId block) const { return blocks_[block].ref_count; }

 private:
  struct Block {
    int32_t ref_count = 0;
    std::optional<BlockHash> hash;
    std::list<BlockId>::iterator free_position;
    bool in_free_queue = false;
  };
  void evict_hash(Block& b);

  bool enable_caching_;
  std::vector<Block> blocks_;
  std::list<BlockId> free_queue_;
  std::unordered_map<BlockHash, BlockId> cached_;
};

}  // namespace kv
