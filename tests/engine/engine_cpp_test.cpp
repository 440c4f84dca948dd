// The engine with CPP's dynamic chunk sizing (startup profiling, online calibration) gives the
// same greedy tokens as fixed chunks, alone and with concurrent requests.
#include <gtest/gtest.h>

#include <condition_variable>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "engine/engine_core.h"
#include "model/deepseek_v3.h"
#include "tokenizer/tokenizer.h"

namespace {

std::vector<int32_t> golden_ids(const std::string& seq) {
  std::ifstream in(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/golden/tiny-bf16." + seq + ".json");
  return nlohmann::json::parse(in)["ids"].get<std::vector<int32_t>>();
}

// Greedy outputs of `prompts`, all submitted at once.
std::vector<std::vector<int32_t>> generate(engine::EngineCore& core,
                                           const std::vector<std::vector<int32_t>>& prompts) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int32_t>> out(prompts.size());
  size_t finished = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r = std::make_unique<sched::Request>();
    r->request_id =
        "r" + std::to_string(i) + "-" + std::to_string(reinterpret_cast<uintptr_t>(&out));
    r->prompt_token_ids = prompts[i];
    r->sampling.temperature = 0;
    r->sampling.ignore_eos = true;
    r->sampling.max_tokens = 6;
    core.add_request(std::move(r), [&, i](const engine::RequestOutput& o) {
      std::lock_guard<std::mutex> lock(mu);
      out[i].insert(out[i].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) {
        ++finished;
        cv.notify_all();
      }
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return finished == prompts.size(); });
  return out;
}

TEST(EngineCppTest, DynamicChunksGiveTheSameGreedyTokens) {
  auto model = model::DeepseekV3Model::load(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16");
  auto tok = tokenizer::Tokenizer::load(CHUNKPIPE_TOKENIZER_DIR);
  ASSERT_TRUE(model.ok() && tok.ok());
  engine::EngineConfig fixed;
  fixed.scheduler = {/*max_num_batched_tokens=*/64, /*max_num_seqs=*/8, /*max_model_len=*/1024};
  fixed.block_size = 16;
  fixed.num_kv_blocks = 128;
  fixed.num_threads = 1;
  engine::EngineConfig dynamic = fixed;
  sched::ProfilingChunkConfig pc;
  pc.enabled = true;
  pc.need_timing = true;
  pc.min_chunk = 16;
  pc.max_fit_chunk = 8;
  dynamic.profiling_chunk = pc;

  const std::vector<std::vector<int32_t>> prompts = {golden_ids("s200"), golden_ids("s64"),
                                                     golden_ids("short"), golden_ids("s200")};
  std::vector<std::vector<int32_t>> expected, got_alone, got_together, got_calibrated;
  {
    engine::EngineCore core(**model, **tok, fixed);
    expected = generate(core, prompts);
  }
  {
    engine::EngineCore core(**model, **tok, dynamic);
    ASSERT_NE(core.chunk_predictor(), nullptr);
    EXPECT_TRUE(core.chunk_predictor()->ready());
    EXPECT_GT(core.chunk_predictor()->target_ms(), 0.0);
    for (size_t i = 0; i < prompts.size(); ++i)
      got_alone.push_back(generate(core, {prompts[i]})[0]);
    got_together = generate(core, prompts);
    // Enough steps have run to finish calibration; later requests use the history model.
    got_calibrated = generate(core, prompts);
  }
  EXPECT_EQ(got_alone, expected);
  EXPECT_EQ(got_together, expected);
  EXPECT_EQ(got_calibrated, expected);
  // The first token of each prompt is the golden argmax.
  std::ifstream in(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/golden/tiny-bf16.s200.json");
  EXPECT_EQ(expected[0][0], nlohmann::json::parse(in)["last_argmax"].get<int32_t>());
}

}  // namespace
