// Block pool and KV cache manager: exact block ids, reference counts, prefix hits, eviction.
#include <gtest/gtest.h>

#include <numeric>

#include "kv/block_hasher.h"
#include "kv/kv_cache_manager.h"

namespace {

std::vector<int32_t> iota_ids(int n, int start = 100) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(BlockPoolTest, AllocateReleaseInLruOrder) {
  kv::BlockPool pool(4, true);
  EXPECT_EQ(pool.allocate(2), (std::vector<kv::BlockId>{0, 1}));
  EXPECT_EQ(pool.num_free_blocks(), 2);
  pool.release({1, 0});
  EXPECT_EQ(pool.num_free_blocks(), 4);
  // Free queue is now 2, 3, 1, 0.
  EXPECT_EQ(pool.allocate(4), (std::vector<kv::BlockId>{2, 3, 1, 0}));
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
}

TEST(BlockPoolTest, CachedBlocksSurviveUntilReused) {
  kv::BlockPool pool(2, true);
  auto b = pool.allocate(1);
  pool.cache(b[0], 42);
  pool.release(b);
  ASSERT_EQ(pool.lookup(42), b[0]);
  pool.acquire(b[0]);
  EXPECT_EQ(pool.ref_count(b[0]), 1);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  pool.release(b);
  pool.allocate(2);  // reuses the cached block: its hash is evicted
  EXPECT_FALSE(pool.lookup(42).has_value());
}

TEST(BlockHasherTest, ChainedHashesDependOnThePrefix) {
  std::vector<kv::BlockHash> a, b;
  kv::extend_block_hashes(iota_ids(10), 4, &a);
  auto other = iota_ids(10);
  other[0] = 7;
  kv::extend_block_hashes(other, 4, &b);
  ASSERT_EQ(a.size(), 2u);  // only full blocks
  EXPECT_NE(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);  // same tokens in block 1, different prefix
}

TEST(KvCacheManagerTest, PrefixHitsSkipWholeBlocksAndKeepLastToken) {
  kv::KvCacheManager kv(8, 4, true);
  const auto prompt = iota_ids(10);
  EXPECT_EQ(kv.acquire_cached_prefix("a", prompt), 0);
  ASSERT_TRUE(kv.allocate_slots("a", 10));
  EXPECT_EQ(kv.block_table("a"), (std::vector<kv::BlockId>{0, 1, 2}));
  kv.cache_full_blocks("a", prompt, 10);
  // Same prompt: blocks 0 and 1 are shared (8 tokens), the rest is computed.
  EXPECT_EQ(kv.acquire_cached_prefix("b", prompt), 8);
  ASSERT_TRUE(kv.allocate_slots("b", 10));
  EXPECT_EQ(kv.block_table("b"), (std::vector<kv::BlockId>{0, 1, 3}));
  // A prompt of exactly 8 tokens may reuse only one block: its last token must be computed.
  EXPECT_EQ(kv.acquire_cached_prefix("c", iota_ids(8)), 4);
  EXPECT_EQ(kv.prefix_cache_stats().queries, 28);
  EXPECT_EQ(kv.prefix_cache_stats().hits, 12);
  kv.free("a");
  kv.free("b");
  kv.free("c");
  EXPECT_EQ(kv.num_free_blocks(), 8);
  EXPECT_DOUBLE_EQ(kv.usage(), 0.0);
}

// cache_salt: a salted request shares blocks only with requests of the same salt, in both
// directions, whether its blocks were registered under the salt or it looks them up.
TEST(KvCacheManagerTest, CacheSaltSeparatesPrefixes) {
  kv::KvCacheManager kv(16, 4, true);
  const auto prompt = iota_ids(10);
  EXPECT_EQ(kv.acquire_cached_prefix("plain", prompt), 0);
  ASSERT_TRUE(kv.allocate_slots("plain", 10));
  kv.cache_full_blocks("plain", prompt, 10);
  EXPECT_EQ(kv.acquire_cached_prefix("salted", prompt, "tenant-a"), 0);
  ASSERT_TRUE(kv.allocate_slots("salted", 10));
  kv.cache_full_blocks("salted", prompt, 10, "tenant-a");
  EXPECT_EQ(kv.acquire_cached_prefix("same-salt", prompt, "tenant-a"), 8);
  EXPECT_EQ(kv.block_table("same-salt"),
            std::vector<kv::BlockId>(kv.block_table("salted").begin(),
                                     kv.block_table("salted").begin() + 2));
  EXPECT_EQ(kv.acquire_cached_prefix("other-salt", prompt, "tenant-b"), 0);
  EXPECT_EQ(kv.acquire_cached_prefix("unsalted", prompt), 8);
  EXPECT_EQ(kv.block_table("unsalted"),
            std::vector<kv::BlockId>(kv.block_table("plain").begin(),
                                     kv.block_table("plain").begin() + 2));
  EXPECT_NE(kv::root_hash("tenant-a"), kv::root_hash({}));
  EXPECT_NE(kv::root_hash("tenant-a"), kv::root_hash("tenant-b"));
  for (const char* id : {"plain", "salted", "same-salt", "other-salt", "unsalted"}) kv.free(id);
  EXPECT_EQ(kv.num_free_blocks(), 16);
}

TEST(KvCacheManagerTest, AllocationFailsWithoutSideEffects) {
  kv::KvCacheManager kv(3, 4, false);
  ASSERT_TRUE(kv.allocate_slots("a", 8));
  EXPECT_FALSE(kv.allocate_slots("b", 8));
  EXPECT_TRUE(kv.block_table("b").empty());
  EXPECT_EQ(kv.num_free_blocks(), 1);
  EXPECT_EQ(kv.acquire_cached_prefix("c", iota_ids(9)), 0);  // caching off
}

// Sharing another request's whole blocks works with caching off, and they outlive their first
// holder; the speculative-decoding rule gives the last one back, as it does for prefix hits.
TEST(KvCacheManagerTest, SharedPrefixBlocksAreReferenceCounted) {
  kv::KvCacheManager kv(8, 4, false);
  ASSERT_TRUE(kv.allocate_slots("a", 11));  // blocks 0, 1, 2 (the last partial)
  EXPECT_EQ(kv.share_prefix("b", "a", 10), 8);
  EXPECT_EQ(kv.block_table("b"), (std::vector<kv::BlockId>{0, 1}));
  EXPECT_EQ(kv.share_prefix("c", "a", 3), 0) << "less than a block";
  EXPECT_EQ(kv.share_prefix("d", "gone", 10), 0);
  kv.free("a");
  EXPECT_EQ(kv.num_free_blocks(), 8 - 2) << "b still holds blocks 0 and 1";
  kv.free("b");
  EXPECT_EQ(kv.num_free_blocks(), 8);
  kv.set_recompute_last_matched_block(true);
  ASSERT_TRUE(kv.allocate_slots("e", 12));
  EXPECT_EQ(kv.share_prefix("f", "e", 12), 8);
}

}  // namespace
