// The engine with CPP's dynamic chunk sizing (startup profiling, online calibration) gives the
// same greedy tokens as fixed chunks, alone and with concurrent requests.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "engine/engine_core.h"
#include "engine/pipeline_executor.h"
#include "engine/uniproc_executor.h"
#include "model/deepseek_v3.h"
#include "model/w8a8_quantizer.h"
#include "tokenizer/tokenizer.h"

namespace {

std::unique_ptr<engine::Executor> in_process(const model::DeepseekV3Model& model,
                                             const engine::EngineConfig& config) {
  return std::make_unique<engine::UniProcExecutor>(model, engine::runner_options(config));
}

std::vector<int32_t> golden_ids(const std::string& seq) {
  std::ifstream in(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/golden/tiny-bf16." + seq + ".json");
  return nlohmann::json::parse(in)["ids"].get<std::vector<int32_t>>();
}

// Outputs of `prompts`, all submitted at once: greedy, or (seeded) sampled with penalties,
// min_tokens and logprobs, which exercises every input of the sampler.
std::vector<std::vector<int32_t>> generate(engine::EngineCore& core,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           bool sampled = false) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int32_t>> out(prompts.size());
  size_t finished = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::EngineRequest r;
    r.request_id =
        "r" + std::to_string(i) + "-" + std::to_string(reinterpret_cast<uintptr_t>(&out));
    r.prompt_token_ids = prompts[i];
    r.sampling.temperature = 0;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = 6;
    if (sampled) {
      r.sampling.temperature = 0.9;
      r.sampling.top_k = 50;
      r.sampling.repetition_penalty = 1.1;
      r.sampling.presence_penalty = 0.5;
      r.sampling.min_tokens = 3;
      r.sampling.ignore_eos = false;
      r.sampling.logprobs = 2;
      r.sampling.seed = 1000 + i;
    }
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
  const std::vector<std::vector<int32_t>> prompts = {golden_ids("s200"), golden_ids("s64"),
                                                     golden_ids("short"), golden_ids("s200")};
  std::vector<std::vector<int32_t>> expected;
  {
    engine::EngineCore core(in_process(**model, fixed), **tok, fixed);
    expected = generate(core, prompts);
  }
  for (auto mode :
       {sched::ProfilingChunkConfig::kPlanned, sched::ProfilingChunkConfig::kUpstream}) {
    SCOPED_TRACE(mode == sched::ProfilingChunkConfig::kPlanned ? "planned" : "upstream");
    engine::EngineConfig dynamic = fixed;
    sched::ProfilingChunkConfig pc;
    pc.mode = mode;
    pc.enabled = true;
    pc.need_timing = true;
    pc.min_chunk = 16;
    pc.max_fit_chunk = 8;
    dynamic.profiling_chunk = pc;
    std::vector<std::vector<int32_t>> got_alone, got_together, got_calibrated;
    engine::EngineCore core(in_process(**model, dynamic), **tok, dynamic);
    ASSERT_NE(core.chunk_predictor(), nullptr);
    EXPECT_TRUE(core.chunk_predictor()->ready());
    EXPECT_GT(core.chunk_predictor()->target_ms(), 0.0);
    for (size_t i = 0; i < prompts.size(); ++i)
      got_alone.push_back(generate(core, {prompts[i]})[0]);
    got_together = generate(core, prompts);
    // Enough steps have run to finish calibration; later requests use the history model.
    got_calibrated = generate(core, prompts);
    EXPECT_EQ(got_alone, expected);
    EXPECT_EQ(got_together, expected);
    EXPECT_EQ(got_calibrated, expected);
    EXPECT_EQ(core.chunk_predictor()->planned(), mode == sched::ProfilingChunkConfig::kPlanned);
  }
  // The first token of each prompt is the golden argmax.
  std::ifstream in(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/golden/tiny-bf16.s200.json");
  EXPECT_EQ(expected[0][0], nlohmann::json::parse(in)["last_argmax"].get<int32_t>());
}

engine::EngineConfig small_engine_config() {
  engine::EngineConfig config;
  config.scheduler = {64, 8, 1024};
  config.block_size = 16;
  config.num_kv_blocks = 128;
  config.num_threads = 1;
  return config;
}

// Two pipeline stages as processes of the chunkpipe binary, sized like `config`'s cache.
common::Result<std::unique_ptr<engine::PipelineExecutor>> two_stages(
    const std::string& dir, const std::vector<int>& partition, const engine::EngineConfig& config) {
  worker::PipelineOptions po;
  po.model_dir = dir;
  po.num_stages = 2;
  po.layer_counts = partition;
  po.num_blocks = config.num_kv_blocks;
  po.block_size = config.block_size;
  po.worker_binary = CHUNKPIPE_BINARY;
  return engine::PipelineExecutor::create(po);
}

// A prompt long enough for at least 8 chunks of 256 tokens.
std::vector<int32_t> long_prompt(size_t n) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % 500 + 3);
  return ids;
}

