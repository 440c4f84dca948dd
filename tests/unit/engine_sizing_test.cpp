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

// --num-gpu-blocks-override: exactly that many blocks, past the memory's count and the
// max_num_seqs cap, but never fewer than one max_model_len request nor more than the host holds.
TEST(EngineSizingTest, BlockCountOverride) {
  auto in = input();
  in.max_model_len = 1024;  // 64 blocks a request
  in.host_memory_bytes = int64_t{1} << 30;
  in.num_blocks_override = 70;
  EXPECT_EQ(cli::plan_sizing(in)->num_kv_blocks, 70);
  in.num_blocks_override = 5000;  // above the memory's 1000 and the cap of 4 x 64
  EXPECT_EQ(cli::plan_sizing(in)->num_kv_blocks, 5000);
  in.num_blocks_override = 63;
  EXPECT_EQ(cli::plan_sizing(in).status().message(),
            "--num-gpu-blocks-override 63 holds 1008 tokens, fewer than one request of "
            "max_model_len (1024, 64 blocks): raise it or lower --max-model-len");
  in.num_blocks_override = int64_t{2} << 20;  // 2 GiB of 1000-byte blocks on a 1 GiB host
  EXPECT_NE(cli::plan_sizing(in).status().message().find("more than this host's 1 GiB"),
            std::string::npos)
      << cli::plan_sizing(in).status().message();
}

}  // namespace

TEST(EngineSizingTest, WeightsAndScratchThatDoNotFitAreRefusedWithTheNumbersAndFlags) {
  auto in = input();
  in.kv_cache_bytes.reset();
  in.max_model_len = 1024;  // 64 blocks of 1000 bytes for one request
  in.memory_utilization = 0.5;
  in.host_memory_bytes = int64_t{8} << 30;
  in.weight_bytes = int64_t{3} << 30;
  in.scratch_bytes = int64_t{1} << 29;
  auto fits = cli::plan_sizing(in);
  ASSERT_TRUE(fits.ok()) << fits.status().message();
  // (0.5 x 8 GiB - 3.5 GiB) / 1000, capped at 4 sequences of 64 blocks
  EXPECT_EQ(fits->num_kv_blocks, 4 * 64);
  in.scratch_bytes = int64_t{3} << 29;  // 3 + 1.5 GiB > 4 GiB
  const std::string why = cli::plan_sizing(in).status().message();
  for (const char* part :
       {"does not fit in memory", "weights 3 GiB", "scratch 1.5 GiB", "max_num_batched_tokens=2048",
        "max_model_len=1024", "--gpu-memory-utilization", "8 GiB", "--max-num-batched-tokens",
        "--max-model-len"})
    EXPECT_NE(why.find(part), std::string::npos) << part << " in: " << why;
  // An explicit KV cache is checked against the whole host.
  in.scratch_bytes = 0;
  in.kv_cache_bytes = int64_t{6} << 30;
  const std::string kv_why = cli::plan_sizing(in).status().message();
  EXPECT_NE(kv_why.find("--kv-cache-memory"), std::string::npos) << kv_why;
  EXPECT_NE(kv_why.find("= 9 GiB"), std::string::npos) << kv_why;
  in.kv_cache_bytes = int64_t{4} << 30;
  EXPECT_TRUE(cli::plan_sizing(in).ok());
}
