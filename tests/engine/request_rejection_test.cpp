// A request whose own data the model cannot run (token ids past the vocabulary) fails alone,
// wherever it is caught: at the engine's intake (400), or in the workers when it got past that
// (500), in one process and across pipeline stages. The rest of its batch completes with the
// tokens it gets without it, the engine keeps serving and no KV block stays held.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "engine/engine_core.h"
#include "engine/pipeline_executor.h"
#include "engine/uniproc_executor.h"
#include "model/deepseek_v3.h"
#include "tokenizer/tokenizer.h"
#include "worker/model_runner.h"

namespace {

const std::string kModelDir = std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16";  // vocab 512

engine::EngineConfig small_config() {
  engine::EngineConfig config;
  config.scheduler = {64, 8, 1024};
  config.block_size = 16;
  config.num_kv_blocks = 64;
  return config;
}

std::vector<int32_t> prompt(int seed, size_t n) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 31 + 7 * seed) % 500 + 3);
  return ids;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::string error;
  int error_status = -1;
  sched::FinishReason reason = sched::FinishReason::kNone;
};

// Submits every request at once (so that they share steps) and waits for all to finish.
std::vector<Outcome> run(engine::EngineCore& core, std::vector<engine::EngineRequest> requests) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Outcome> out(requests.size());
  size_t finished = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    core.add_request(std::move(requests[i]), [&, i](const engine::RequestOutput& o) {
      std::lock_guard<std::mutex> lock(mu);
      out[i].tokens.insert(out[i].tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (!o.finished) return;
      out[i].error = o.error;
      out[i].error_status = o.error_status;
      out[i].reason = o.finish_reason;
      ++finished;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return finished == out.size(); });
  return out;
}

engine::EngineRequest greedy(const std::string& id, std::vector<int32_t> ids) {
  engine::EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(ids);
  r.sampling.temperature = 0;
  r.sampling.ignore_eos = true;
  r.sampling.max_tokens = 5;
  return r;
}

// Every field a worker screens, each with an id past the 512 rows.
std::vector<engine::EngineRequest> bad_requests() {
  std::vector<engine::EngineRequest> bad;
  bad.push_back(greedy("bad-stop", prompt(9, 12)));
  bad.back().sampling.stop_token_ids = {129280};
  bad.push_back(greedy("bad-prompt", {5, 6, 100000, 7}));
  bad.push_back(greedy("bad-bias", prompt(8, 10)));
  bad.back().sampling.logit_bias = {{512, 1.0f}};
  bad.push_back(greedy("bad-allowed", prompt(7, 10)));
  bad.back().sampling.allowed_token_ids = {3, 4, 1000};
  bad.push_back(greedy("bad-words", prompt(6, 10)));
  bad.back().sampling.bad_words_token_ids = {{3, -1}};
  return bad;
}

// Runs three good requests alone, then with every bad one between them, on engines `make`
// builds; the bad ones must fail alone with `status`, the good ones keep their tokens.
template <typename MakeEngine>
void expect_bad_requests_fail_alone(MakeEngine make, int status, const std::string& needle) {
  const std::vector<std::vector<int32_t>> good = {prompt(1, 40), prompt(2, 3), prompt(3, 70)};
  std::vector<std::vector<int32_t>> expected;
  {
    auto core = make();
    std::vector<engine::EngineRequest> requests;
    for (size_t i = 0; i < good.size(); ++i)
      requests.push_back(greedy("good" + std::to_string(i), good[i]));
    for (const Outcome& o : run(*core, std::move(requests))) expected.push_back(o.tokens);
  }
  auto core = make();
  std::vector<engine::EngineRequest> mixed;
  std::vector<engine::EngineRequest> bad = bad_requests();
  for (size_t i = 0; i < good.size(); ++i) {
    mixed.push_back(greedy("good" + std::to_string(i), good[i]));
    if (i < bad.size()) mixed.push_back(std::move(bad[i]));
  }
  for (size_t i = good.size(); i < bad.size(); ++i) mixed.push_back(std::move(bad[i]));
  std::vector<std::string> ids;
  for (const auto& r : mixed) ids.push_back(r.request_id);
  const std::vector<Outcome> got = run(*core, std::move(mixed));
  size_t next_good = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (ids[i].rfind("good", 0) == 0) {
      EXPECT_TRUE(got[i].error.empty()) << ids[i] << ": " << got[i].error;
      EXPECT_EQ(got[i].tokens, expected[next_good++]) << ids[i];
    } else {
      EXPECT_EQ(got[i].reason, sched::FinishReason::kAbort) << ids[i];
      EXPECT_EQ(got[i].error_status, status) << ids[i];
      EXPECT_TRUE(got[i].tokens.empty()) << ids[i];
      EXPECT_NE(got[i].error.find(needle), std::string::npos) << ids[i] << ": " << got[i].error;
    }
  }
  EXPECT_NE(got[1].error.find("'stop_token_ids' holds token id 129280"), std::string::npos)
      << got[1].error;
  EXPECT_NE(got[3].error.find("'prompt' holds token id 100000"), std::string::npos) << got[3].error;
  // The engine serves on, and the refused requests hold no block.
  EXPECT_TRUE(core->is_healthy());
  const std::vector<Outcome> after = run(*core, {greedy("after", good[0])});
  EXPECT_TRUE(after[0].error.empty()) << after[0].error;
  EXPECT_EQ(after[0].tokens, expected[0]);
  EXPECT_EQ(core->metrics().kv_cache_usage, 0.0);
}

class RequestRejectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = model::DeepseekV3Model::load(kModelDir);
    auto t = tokenizer::Tokenizer::load(CHUNKPIPE_TOKENIZER_DIR);
    ASSERT_TRUE(m.ok()) << m.status().message();
    ASSERT_TRUE(t.ok()) << t.status().message();
    model_ = std::move(*m);
    tok_ = std::move(*t);
  }
  std::unique_ptr<model::DeepseekV3Model> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

TEST_F(RequestRejectionTest, TheEngineIntakeRefusesOutOfVocabularyIdsAlone) {
  engine::EngineConfig config = small_config();
  config.model_vocab_size = model_->config().vocab_size;
  expect_bad_requests_fail_alone(
      [&] {
        return std::make_unique<engine::EngineCore>(
            std::make_unique<engine::UniProcExecutor>(*model_, engine::runner_options(config)),
            *tok_, config);
      },
      400, "outside the vocabulary [0, 512)");
}

// With the intake check off, the ids reach the workers' step messages: the worker refuses
// those requests alone and runs the rest of the step.
TEST_F(RequestRejectionTest, TheWorkersRefuseOutOfVocabularyIdsAlone) {
  engine::EngineConfig config = small_config();
  config.model_vocab_size = 0;
  expect_bad_requests_fail_alone(
      [&] {
        return std::make_unique<engine::EngineCore>(
            std::make_unique<engine::UniProcExecutor>(*model_, engine::runner_options(config)),
            *tok_, config);
      },
      500, "the workers refused this request");
}

TEST_F(RequestRejectionTest, PipelineStagesRefuseOutOfVocabularyIdsAlone) {
  engine::EngineConfig config = small_config();
  config.model_vocab_size = 0;
  expect_bad_requests_fail_alone(
      [&]() -> std::unique_ptr<engine::EngineCore> {
        worker::PipelineOptions po;
        po.model_dir = kModelDir;
        po.num_stages = 2;
        po.num_blocks = config.num_kv_blocks;
        po.block_size = config.block_size;
        po.worker_binary = CHUNKPIPE_BINARY;
        auto executor = engine::PipelineExecutor::create(po);
        EXPECT_TRUE(executor.ok()) << executor.status().message();
        if (!executor.ok()) return nullptr;
        return std::make_unique<engine::EngineCore>(std::move(*executor), *tok_, config);
      },
      500, "the workers refused this request");
}

// A second live request under one id (a peer's mistake) fails alone; the first completes.
TEST_F(RequestRejectionTest, ADuplicateLiveRequestIdFailsAlone) {
  engine::EngineConfig config = small_config();
  config.model_vocab_size = model_->config().vocab_size;
  engine::EngineCore core(
      std::make_unique<engine::UniProcExecutor>(*model_, engine::runner_options(config)), *tok_,
      config);
  engine::EngineRequest first = greedy("same", prompt(1, 30));
  first.sampling.max_tokens = 300;  // still running when the second arrives
  const std::vector<Outcome> got = run(core, {first, greedy("same", prompt(2, 4))});
  EXPECT_TRUE(got[0].error.empty()) << got[0].error;
  EXPECT_EQ(got[0].tokens.size(), 300u);
  EXPECT_EQ(got[1].error_status, 400);
  EXPECT_NE(got[1].error.find("request id same is already running"), std::string::npos)
      << got[1].error;
  EXPECT_TRUE(core.is_healthy());
}