// Chunk sizes of the first prompt of `prompt_tokens` that ran alone, from a pipeline trace:
// the chain of single-sequence steps from history 0 to the prompt's end.
std::vector<int64_t> traced_chunks(const std::string& trace_path, int64_t prompt_tokens) {
  std::ifstream in(trace_path);
  auto trace = nlohmann::json::parse(in, nullptr, false);
  std::vector<int64_t> chunks;
  if (trace.is_discarded()) return chunks;
  int64_t next_history = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["tid"] != 0 || e["args"]["sequences"] != 1) continue;
    const int64_t tokens = e["args"]["tokens"], history = e["args"]["history"];
    if (history == 0 && next_history != 0 && next_history < prompt_tokens) chunks.clear();
    if (history != next_history && history != 0) continue;
    if (history == 0) chunks.clear();
    chunks.push_back(tokens);
    next_history = history + tokens;
    if (next_history == prompt_tokens) return chunks;
  }
  return {};
}

// PP=2 with fixed and with CPP chunks gives PP=1's greedy tokens: three layer partitions, prompts
// alone (the repeated one hits the prefix cache) and five at once, one of them 2100 tokens long.
TEST(EnginePipelineTest, TwoStagesGiveTheSameGreedyTokensWithFixedAndDynamicChunks) {
  const std::string dir = std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16";
  auto model = model::DeepseekV3Model::load(dir);
  auto tok = tokenizer::Tokenizer::load(CHUNKPIPE_TOKENIZER_DIR);
  ASSERT_TRUE(model.ok() && tok.ok());
  engine::EngineConfig config = small_engine_config();
  config.scheduler = {256, 8, 4096};
  config.num_kv_blocks = 512;
  const size_t kLong = 2100;
  const std::vector<std::vector<int32_t>> prompts = {golden_ids("s200"), golden_ids("s64"),
                                                     golden_ids("short"), golden_ids("s200"),
                                                     long_prompt(kLong)};
  std::vector<std::vector<int32_t>> expected;
  {
    engine::EngineCore core(in_process(**model, config), **tok, config);
    expected = generate(core, prompts);
  }
  struct Case {
    std::vector<int> partition;
    int mode;  // 0 fixed; upstream CPP timing 1 the last stage, 2 the slowest; 3 planned CPP
  };
  const std::vector<Case> cases = {{{}, 0}, {{1, 3}, 0}, {{3, 1}, 0}, {{}, 1},
                                   {{}, 2}, {{1, 3}, 1}, {{}, 3},     {{3, 1}, 3}};
  for (const Case& k : cases) {
    std::string what = k.partition.empty() ? "partition even" : "partition";
    for (int n : k.partition) what += " " + std::to_string(n);
    what += " mode " + std::to_string(k.mode);
    engine::EngineConfig c = config;
    c.trace_file = "/tmp/chunkpipe_engine_pp_trace_" + std::to_string(getpid()) + ".json";
    if (k.mode > 0) {
      sched::ProfilingChunkConfig pc;
      pc.enabled = true;
      pc.need_timing = true;
      pc.min_chunk = 64;
      pc.max_fit_chunk = 8;
      pc.mode = k.mode == 3 ? sched::ProfilingChunkConfig::kPlanned
                            : sched::ProfilingChunkConfig::kUpstream;
      pc.timing_stage = k.mode == 1 ? "last" : "max";
      if (!k.partition.empty()) {  // also finer chunks than max(block, 64)
        pc.min_chunk = 16;
        pc.chunk_align = 16;
      }
      c.profiling_chunk = pc;
    }
    {
      auto pipeline = two_stages(dir, k.partition, c);
      ASSERT_TRUE(pipeline.ok()) << pipeline.status().message();
      engine::EngineCore core(std::move(pipeline).value(), **tok, c);
      for (size_t i = 0; i < prompts.size(); ++i)
        EXPECT_EQ(generate(core, {prompts[i]})[0], expected[i]) << "alone, prompt " << i << what;
      EXPECT_GT(core.metrics().totals.prefix_cache_hits, 0) << what;
      EXPECT_EQ(generate(core, prompts), expected) << "5 concurrent, " << what;
      if (k.mode > 0) {  // the predictor sized chunks
        EXPECT_GT(core.metrics().totals.cpp_steps, 0) << what;
      }
    }
    // The long prompt ran alone in >= 8 chunks: 256-token ones when fixed; with CPP, sizes the
    // predictor chose (they depend on measured timings, so only the count is asserted).
    const auto chunks = traced_chunks(c.trace_file, kLong);
    std::filesystem::remove(c.trace_file);
    ASSERT_GE(chunks.size(), 8u) << what;
    std::string sizes;
    for (int64_t n : chunks) sizes += std::to_string(n) + " ";
    std::printf("%s: long prompt chunks %s\n", what.c_str(), sizes.c_str());
    if (k.mode == 0) {
      EXPECT_TRUE(std::all_of(chunks.begin(), chunks.end() - 1, [](int64_t n) { return n == 256; }))
          << what << ": chunks " << sizes;
    }
  }
}

