// The memory plan predicts, from the headers alone, the bytes each load then holds (by dtype,
// for BF16, F32, FP8 in place and dequantized, W8A8, int8 heads, layer ranges); the scratch
// estimate grows with the token budget and the context; the row-parallel copy covers every row
// once and stays on one thread inside a parallel load.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "model/deepseek_v3.h"
#include "model/load_parallel.h"
#include "model/memory_plan.h"
#include "model/w8a8_quantizer.h"
#include "model/weight_census.h"

namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) {
  return std::string(CHUNKPIPE_TEST_DATA_DIR) + "/" + name;
}

void expect_plan_matches_load(const std::string& dir, const model::LoadOptions& options) {
  SCOPED_TRACE(dir);
  auto ck = model::Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  auto config = model::load_model_config(dir);
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto planned = model::planned_weight_census(**ck, *config, options);
  ASSERT_TRUE(planned.ok()) << planned.status().message();
  auto m = model::DeepseekV3Model::load(dir, options);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const model::WeightCensus got = model::weight_census((*m)->weights());
  EXPECT_EQ(planned->fp8_bytes, got.fp8_bytes);
  EXPECT_EQ(planned->bf16_bytes, got.bf16_bytes);
  EXPECT_EQ(planned->i8_bytes, got.i8_bytes);
  EXPECT_EQ(planned->f32_bytes, got.f32_bytes);
}

TEST(MemoryPlanTest, PlannedWeightsEqualTheLoadedCensus) {
  for (const char* name : {"tiny-bf16", "tiny-fp8", "tiny-noq-f32"}) {
    expect_plan_matches_load(fixture(name), {});
  }
}

TEST(MemoryPlanTest, PlannedWeightsFollowTheLoadOptions) {
  model::LoadOptions dequantized;
  dequantized.fp8_dequantize = true;
  expect_plan_matches_load(fixture("tiny-fp8"), dequantized);
  model::LoadOptions int8_head;
  int8_head.lm_head_int8 = true;
  expect_plan_matches_load(fixture("tiny-bf16"), int8_head);
  model::LoadOptions no_mtp;
  no_mtp.load_mtp = false;
  expect_plan_matches_load(fixture("tiny-bf16"), no_mtp);
  model::LoadOptions middle;  // a middle pipeline stage: one layer, no embedding or head
  middle.layer_begin = 1;
  middle.layer_end = 2;
  middle.load_embedding = false;
  middle.load_head = false;
  expect_plan_matches_load(fixture("tiny-fp8"), middle);
}

TEST(MemoryPlanTest, PlannedWeightsOfAW8A8Checkpoint) {
  char tmpl[] = "/tmp/chunkpipe_plan_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  common::ThreadPool pool(2);
  const common::Status st =
      model::write_w8a8_checkpoint(fixture("tiny-bf16"), dir + "/w8a8", {}, pool);
  ASSERT_TRUE(st.ok()) << st.message();
  expect_plan_matches_load(dir + "/w8a8", {});
  fs::remove_all(dir);
}

TEST(MemoryPlanTest, ScratchGrowsWithTheBudgetAndTheContext) {
  auto config = model::load_model_config(fixture("tiny-fp8"));
  ASSERT_TRUE(config.ok());
  model::ScratchInput small{.num_batched_tokens = 256, .max_model_len = 4096};
  model::ScratchInput more_tokens = small, longer = small, threads = small;
  more_tokens.num_batched_tokens = 2048;
  longer.max_model_len = 65536;
  threads.threads = 4;
  const int64_t base = model::forward_scratch_bytes(*config, small);
  EXPECT_GT(base, 256 * config->hidden_size * 4 * 4);  // at least the layer's hidden buffers
  EXPECT_GT(model::forward_scratch_bytes(*config, more_tokens), base);
  EXPECT_GT(model::forward_scratch_bytes(*config, longer), base);
  EXPECT_GT(model::forward_scratch_bytes(*config, threads), base);
}

TEST(LoadParallelTest, RangesCoverEveryRowOnceAndNestedCallsStayOnTheirThread) {
  const int64_t rows = 1000, row_bytes = model::kParallelCopyBytes / 100;  // 10× the threshold
  std::vector<std::atomic<int>> seen(rows);
  std::mutex mu;
  std::set<std::thread::id> threads;
  model::for_each_row_range(rows, row_bytes, [&](int64_t b, int64_t e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
    }
    for (int64_t i = b; i < e; ++i) seen[size_t(i)]++;
  });
  for (int64_t i = 0; i < rows; ++i) ASSERT_EQ(seen[size_t(i)].load(), 1) << "row " << i;
  EXPECT_EQ(int(threads.size()), std::min<int>(model::load_threads(), int(rows)));

  int calls = 0;
  {
    model::ParallelLoadScope scope;
    model::for_each_row_range(rows, row_bytes, [&](int64_t b, int64_t e) {
      ++calls;
      EXPECT_EQ(b, 0);
      EXPECT_EQ(e, rows);
      EXPECT_EQ(std::this_thread::get_id(), std::this_thread::get_id());
    });
  }
  EXPECT_EQ(calls, 1);
  calls = 0;  // small copies stay on the caller too
  model::for_each_row_range(10, 16, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 1);
}

}  // namespace
