// KvCacheManager: per-request block tables over a BlockPool, with prefix caching on full
// blocks. The scheduler sees only counts and "does it fit"; block ids reach the worker through
// block_table(). Not thread-safe: owned by the scheduler thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace kv {

struct PrefixCacheStats {
  int64_t requests = 0;  // lookups (a request waiting for blocks may look up more than once)
  int64_t queries = 0;   // prompt tokens looked up
  int64_t hits = 0;      // of those, tokens found cached
};

class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int block_size, bool enable_prefix_caching);

  int block_size() const { return block_size_; }
  // Speculative decoding (vLLM's rule for EAGLE / MTP drafters): a prefix hit gives back its
  // last matched block, so that block's positions are computed again, the drafter's with them.
  void set_recompute_last_matched_block(bool on) { recompute_last_matched_block_ = on; }
  int32_t num_blocks() const { return pool_.num_blocks(); }
  double usage() const { return pool_.usage(); }
  const PrefixCacheStats& prefix_cache_stats() const { return stats_; }

  // For a request that holds no blocks yet: takes the cached blocks of its longest cached
  // prefix (whole blocks, leaving at least the last prompt token to compute) and returns how
  // many tokens they cover.
  // A request with a cache_salt shares blocks only with requests of the same salt.
  int64_t acquire_cached_prefix(const std::string& request_id, std::span<const int32_t> prompt,
                                std::string_view cache_salt = {});

  // For a request that holds no blocks yet: shares (reference-counted, as prefix hits are) the
  // whole blocks of request `from` that cover at most its first num_tokens tokens, whose KV the
  // caller knows to be this request's too; returns how many tokens they cover. It works with
  // the prefix cache off: the choices of a request whose prompt a KV connector loaded share it.
  int64_t share_prefix(const std::string& request_id, const std::string& from, int64_t num_tokens);

  // Grows the request's block table to hold `num_tokens` tokens. False (nothing changed) when
  // the free blocks do not suffice.
  bool allocate_slots(const std::string& request_id, int64_t num_tokens);

  // Registers the request's newly full blocks (up to num_computed_tokens) in the prefix cache.
  void cache_full_blocks(const std::string& request_id, std::span<const int32_t> token_ids,
                         int64_t num_computed_tokens, std::string_view cache_salt = {});

  // Releases all of a request's blocks (finished, aborted or preempted).
  void free(const std::string& request_id);

  const std::vector<BlockId>& block_table(const std::string& request_id) const;
  int32_t num_free_blocks() const { return pool_.num_free_blocks(); }

 private:
  struct Entry {
    std::vector<BlockId> blocks;
    std::vector<BlockHash> hashes;  // of the request's full blocks
    size_t num_cached_blocks = 0;   // blocks already registered in the cache
  };

  int block_size_;
  bool enable_prefix_caching_;
  bool recompute_last_matched_block_ = false;
  BlockPool pool_;
  std::unordered_map<std::string, Entry> requests_;
  PrefixCacheStats stats_;
};

}  // namespace kv