// The seed preset's shape (bench/cpp_ttft.sh seed): a 16384-token prompt, B = 4096 (four fixed
// chunks), min_chunk = B/8. Greedy tokens agree for PP1, PP2 with fixed chunks and PP2 with CPP
// in both modes; planned CPP resizes the chunks (more than four, none above B).
TEST(EnginePipelineTest, SeedShapeGivesTheSameGreedyTokensInEveryMode) {
  if (std::getenv("CHUNKPIPE_SEED_SHAPE_TEST") == nullptr)
    GTEST_SKIP() << "runs as the cpp_seed_shape_test entry (tests/CMakeLists.txt)";
  const std::string dir = std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16";
  auto model = model::DeepseekV3Model::load(dir);
  auto tok = tokenizer::Tokenizer::load(CHUNKPIPE_TOKENIZER_DIR);
  ASSERT_TRUE(model.ok() && tok.ok());
  const int64_t kPrompt = 16384, kBase = 4096;
  engine::EngineConfig config = small_engine_config();
  config.scheduler = {kBase, 4, kPrompt + 64};
  config.num_kv_blocks = (kPrompt + 64) / 16 + 8;
  const std::vector<std::vector<int32_t>> prompt = {long_prompt(kPrompt)};
  std::vector<int32_t> expected;
  {
    engine::EngineCore core(in_process(**model, config), **tok, config);
    expected = generate(core, prompt)[0];
  }
  ASSERT_EQ(expected.size(), 6u);
  for (int mode = 0; mode < 3; ++mode) {  // fixed, planned CPP, upstream CPP
    const char* what = mode == 0 ? "fixed" : mode == 1 ? "planned" : "upstream";
    engine::EngineConfig c = config;
    c.trace_file = "/tmp/chunkpipe_engine_seed_trace_" + std::to_string(getpid()) + ".json";
    if (mode > 0) {
      sched::ProfilingChunkConfig pc;
      pc.mode = mode == 1 ? sched::ProfilingChunkConfig::kPlanned
                          : sched::ProfilingChunkConfig::kUpstream;
      pc.enabled = true;
      pc.need_timing = true;
      pc.min_chunk = kBase / 8;
      pc.timing_stage = mode == 1 ? "max" : "last";
      c.profiling_chunk = pc;
    }
    {
      auto pipeline = two_stages(dir, {}, c);
      ASSERT_TRUE(pipeline.ok()) << pipeline.status().message();
      engine::EngineCore core(std::move(pipeline).value(), **tok, c);
      EXPECT_EQ(generate(core, prompt)[0], expected) << what;
    }
    const auto chunks = traced_chunks(c.trace_file, kPrompt);
    std::filesystem::remove(c.trace_file);
    std::string sizes;
    for (int64_t n : chunks) sizes += std::to_string(n) + " ";
    std::printf("seed shape, %s: chunks %s\n", what, sizes.c_str());
    EXPECT_TRUE(std::all_of(chunks.begin(), chunks.end(), [&](int64_t n) { return n <= kBase; }))
        << what << ": " << sizes;
    if (mode == 0) {
      EXPECT_EQ(chunks, (std::vector<int64_t>{4096, 4096, 4096, 4096})) << sizes;
    } else if (mode == 1) {
      EXPECT_GT(chunks.size(), 4u) << "planned: " << sizes;
    }
  }
}