// One step message with three new requests, the middle one carrying a stop id past the
// vocabulary: the runner holds it back, samples the other two as it does without it, and
// keeps holding back its later deltas until the engine finishes it.
TEST_F(RequestRejectionTest, ARunnerHoldsBackOneRequestOfAStep) {
  auto step_of = [](std::vector<std::pair<std::string, std::vector<int32_t>>> requests,
                    int32_t first_block) {
    sched::SchedulerOutput so;
    for (auto& [id, ids] : requests) {
      sched::ScheduledRequest s;
      s.req_id = id;
      s.new_request.emplace();
      s.new_request->prompt_token_ids = ids;
      s.new_request->sampling.temperature = 0;
      s.new_request->sampling.seed = 1;
      s.num_scheduled_tokens = static_cast<int64_t>(ids.size());
      s.samples = true;
      for (size_t b = 0; b * 16 < ids.size(); ++b) s.new_block_ids.push_back(first_block++);
      so.total_num_scheduled_tokens += s.num_scheduled_tokens;
      so.scheduled.push_back(std::move(s));
    }
    return so;
  };
  worker::RunnerOptions o;
  o.num_blocks = 32;
  sched::SchedulerOutput good = step_of({{"a", prompt(1, 20)}, {"c", prompt(3, 9)}}, 0);
  worker::ModelRunner alone(*model_, o);
  auto expected = alone.execute_model(good);
  ASSERT_TRUE(expected.ok()) << expected.status().message();

  sched::SchedulerOutput mixed =
      step_of({{"a", prompt(1, 20)}, {"b", prompt(2, 5)}, {"c", prompt(3, 9)}}, 0);
  mixed.scheduled[1].new_request->sampling.all_stop_token_ids = {1, 70000};
  worker::ModelRunner runner(*model_, o);
  auto got = runner.execute_model(mixed);
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->sampled.size(), 3u);
  ASSERT_EQ(got->rejected.size(), 1u);
  EXPECT_EQ(got->rejected[0].req_id, "b");
  EXPECT_NE(got->rejected[0].why.find("'all_stop_token_ids' holds token id 70000"),
            std::string::npos);
  EXPECT_TRUE(got->sampled[1].empty());
  ASSERT_EQ(got->sampled[0].size(), 1u);
  ASSERT_EQ(got->sampled[2].size(), 1u);
  EXPECT_EQ(got->sampled[0][0].token, expected->sampled[0][0].token);
  EXPECT_EQ(got->sampled[2][0].token, expected->sampled[1][0].token);
  EXPECT_EQ(got->sampled[0][0].logprob, expected->sampled[0][0].logprob);
  EXPECT_EQ(runner.num_requests(), 2u);

  // A delta for the held-back request, sent before the engine heard of the refusal, is held
  // back too; once it is finished, the id is forgotten.
  sched::SchedulerOutput next;
  for (int k : {0, 1}) {
    sched::ScheduledRequest s;
    s.req_id = k == 0 ? "a" : "b";
    s.new_token_ids = {got->sampled[0][0].token};
    s.num_computed_tokens = k == 0 ? 20 : 5;
    s.num_scheduled_tokens = 1;
    s.samples = true;
    next.scheduled.push_back(s);
  }
  auto second = runner.execute_model(next);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_TRUE(second->rejected.empty());  // refused once, held back quietly after
  EXPECT_EQ(second->sampled[0].size(), 1u);
  EXPECT_TRUE(second->sampled[1].empty());
  sched::SchedulerOutput finish;
  finish.finished_req_ids = {"b"};
  ASSERT_TRUE(runner.execute_model(finish).ok());
  sched::SchedulerOutput stray;  // now a delta for "b" is the engine's own error again
  stray.scheduled.push_back(next.scheduled[1]);
  auto refused = runner.execute_model(stray);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no state for request b"), std::string::npos);
}

}  // namespace
