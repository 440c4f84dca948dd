// plan_sizing: vLLM's defaults and checks for max_model_len and the token budget, and the KV
// cache's block count, exactly.
#include "cli/engine_sizing.h"

#include <gtest/gtest.h>

namespace {

cli::SizingInput input() {
  cli::SizingInput in;
  in.max_position_embeddings = 8192;
  in.max_num_seqs = 4;
  in.block_size = 16;
  in.kv_bytes_per_block = 1000;
  in.kv_cache_bytes = 1000 * 1000;  // 1000 blocks
  return in;
}

TEST(EngineSizingTest, DefaultsFollowVllm) {
  auto s = cli::plan_sizing(input());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->max_model_len, 8192);
  EXPECT_TRUE(s->chunked_prefill);
  EXPECT_EQ(s->max_num_batched_tokens, 2048);
  EXPECT_EQ(s->num_kv_blocks, 1000);  // under 4 sequences x 512 blocks
  auto in = input();
  in.enable_chunked_prefill = false;
  EXPECT_EQ(cli::plan_sizing(in)->max_num_batched_tokens, 8192);  // whole prompts in one step
  in.max_position_embeddings = 0;
  EXPECT_EQ(cli::plan_sizing(in)->max_model_len, 4096);
}

TEST(EngineSizingTest, BlocksAreCappedAndMemoryFractionIsUsed) {
  auto in = input();
  in.kv_cache_bytes = int64_t{1} << 40;
  in.max_model_len = 1024;
  EXPECT_EQ(cli::plan_sizing(in)->num_kv_blocks, 4 * 64);  // max_num_seqs x blocks per sequence
  in.kv_cache_bytes.reset();
  in.memory_utilization = 0.5;
  in.host_memory_bytes = 400000;
  in.weight_bytes = 100000;
  EXPECT_EQ(cli::plan_sizing(in)->num_kv_blocks, 100);  // (0.5 x 400000 - 100000) / 1000
}

TEST(EngineSizingTest, ErrorsUseVllmWording) {
  auto in = input();
  in.max_model_len = 10000;
  EXPECT_NE(cli::plan_sizing(in).status().message().find(
                "greater than the derived max_model_len (max_position_embeddings=8192"),
            std::string::npos);
  in.allow_long_max_model_len = true;
  in.kv_cache_bytes = 1000 * 100;  // 100 blocks, 625 needed
  EXPECT_NE(
      cli::plan_sizing(in).status().message().find("the estimated maximum model length is 1600"),
      std::string::npos);
  in = input();
  in.enable_chunked_prefill = false;
  in.max_num_batched_tokens = 100;
  EXPECT_NE(cli::plan_sizing(in).status().message().find(
                "max_num_batched_tokens (100) is smaller than max_model_len (8192)"),
            std::string::npos);
  in = input();
  in.max_num_batched_tokens = 2;
  EXPECT_NE(cli::plan_sizing(in).status().message().find(
                "must be greater than or equal to max_num_seqs (4)"),
            std::string::npos);
}

}  // namespace
