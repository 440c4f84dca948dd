// MTP speculative decoding: the drafter against the golden MTP argmax, greedy outputs identical
// with and without speculation (real drafts, replayed drafts at chosen acceptance rates, stop
// conditions inside accepted drafts, prefix caching, PP=2), the metrics, and the scheduler's
// rollback.
#include <gtest/gtest.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/draft_replay_executor.h"
#include "engine/engine_core.h"
#include "engine/pipeline_executor.h"
#include "engine/uniproc_executor.h"
#include "model/deepseek_v3.h"
#include "tokenizer/tokenizer.h"
#include "worker/model_runner.h"

namespace {

const std::string kModelDir = std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16";

nlohmann::json golden(const std::string& seq) {  // tiny-bf16's
  std::ifstream in(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/golden/tiny-bf16." + seq + ".json");
  return nlohmann::json::parse(in);
}

struct Fixture {
  std::unique_ptr<model::DeepseekV3Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

Fixture& fixture() {
  static Fixture f = [] {
    Fixture x;
    auto m = model::DeepseekV3Model::load(kModelDir);
    auto t = tokenizer::Tokenizer::load(CHUNKPIPE_TOKENIZER_DIR);
    CHECK(m.ok() && t.ok()) << "tiny-bf16 and the tokenizer must load";
    x.model = std::move(m).value();
    x.tok = std::move(t).value();
    return x;
  }();
  return f;
}

engine::EngineConfig config_with(int k) {
  engine::EngineConfig c;
  c.scheduler = {/*max_num_batched_tokens=*/96, /*max_num_seqs=*/8, /*max_model_len=*/1024};
  c.scheduler.num_lookahead_tokens = k;
  c.block_size = 16;
  c.num_kv_blocks = 160;
  c.num_threads = 1;
  return c;
}

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  sched::FinishReason reason = sched::FinishReason::kNone;
  int64_t num_output_tokens = 0;
};

struct Job {
  std::string id;
  std::vector<int32_t> prompt;
  sched::SamplingParams sampling;
};

sched::SamplingParams greedy(int max_tokens) {
  sched::SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  return p;
}

std::vector<Result> run(engine::EngineCore& core, const std::vector<Job>& jobs) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Result> out(jobs.size());
  size_t finished = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    engine::EngineRequest r;
    r.request_id = jobs[i].id;
    r.prompt_token_ids = jobs[i].prompt;
    r.sampling = jobs[i].sampling;
    core.add_request(std::move(r), [&, i](const engine::RequestOutput& o) {
      std::lock_guard<std::mutex> lock(mu);
      out[i].tokens.insert(out[i].tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      out[i].text += o.new_text;
      if (o.finished) {
        out[i].reason = o.finish_reason;
        out[i].num_output_tokens = o.num_output_tokens;
        ++finished;
        cv.notify_all();
      }
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return finished == jobs.size(); });
  return out;
}

// Eight prompts: the golden ones, two repeats (prefix hits), and shifted variants.
std::vector<Job> eight_jobs(int max_tokens, const std::string& tag) {
  std::vector<std::vector<int32_t>> prompts = {golden("s200")["ids"], golden("s64")["ids"],
                                               golden("short")["ids"], golden("s64")["ids"]};
  for (int v = 0; v < 4; ++v) {
    std::vector<int32_t> p = prompts[v % 2];
    p.resize(p.size() - 5 - v);
    p.push_back(7 + v);
    prompts.push_back(p);
  }
  std::vector<Job> jobs;
  for (size_t i = 0; i < prompts.size(); ++i)
    jobs.push_back({tag + std::to_string(i), prompts[i], greedy(max_tokens)});
  return jobs;
}

std::unique_ptr<engine::Executor> in_process(const engine::EngineConfig& c) {
  return std::make_unique<engine::UniProcExecutor>(*fixture().model, engine::runner_options(c));
}

// Plain greedy outputs of `jobs`, by request id (the replayed drafts' reference).
std::unordered_map<std::string, std::vector<int32_t>> reference(const std::vector<Job>& jobs) {
  const engine::EngineConfig c = config_with(0);
  engine::EngineCore core(in_process(c), *fixture().tok, c);
  const auto results = run(core, jobs);
  std::unordered_map<std::string, std::vector<int32_t>> ref;
  for (size_t i = 0; i < jobs.size(); ++i) ref[jobs[i].id] = results[i].tokens;
  return ref;
}

void expect_sane_metrics(const engine::SpecDecodingCounters& m, int k) {
  ASSERT_EQ(m.accepted_per_pos.size(), static_cast<size_t>(k));
  EXPECT_GT(m.num_drafts, 0);
  EXPECT_LE(m.num_draft_tokens, m.num_drafts * k);
  EXPECT_LE(m.num_accepted_tokens, m.num_draft_tokens);
  int64_t sum = 0;
  for (size_t p = 0; p < m.accepted_per_pos.size(); ++p) {
    if (p > 0) {
      EXPECT_LE(m.accepted_per_pos[p], m.accepted_per_pos[p - 1]) << "position " << p;
    }
    EXPECT_LE(m.accepted_per_pos[p], m.num_drafts);
    sum += m.accepted_per_pos[p];
  }
  EXPECT_EQ(sum, m.num_accepted_tokens);
}

// The drafter's first draft after a prompt is the reference's MTP argmax for that prompt
// (dsv3_ref.py logits --mtp: next token = the target's argmax), at k = 1 and k = 3, on every
// golden fixture (BF16, FP8 block-scaled, F32 without q_lora).
TEST(SpecDecodeTest, FirstDraftIsTheGoldenMtpArgmax) {
  for (const std::string fixture_name : {"tiny-bf16", "tiny-fp8", "tiny-noq-f32"}) {
    auto model =
        model::DeepseekV3Model::load(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/" + fixture_name);
    ASSERT_TRUE(model.ok()) << model.status().message();
    for (const std::string seq : {"s64", "s200"}) {
      std::ifstream in(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/golden/" + fixture_name + "." +
                       seq + ".json");
      const nlohmann::json g = nlohmann::json::parse(in);
      const std::vector<int32_t> ids = g["ids"];
      for (int k : {1, 3}) {
        SCOPED_TRACE(fixture_name + " " + seq + " k " + std::to_string(k));
        worker::RunnerOptions o;
        o.num_blocks = 32;
        o.block_size = 16;
        o.num_speculative_tokens = k;
        worker::ModelRunner runner(**model, o);
        sched::SchedulerOutput so;
        sched::ScheduledRequest s;
        s.req_id = "g";
        s.new_request = sched::NewRequestData{ids, greedy(4)};
        for (int32_t b = 0; b < 16; ++b) s.new_block_ids.push_back(b);
        s.num_scheduled_tokens = static_cast<int64_t>(ids.size());
        s.samples = true;
        so.scheduled.push_back(s);
        auto result = runner.execute_model(so);
        ASSERT_TRUE(result.ok()) << result.status().message();
        ASSERT_EQ(result->sampled[0].size(), 1u);
        EXPECT_EQ(result->sampled[0][0].token, g["last_argmax"].get<int32_t>());
        EXPECT_EQ(g["mtp"]["next_token"].get<int32_t>(), g["last_argmax"].get<int32_t>());
        ASSERT_EQ(result->draft_token_ids[0].size(), static_cast<size_t>(k));
        EXPECT_EQ(result->draft_token_ids[0][0], g["mtp"]["draft_argmax"].get<int32_t>());
      }
    }
  }
}

// The real MTP drafter (random weights: few drafts are accepted) changes no greedy token, for
// eight concurrent prompts with prefix hits, at k = 1 and k = 3.
TEST(SpecDecodeTest, RealDrafterKeepsGreedyOutputs) {
  const std::vector<Job> jobs = eight_jobs(12, "real");
  const auto expected = reference(jobs);
  for (int k : {1, 3}) {
    const engine::EngineConfig c = config_with(k);
    engine::EngineCore core(in_process(c), *fixture().tok, c);
    const auto got = run(core, jobs);
    for (size_t i = 0; i < jobs.size(); ++i)
      EXPECT_EQ(got[i].tokens, expected.at(jobs[i].id)) << "k " << k << " prompt " << i;
    const engine::Metrics m = core.metrics().totals;
    expect_sane_metrics(m.spec_decoding, k);
    EXPECT_GT(m.prefix_cache_hits, 0);
    std::printf("k %d: drafts %lld, draft tokens %lld, accepted %lld\n", k,
                static_cast<long long>(m.spec_decoding.num_drafts),
                static_cast<long long>(m.spec_decoding.num_draft_tokens),
                static_cast<long long>(m.spec_decoding.num_accepted_tokens));
  }
}

// Drafts replayed from the plain run at acceptance rates 1, 0.8 and 0.5: the verification path
// accepts runs of drafts, rolls back the rest, and the tokens stay the same.
TEST(SpecDecodeTest, ReplayedDraftsKeepGreedyOutputsAtEveryAcceptanceRate) {
  const std::vector<Job> jobs = eight_jobs(16, "replay");
  const auto expected = reference(jobs);
  for (int k : {1, 3}) {
    for (double alpha : {1.0, 0.8, 0.5}) {
      const engine::EngineConfig c = config_with(k);
      engine::EngineCore core(
          std::make_unique<engine::DraftReplayExecutor>(in_process(c), expected, alpha, 7),
          *fixture().tok, c);
      const auto got = run(core, jobs);
      for (size_t i = 0; i < jobs.size(); ++i)
        EXPECT_EQ(got[i].tokens, expected.at(jobs[i].id))
            << "k " << k << " alpha " << alpha << " prompt " << i;
      const engine::SpecDecodingCounters m = core.metrics().totals.spec_decoding;
      expect_sane_metrics(m, k);
      const double rate = double(m.num_accepted_tokens) / double(m.num_draft_tokens);
      std::printf("k %d alpha %.1f: acceptance %.3f over %lld draft tokens\n", k, alpha, rate,
                  static_cast<long long>(m.num_draft_tokens));
      if (alpha == 1.0) {
        EXPECT_GT(rate, 0.75) << "k " << k;  // only drafts past the reference miss
      }
    }
  }
}

// max_tokens, a stop token, a stop string and EOS that land inside a run of accepted drafts end
// the request at the exact token, with the text and finish reason of the plain run.
TEST(SpecDecodeTest, StopConditionsInsideAcceptedDrafts) {
  const std::vector<Job> base = eight_jobs(16, "stop");
  const auto ref = reference(base);
  const std::vector<int32_t>& first = ref.at(base[0].id);
  std::vector<Job> jobs;
  for (int max_tokens : {2, 3, 5}) {
    Job j = base[0];
    j.id = "max" + std::to_string(max_tokens);
    j.sampling.max_tokens = max_tokens;
    jobs.push_back(j);
  }
  for (size_t at : {1u, 2u, 4u}) {
    Job j = base[0];
    j.id = "stoptok" + std::to_string(at);
    j.sampling.stop_token_ids = {first[at]};
    j.sampling.all_stop_token_ids = {first[at]};
    jobs.push_back(j);
  }
  // A stop string made of a later token's text (found by decoding the reference).
  const std::vector<int32_t> fifth = {first[5]};
  const std::string piece = fixture().tok->decode(fifth);
  if (!piece.empty()) {
    Job j = base[0];
    j.id = "stopstr";
    j.sampling.stop = {piece};
    jobs.push_back(j);
  }
  // EOS: masked for three tokens (min_tokens), then made the argmax (logit_bias), so the plain
  // run ends with it as its fourth token; the replayed drafts carry it as the third draft.
  const std::optional<int32_t> eos = fixture().tok->eos_token_id();
  ASSERT_TRUE(eos.has_value());
  {
    Job j = base[0];
    j.id = "eos";
    j.sampling.ignore_eos = false;
    j.sampling.min_tokens = 3;
    j.sampling.logit_bias = {{*eos, 100.0f}};
    jobs.push_back(j);
  }
  std::vector<Result> plain;
  {
    const engine::EngineConfig c = config_with(0);
    engine::EngineCore core(in_process(c), *fixture().tok, c);
    plain = run(core, jobs);
  }
  ASSERT_EQ(plain.back().tokens.size(), 4u);
  EXPECT_EQ(plain.back().tokens.back(), *eos);
  std::unordered_map<std::string, std::vector<int32_t>> replay;
  for (const Job& j : jobs) replay[j.id] = first;
  replay["eos"] = plain.back().tokens;
  const engine::EngineConfig c = config_with(3);
  engine::EngineCore core(
      std::make_unique<engine::DraftReplayExecutor>(in_process(c), replay, 1.0, 3), *fixture().tok,
      c);
  const auto got = run(core, jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(jobs[i].id);
    EXPECT_EQ(got[i].tokens, plain[i].tokens);
    EXPECT_EQ(got[i].text, plain[i].text);
    EXPECT_EQ(got[i].reason, plain[i].reason);
    EXPECT_EQ(got[i].num_output_tokens, plain[i].num_output_tokens);
    EXPECT_LT(got[i].tokens.size(), first.size());  // it stopped early
  }
  EXPECT_GT(core.metrics().totals.spec_decoding.num_accepted_tokens, 0);
}

// Two pipeline stages, the last one drafting: the same greedy tokens as one process without
// speculation, with the real drafter and with replayed drafts.
TEST(SpecDecodeTest, PipelineLastStageDrafts) {
  const std::vector<Job> jobs = eight_jobs(10, "pp");
  const auto expected = reference(jobs);
  for (double alpha : {-1.0, 0.8}) {
    const engine::EngineConfig c = config_with(2);
    worker::PipelineOptions po;
    po.model_dir = kModelDir;
    po.num_stages = 2;
    po.num_blocks = c.num_kv_blocks;
    po.block_size = c.block_size;
    po.num_speculative_tokens = 2;
    po.worker_binary = CHUNKPIPE_BINARY;
    auto pipeline = engine::PipelineExecutor::create(po);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status().message();
    std::unique_ptr<engine::Executor> executor = std::move(pipeline).value();
    if (alpha >= 0)
      executor =
          std::make_unique<engine::DraftReplayExecutor>(std::move(executor), expected, alpha, 11);
    engine::EngineCore core(std::move(executor), *fixture().tok, c);
    const auto got = run(core, jobs);
    for (size_t i = 0; i < jobs.size(); ++i)
      EXPECT_EQ(got[i].tokens, expected.at(jobs[i].id)) << "alpha " << alpha << " prompt " << i;
    expect_sane_metrics(core.metrics().totals.spec_decoding, 2);
  }
}

// CPP's dynamic chunks (startup profiling times the MTP layer with the rest, online calibration)
// with drafts in the same engine: the same greedy tokens, as the seed's prefill node runs.
TEST(SpecDecodeTest, DynamicChunksWithDraftsKeepGreedyOutputs) {
  const std::vector<Job> jobs = eight_jobs(8, "cpp");
  const auto expected = reference(jobs);
  engine::EngineConfig c = config_with(1);
  sched::ProfilingChunkConfig pc;
  pc.enabled = true;
  pc.need_timing = true;
  pc.min_chunk = 16;
  pc.max_fit_chunk = 8;
  c.profiling_chunk = pc;
  engine::EngineCore core(in_process(c), *fixture().tok, c);
  ASSERT_NE(core.chunk_predictor(), nullptr);
  EXPECT_TRUE(core.chunk_predictor()->ready());
  const auto got = run(core, jobs);
  for (size_t i = 0; i < jobs.size(); ++i)
    EXPECT_EQ(got[i].tokens, expected.at(jobs[i].id)) << "prompt " << i;
  expect_sane_metrics(core.metrics().totals.spec_decoding, 1);
}

// Seeded sampling with drafts (temperature, top-k, penalties, min_tokens, logprobs): the same
// seeds give the same tokens alone and with the other requests in the batch, and in a second
// engine; each draft position draws from the request's own generator.
TEST(SpecDecodeTest, SeededSamplingWithDraftsIsReproducible) {
  std::vector<Job> jobs = eight_jobs(12, "seeded");
  for (size_t i = 0; i < jobs.size(); ++i) {
    sched::SamplingParams& p = jobs[i].sampling;
    p.temperature = 0.9;
    p.top_k = 50;
    p.repetition_penalty = 1.1;
    p.presence_penalty = 0.5;
    p.min_tokens = 3;
    p.logprobs = 2;
    p.seed = 1000 + i;
  }
  const engine::EngineConfig c = config_with(2);
  std::vector<Result> together, alone;
  {
    engine::EngineCore core(in_process(c), *fixture().tok, c);
    together = run(core, jobs);
    for (const Job& j : jobs) alone.push_back(run(core, {j})[0]);
  }
  engine::EngineCore again(in_process(c), *fixture().tok, c);
  const auto second = run(again, jobs);
  std::set<std::vector<int32_t>> distinct;
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(alone[i].tokens, together[i].tokens) << "prompt " << i;
    EXPECT_EQ(second[i].tokens, together[i].tokens) << "prompt " << i;
    EXPECT_EQ(together[i].tokens.size(), 12u);
    distinct.insert(together[i].tokens);
  }
  EXPECT_GT(distinct.size(), 4u);  // the seeds differ, so do the samples
}

// A cache too small for eight prompts at once: requests are preempted with drafts in flight and
// recomputed, others are aborted mid-decode; the surviving outputs are unchanged and every
// block comes back.
TEST(SpecDecodeTest, PreemptionAndAbortsKeepOutputsAndLeakNoBlocks) {
  const std::vector<Job> jobs = eight_jobs(16, "tight");
  const auto expected = reference(jobs);
  engine::EngineConfig c = config_with(3);
  c.num_kv_blocks = 22;  // the eight prompts and their outputs need about 70
  c.enable_prefix_caching = false;
  engine::EngineCore core(
      std::make_unique<engine::DraftReplayExecutor>(in_process(c), expected, 0.8, 5),
      *fixture().tok, c);
  const auto got = run(core, jobs);
  for (size_t i = 0; i < jobs.size(); ++i)
    EXPECT_EQ(got[i].tokens, expected.at(jobs[i].id)) << "prompt " << i;
  engine::MetricsSnapshot m = core.metrics();
  EXPECT_GT(m.totals.preemptions, 0);
  EXPECT_GT(m.totals.spec_decoding.num_accepted_tokens, 0);
  EXPECT_EQ(m.kv_cache_usage, 0.0);
  // Aborts while drafts are in flight: each request is aborted after its first output.
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  for (const Job& j : jobs) {
    engine::EngineRequest r;
    r.request_id = "abort-" + j.id;
    r.prompt_token_ids = j.prompt;
    r.sampling = greedy(64);
    const std::string id = r.request_id;
    core.add_request(std::move(r), [&, id](const engine::RequestOutput& o) {
      if (!o.finished) {
        core.abort_request(id);
        return;
      }
      std::lock_guard<std::mutex> lock(mu);
      ++finished;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished == static_cast<int>(jobs.size()); });
  }
  m = core.metrics();
  EXPECT_EQ(m.totals.request_success["abort"], static_cast<int64_t>(jobs.size()));
  EXPECT_EQ(m.kv_cache_usage, 0.0);
}

// The counters as vLLM defines them, and its periodic log line over an interval.
TEST(SpecDecodeTest, CountersAndTheLogLine) {
  engine::SpecDecodingCounters c;
  c.accepted_per_pos.assign(3, 0);
  const engine::SpecDecodingCounters start = c;
  c.observe(3, 3);
  c.observe(3, 1);
  c.observe(2, 0);  // a request near max_model_len drafts fewer
  c.observe(3, 2);
  EXPECT_EQ(c.num_drafts, 4);
  EXPECT_EQ(c.num_draft_tokens, 11);
  EXPECT_EQ(c.num_accepted_tokens, 6);
  EXPECT_EQ(c.accepted_per_pos, (std::vector<int64_t>{3, 2, 1}));
  EXPECT_EQ(c.log_line(start, 2.0),
            "SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: 3.00 "
            "tokens/s, Drafted throughput: 5.50 tokens/s, Accepted: 6 tokens, Drafted: 11 tokens, "
            "Per-position acceptance rate: 0.750, 0.500, 0.250, Avg Draft acceptance rate: 54.5%");
  const engine::SpecDecodingCounters mid = c;
  c.observe(3, 0);
  EXPECT_EQ(c.log_line(mid, 1.0),
            "SpecDecoding metrics: Mean acceptance length: 1.00, Accepted throughput: 0.00 "
            "tokens/s, Drafted throughput: 3.00 tokens/s, Accepted: 0 tokens, Drafted: 3 tokens, "
            "Per-position acceptance rate: 0.000, 0.000, 0.000, Avg Draft acceptance rate: 0.0%");
  engine::SpecDecodingCounters sum;
  sum += c;
  sum += c;
  EXPECT_EQ(sum.accepted_per_pos, (std::vector<int64_t>{6, 4, 2}));
  EXPECT_EQ(sum.num_drafts, 10);
}

}  // namespace