// The last stage samples: seeded sampling with penalties gives the tokens the engine gives
// when it samples itself (PP=1), alone and concurrently.
TEST(EnginePipelineTest, SeededSamplingOnTheLastStageMatchesOneStage) {
  const std::string dir = std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16";
  auto model = model::DeepseekV3Model::load(dir);
  auto tok = tokenizer::Tokenizer::load(CHUNKPIPE_TOKENIZER_DIR);
  ASSERT_TRUE(model.ok() && tok.ok());
  const engine::EngineConfig config = small_engine_config();
  const std::vector<std::vector<int32_t>> prompts = {golden_ids("s64"), golden_ids("short"),
                                                     golden_ids("s200")};
  std::vector<std::vector<int32_t>> expected;
  {
    engine::EngineCore core(in_process(**model, config), **tok, config);
    expected = generate(core, prompts, /*sampled=*/true);
  }
  auto pipeline = two_stages(dir, {}, config);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().message();
  engine::EngineCore core(std::move(pipeline).value(), **tok, config);
  EXPECT_EQ(generate(core, prompts, true), expected);
  for (size_t i = 0; i < prompts.size(); ++i) {
    // Alone, each request draws the same seeds: its tokens do not depend on its neighbours.
    auto alone = generate(core, {prompts[i]}, true)[0];
    EXPECT_EQ(alone.size(), 6u);
  }
}

// W8A8 (static attention, dynamic MLP and experts): PP=2 with fixed and with planned CPP chunks
// gives PP=1's greedy tokens. The int8 dot products are exact and activations are quantized
// per token or with fixed scales, so no result depends on how the tokens were batched.
TEST(EnginePipelineTest, W8A8TwoStagesGiveTheSameGreedyTokens) {
  char tmpl[] = "/tmp/chunkpipe_engine_w8a8_XXXXXX";
  const std::string dir = std::string(mkdtemp(tmpl)) + "/w8a8";
  {
    common::ThreadPool pool(2);
    model::W8A8QuantizeOptions options;
    options.static_attention = true;
    const common::Status st = model::write_w8a8_checkpoint(
        std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16", dir, options, pool);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  auto model = model::DeepseekV3Model::load(dir);
  auto tok = tokenizer::Tokenizer::load(CHUNKPIPE_TOKENIZER_DIR);
  ASSERT_TRUE(model.ok() && tok.ok());
  ASSERT_EQ((*model)->weights().layers[1].attn.o_proj.dtype(), tensor::DType::kI8);
  engine::EngineConfig config = small_engine_config();
  config.scheduler = {256, 8, 4096};
  config.num_kv_blocks = 512;
  const std::vector<std::vector<int32_t>> prompts = {golden_ids("s200"), golden_ids("short"),
                                                     long_prompt(1100), golden_ids("s64")};
  std::vector<std::vector<int32_t>> expected;
  {
    engine::EngineCore core(in_process(**model, config), **tok, config);
    expected = generate(core, prompts);
  }
  for (bool cpp : {false, true}) {
    engine::EngineConfig c = config;
    if (cpp) {
      sched::ProfilingChunkConfig pc;
      pc.enabled = true;
      pc.need_timing = true;
      pc.min_chunk = 64;
      pc.max_fit_chunk = 8;
      c.profiling_chunk = pc;  // planned mode, the default
    }
    auto pipeline = two_stages(dir, {}, c);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status().message();
    engine::EngineCore core(std::move(pipeline).value(), **tok, c);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(generate(core, {prompts[i]})[0], expected[i])
          << "alone, prompt " << i << " cpp " << cpp;
    EXPECT_EQ(generate(core, prompts), expected) << "concurrent, cpp " << cpp;
    if (cpp) {
      EXPECT_GT(core.metrics().totals.cpp_steps, 0);
    }
  }
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

TEST(EnginePipelineTest, LayerPartitionErrors) {
  EXPECT_EQ(worker::partition_layers(4, 2, {}).value(),
            (std::vector<std::pair<int, int>>{{0, 2}, {2, 4}}));
  EXPECT_EQ(worker::partition_layers(5, 2, {}).value(),
            (std::vector<std::pair<int, int>>{{0, 3}, {3, 5}}));
  EXPECT_EQ(worker::partition_layers(4, 2, {1, 2}).status().message(),
            "the layer partition covers 3 layers but the model has 4");
  EXPECT_EQ(worker::partition_layers(4, 2, {4, 0}).status().message(),
            "every pipeline stage needs at least one layer");
  EXPECT_EQ(worker::partition_layers(4, 3, {2, 2}).status().message(),
            "the layer partition has 2 entries for 3 pipeline stages");
}

}  // namespace
