// xxHash3 over (parent hash, token ids): collisions are negligible at 64 bits for a cache of
// at most millions of blocks.
#include "kv/block_hasher.h"

#include <xxhash.h>

namespace kv {

BlockHash hash_block(BlockHash parent, std::span<const int32_t> token_ids) {
  return XXH3_64bits_withSeed(token_ids.data(), token_ids.size_bytes(), parent);
}

BlockHash root_hash(std::string_view cache_salt) {
  constexpr BlockHash kUnsalted = 0x9E3779B97F4A7C15ull;
  if (cache_salt.empty()) return kUnsalted;
  return XXH3_64bits_withSeed(cache_salt.data(), cache_salt.size(), kUnsalted);
}

void extend_block_hashes(std::span<const int32_t> token_ids, int block_size,
                         std::vector<BlockHash>* hashes, BlockHash root) {
  const size_t full = token_ids.size() / block_size;
  for (size_t i = hashes->size(); i < full; ++i) {
    const BlockHash parent = i == 0 ? root : (*hashes)[i - 1];
    hashes->push_back(hash_block(parent, token_ids.subspan(i * block_size, block_size)));
  }
}

}  // namespace kv
