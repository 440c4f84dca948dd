// Chained block hashes for prefix caching: hash(block i) = H(hash(block i-1), token ids of
// block i), so equal hashes mean equal whole prefixes. xxHash3 64-bit. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/block_pool.h"

namespace kv {

BlockHash hash_block(BlockHash parent, std::span<const int32_t> token_ids);

// Hashes of the full blocks of `token_ids`, appending to `hashes` from block hashes->size().
void extend_block_hashes(std::span<const int32_t> token_ids, int block_size,
                         std::vector<BlockHash>* hashes);

}  // namespace kv
