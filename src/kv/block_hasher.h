// Chained block hashes for prefix caching: hash(block i) = H(hash(block i-1), token ids of
// block i), so equal hashes mean equal whole prefixes; block 0's parent is the root, which a
// request's cache_salt changes (vLLM mixes the salt into the first block's hash the same way).
// xxHash3 64-bit. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kv/block_pool.h"

namespace kv {

BlockHash hash_block(BlockHash parent, std::span<const int32_t> token_ids);

// The parent of a request's first block: one constant without a salt, else a hash of it.
BlockHash root_hash(std::string_view cache_salt);

// Hashes of the full blocks of `token_ids`, appending to `hashes` from block hashes->size().
void extend_block_hashes(std::span<const int32_t> token_ids, int block_size,
                         std::vector<BlockHash>* hashes, BlockHash root = root_hash({}));

}  // namespace kv
