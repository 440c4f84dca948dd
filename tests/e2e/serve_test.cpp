// chunkpipe serve end to end: real processes on 127.0.0.1 driven over HTTP. Covers the seed
// documents' requests, streamed and not; greedy invariance across concurrency, token budget,
// prefix caching and streaming; bad input; API keys; 64 concurrent streams with disconnects;
// and the first generated token against the golden logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "command.h"
#include "server_process.h"
#include "test_model.h"

namespace {

using e2e::base_flags;
using e2e::model_dir;
using nlohmann::json;
const std::string kKey = "test-key";

struct Response {
  int status = 0;
  json body;
  std::string raw;
};

Response post(const e2e::ServerProcess& s, const std::string& path, const std::string& body,
              bool with_key = true) {
  auto c = s.client();
  httplib::Headers h;
  if (with_key) h.emplace("Authorization", "Bearer " + kKey);
  auto r = c.Post(path, h, body, "application/json");
  Response out;
  if (!r) return out;
  out.status = r->status;
  out.raw = r->body;
  out.body = json::parse(r->body, nullptr, false);
  return out;
}

// SSE `data:` payloads of a streamed response, without [DONE] (counted in `done`).
std::vector<json> sse_events(const std::string& raw, int* done) {
  std::vector<json> out;
  *done = 0;
  size_t pos = 0;
  while ((pos = raw.find("data: ", pos)) != std::string::npos) {
    const size_t end = raw.find("\n\n", pos);
    const std::string payload = raw.substr(pos + 6, end - pos - 6);
    if (payload == "[DONE]") {
      ++*done;
    } else {
      out.push_back(json::parse(payload));
    }
    pos = end;
  }
  return out;
}

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto flags = base_flags();
    flags.insert(flags.end(),
                 {"--api-key", kKey, "--reasoning-parser", "deepseek_v3", "--enable-log-requests",
                  "--enable-log-outputs", "--max-log-len", "40"});
    server_ = new e2e::ServerProcess(model_dir(), flags, "/tmp/chunkpipe_e2e_main.log");
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->stop(), 0) << "SIGTERM must exit 0";
    delete server_;
  }
  static e2e::ServerProcess* server_;
};
e2e::ServerProcess* ServeTest::server_ = nullptr;

TEST_F(ServeTest, SeedRequestsNonStreamed) {
  ASSERT_TRUE(server_->ready()) << "see /tmp/chunkpipe_e2e_main.log";
  auto r = post(
      *server_, "/v1/chat/completions",
      R"({"model": "deepseek_v3", "messages": [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "Hello! Who are you?"}], "max_tokens": 8})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["object"], "chat.completion");
  EXPECT_EQ(r.body["model"], "deepseek_v3");
  EXPECT_EQ(r.body["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(r.body["choices"][0]["message"]["content"].is_string());
  EXPECT_EQ(
      r.body["usage"]["completion_tokens"].get<int>() + r.body["usage"]["prompt_tokens"].get<int>(),
      r.body["usage"]["total_tokens"].get<int>());
  EXPECT_EQ(r.body["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);

  r = post(
      *server_, "/v1/chat/completions",
      R"({"model": "deepseek_v3", "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe"},
               {"type": "text", "text": "a cat."}]}], "max_tokens": 4})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 4);

  r = post(
      *server_, "/v1/completions",
      R"({"model": "deepseek_v3", "prompt": "The future of AI is", "max_completion_tokens": 24, "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["object"], "text_completion");
  EXPECT_TRUE(r.body["choices"][0]["text"].is_string());
  EXPECT_TRUE(r.body["choices"][0]["finish_reason"] == "length" ||
              r.body["choices"][0]["finish_reason"] == "stop");
  // max_completion_tokens is honoured as max_tokens' alias (without it the default is 16).
  if (r.body["choices"][0]["finish_reason"] == "length") {
    EXPECT_EQ(r.body["usage"]["completion_tokens"].get<int>(), 24);
  }
  EXPECT_LE(r.body["usage"]["completion_tokens"].get<int>(), 24);

  r = post(*server_, "/v1/completions",
           R"({"prompt": "The future of AI is", "max_completion_tokens": 24, "max_tokens": 3,
               "temperature": 0, "ignore_eos": true})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 3) << "max_tokens wins over its alias";
  r = post(*server_, "/v1/completions",
           R"({"prompt": "The future of AI is", "temperature": 0, "ignore_eos": true})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 16) << "the completions default";
}

TEST_F(ServeTest, SeedRequestsStreamedWithUsage) {
  ASSERT_TRUE(server_->ready());
  auto r = post(*server_, "/v1/chat/completions",
                R"({"model": "deepseek_v3", "messages": [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"}], "max_tokens": 6, "stream": true, "ignore_eos": true,
                    "stream_options": {"include_usage": true}})");
  ASSERT_EQ(r.status, 200);
  int done = 0;
  auto events = sse_events(r.raw, &done);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 6);

  r = post(
      *server_, "/v1/completions",
      R"({"prompt": "The future of AI is", "max_tokens": 5, "temperature": 0, "stream": true, "ignore_eos": true})");
  ASSERT_EQ(r.status, 200);
  events = sse_events(r.raw, &done);
  ASSERT_EQ(events.size(), 5u);  // one chunk per token, no usage chunk
  for (const auto& e : events) EXPECT_TRUE(e["usage"].is_null());
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
}

TEST_F(ServeTest, ThinkingSplitsReasoningContent) {
  ASSERT_TRUE(server_->ready());
  auto r = post(
      *server_, "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "Think."}], "max_tokens": 6, "temperature": 0,
                    "ignore_eos": true, "chat_template_kwargs": {"thinking": true}})");
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& m = r.body["choices"][0]["message"];
  // Random weights rarely emit </think>: everything generated is reasoning.
  EXPECT_TRUE(m["reasoning_content"].is_string());
  EXPECT_EQ(m["reasoning_content"].get<std::string>() + m["content"].get<std::string>() == "",
            false);
}

TEST_F(ServeTest, BadInputGetsTheRightStatusAndTheServerKeepsServing) {
  ASSERT_TRUE(server_->ready());
  struct Case {
    std::string path, body;
    int status;
    std::string message;
    bool with_key = true;
  };
  const std::string long_prompt(6000, 'x');
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", 400, "Invalid JSON"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": "ten"})", 400,
       "'max_tokens' must be an integer"},
      {"/v1/completions", R"({"prompt": "a", "model": "gpt-9"})", 404,
       "The model `gpt-9` does not exist."},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": -3})", 400,
       "max_tokens must be at least 1, got -3."},
      {"/v1/completions", R"({"prompt": "a", "temperature": -0.5})", 400,
       "temperature must be non-negative, got -0.5."},
      {"/v1/completions", R"({"prompt": ")" + long_prompt + R"("})", 400,
       "This model's maximum context length is 512 tokens. However, your request has"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 600})", 400,
       "'max_tokens' or 'max_completion_tokens' is too large: 600."},
      {"/v1/chat/completions", R"({"messages": [{"role": "user"}]})", 400,
       "messages[0].content is required"},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "'messages' must be a list"},
      {"/v1/completions", R"({"prompt": "a", "stream_options": {"include_usage": true}})", 400,
       "Stream options can only be defined when `stream=True`."},
      {"/v1/completions", R"({"prompt": [1, 2, 99999999]})", 400,
       "'prompt' holds token id 99999999"},
      {"/v1/completions", R"({"prompt": "a"})", 401, "Unauthorized", false},
  };
  for (const Case& c : cases) {
    auto r = post(*server_, c.path, c.body, c.with_key);
    EXPECT_EQ(r.status, c.status) << c.body.substr(0, 80) << " -> " << r.raw.substr(0, 200);
    EXPECT_NE(r.raw.find(c.message), std::string::npos)
        << c.body.substr(0, 80) << " -> " << r.raw.substr(0, 300);
    if (c.status != 401) {
      EXPECT_EQ(r.body["error"]["code"], c.status);
    }
  }
  auto wrong = server_->client().Post("/v1/completions", {{"Authorization", "Bearer wrong-key"}},
                                      R"({"prompt": "a"})", "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(wrong->body, R"({"error":"Unauthorized"})");
  // A 10 MB body is parsed and refused for its length, not by a crash.
  auto big = post(*server_, "/v1/completions",
                  R"({"prompt": ")" + std::string(10 << 20, 'y') + R"(", "max_tokens": 1})");
  EXPECT_EQ(big.status, 400);
  EXPECT_NE(big.raw.find("maximum context length is 512 tokens"), std::string::npos)
      << big.raw.substr(0, 200);
  // Still serving.
  auto ok = post(*server_, "/v1/completions", R"({"prompt": "still alive?", "max_tokens": 2})");
  EXPECT_EQ(ok.status, 200);
  auto models = server_->client().Get("/v1/models", {{"Authorization", "Bearer " + kKey}});
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "deepseek_v3");
}

std::vector<std::string> invariance_prompts() {
  return {
      "Hello",
      "The capital of France is",
      "1, 2, 3, 4,",
      "你好，世界",
      "def fib(n):",
      "A long time ago in a galaxy far",
      "Once upon a time there was a very small cat who lived in a big house with many rooms and",
      "Translate to German: good morning"};
}

// Greedy completions of every prompt; concurrent when `parallel`.
std::vector<std::string> greedy_texts(const e2e::ServerProcess& s, bool parallel, bool stream,
                                      int copies = 1) {
  const auto prompts = invariance_prompts();
  std::vector<std::string> out(prompts.size() * copies);
  auto one = [&](size_t i) {
    json body = {{"prompt", prompts[i % prompts.size()]},
                 {"max_tokens", 12},
                 {"temperature", 0},
                 {"ignore_eos", true},
                 {"stream", stream}};
    auto r = post(s, "/v1/completions", body.dump());
    if (!stream) {
      out[i] = r.status == 200 ? r.body["choices"][0]["text"].get<std::string>()
                               : "HTTP " + std::to_string(r.status);
      return;
    }
    int done = 0;
    std::string text;
    for (const auto& e : sse_events(r.raw, &done))
      text += e["choices"][0]["text"].get<std::string>();
    out[i] = text;
  };
  if (!parallel) {
    for (size_t i = 0; i < out.size(); ++i) one(i);
  } else {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < out.size(); ++i) threads.emplace_back(one, i);
    for (auto& t : threads) t.join();
  }
  return out;
}

using e2e::metric;

TEST_F(ServeTest, GreedyOutputsAreInvariant) {
  ASSERT_TRUE(server_->ready());
  const auto alone = greedy_texts(*server_, false, false);
  auto concurrent = greedy_texts(*server_, true, false, 2);  // 16 concurrent requests
  const auto streamed = greedy_texts(*server_, true, true);
  for (size_t i = 0; i < concurrent.size(); ++i)
    EXPECT_EQ(concurrent[i], alone[i % alone.size()]) << "prompt " << i;
  EXPECT_EQ(streamed, alone);
  auto flags = base_flags();
  flags.insert(flags.end(), {"--api-key", kKey, "--max-num-batched-tokens", "16", "--max-num-seqs",
                             "16", "--no-enable-prefix-caching"});
  e2e::ServerProcess small_budget(model_dir(), flags, "/tmp/chunkpipe_e2e_budget16.log");
  ASSERT_TRUE(small_budget.ready());
  EXPECT_EQ(greedy_texts(small_budget, true, false), alone);
  EXPECT_EQ(small_budget.stop(), 0);
  // Two pipeline stages, with fixed chunks and with CPP's dynamic chunks (calibrating, then
  // calibrated; this run also keeps the expanded k/v cache and merges tails), give the same
  // greedy text.
  for (bool dynamic : {false, true}) {
    auto pp_flags = base_flags();
    pp_flags.insert(pp_flags.end(), {"--api-key", kKey, "--pipeline-parallel-size", "2",
                                     "--max-num-batched-tokens", "64", "--max-num-seqs", "16"});
    const std::string trace = "/tmp/chunkpipe_e2e_trace_" + std::to_string(getpid()) + ".json";
    if (dynamic) {
      pp_flags.insert(
          pp_flags.end(),
          {"--additional-config",
           R"({"expanded_kv_cache": true, "scheduler_config": {"profiling_chunk_config": {"enabled": true, "min_chunk": 16, "max_fit_chunk": 8, "merge_tail": 32}}})",
           "--trace-file", trace});
    }
    e2e::ServerProcess pp(
        model_dir(), pp_flags,
        dynamic ? "/tmp/chunkpipe_e2e_pp2_cpp.log" : "/tmp/chunkpipe_e2e_pp2.log");
    ASSERT_TRUE(pp.ready());
    EXPECT_EQ(greedy_texts(pp, false, false), alone) << "PP=2 alone, dynamic " << dynamic;
    EXPECT_EQ(greedy_texts(pp, true, false), alone) << "PP=2 concurrent, dynamic " << dynamic;
    EXPECT_EQ(greedy_texts(pp, true, true), alone) << "PP=2 streamed, dynamic " << dynamic;
    if (dynamic) {
      EXPECT_GT(metric(pp, "chunkpipe:cpp_chunk_steps_total"), 0.0);
    }
    // Clients that hang up while their steps are in flight: blocks still come back.
    std::vector<std::thread> hangups;
    for (int i = 0; i < 4; ++i) {
      hangups.emplace_back([&, i] {
        json body = {{"prompt", "abort me " + std::to_string(i)},
                     {"max_tokens", 200},
                     {"ignore_eos", true},
                     {"stream", true}};
        auto c = pp.client();
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/completions";
        req.headers = {{"Authorization", "Bearer " + kKey}};
        req.body = body.dump();
        req.set_header("Content-Type", "application/json");
        int chunks = 0;
        req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
          return ++chunks < 3;
        };
        c.send(req);
      });
    }
    for (auto& t : hangups) t.join();
    double usage = -1;
    for (int i = 0; i < 100 && usage != 0.0; ++i) {
      usage = metric(pp, "vllm:kv_cache_usage_perc");
      if (usage != 0.0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(usage, 0.0) << "PP=2 aborted requests must free their blocks";
    EXPECT_EQ(pp.stop(), 0);
    if (dynamic) {  // one trace event per (step, stage), on two stage tracks
      std::ifstream in(trace);
      json t = json::parse(in, nullptr, false);
      ASSERT_FALSE(t.is_discarded()) << "trace is not JSON";
      std::map<int, int> per_stage;
      bool has_predicted = false;
      for (const auto& e : t["traceEvents"]) {
        if (e["ph"] != "X") continue;
        per_stage[e["tid"].get<int>()]++;
        has_predicted |= e["args"]["predicted_ms"].get<double>() > 0;
      }
      ASSERT_EQ(per_stage.size(), 2u);
      EXPECT_GT(per_stage[0], 0);
      EXPECT_EQ(per_stage[0], per_stage[1]);
      EXPECT_TRUE(has_predicted);
      std::filesystem::remove(trace);
    }
  }
}

// A pipeline stage that dies fails the requests in flight with an error (streamed and not),
// and the server exits non-zero instead of hanging; no stage process is left behind.
TEST(ServePipelineFailureTest, DeadStageFailsRequestsAndTheServerExitsNonZero) {
  auto flags = base_flags();
  flags.insert(flags.end(), {"--pipeline-parallel-size", "2", "--max-model-len", "8192",
                             "--kv-cache-memory", "64000000"});
  e2e::ServerProcess pp(model_dir(), flags, "/tmp/chunkpipe_e2e_pp2_death.log");
  ASSERT_TRUE(pp.ready());
  const std::vector<pid_t> stages = e2e::child_processes(pp.pid(), "pp-stage");
  ASSERT_EQ(stages.size(), 2u) << "two stage processes under the server";
  const std::vector<pid_t> stage1 = e2e::child_processes(pp.pid(), "--stage 1 ");
  ASSERT_EQ(stage1.size(), 1u);

  e2e::BackgroundStream streaming(pp, "/v1/completions",
                                  json{{"prompt", "stream until the stage dies"},
                                       {"max_tokens", 8000},
                                       {"ignore_eos", true},
                                       {"stream", true}}
                                      .dump());
  Response plain;
  std::thread non_streaming([&] {
    plain =
        post(pp, "/v1/completions",
             json{{"prompt", "wait for the whole text"}, {"max_tokens", 8000}, {"ignore_eos", true}}
                 .dump(),
             false);
  });
  ASSERT_TRUE(streaming.wait_chunks(4, 4000)) << "the stream did not start";
  ASSERT_EQ(kill(stage1[0], SIGKILL), 0);
  streaming.join();
  non_streaming.join();
  const std::string stream_body = streaming.body();
  EXPECT_NE(stream_body.find("EngineDeadError"), std::string::npos) << stream_body.substr(0, 300);
  EXPECT_NE(stream_body.find("pipeline stage 1"), std::string::npos);
  EXPECT_NE(stream_body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(plain.status, 500) << plain.raw;
  EXPECT_NE(plain.raw.find("was killed by signal 9"), std::string::npos) << plain.raw;
  EXPECT_EQ(pp.wait_exit(20), 1) << "the server must exit 1 after losing a stage";
  EXPECT_NE(kill(stages[0], 0), 0) << "stage 0 must not outlive the server";
}

// --speculative-config (MTP, the seed's JSON) keeps every greedy text, alone, concurrent and
// streamed, in one process (k = 3) and with the last of two pipeline stages drafting (k = 1);
// a stream with logprobs and sampling runs to the end; the spec_decode metrics move.
TEST_F(ServeTest, SpeculativeDecodingKeepsGreedyOutputs) {
  ASSERT_TRUE(server_->ready());
  const auto alone = greedy_texts(*server_, false, false);
  for (const bool pipeline : {false, true}) {
    auto flags = base_flags();
    flags.insert(flags.end(), {"--api-key", kKey, "--speculative-config",
                               pipeline ? R"({"num_speculative_tokens": 1, "method": "mtp"})"
                                        : R"({"num_speculative_tokens": 3, "method": "mtp"})"});
    if (pipeline) flags.insert(flags.end(), {"--pipeline-parallel-size", "2"});
    e2e::ServerProcess spec(
        model_dir(), flags,
        pipeline ? "/tmp/chunkpipe_e2e_spec_pp2.log" : "/tmp/chunkpipe_e2e_spec.log");
    ASSERT_TRUE(spec.ready());
    EXPECT_EQ(greedy_texts(spec, false, false), alone) << "alone, pipeline " << pipeline;
    const auto concurrent = greedy_texts(spec, true, false, 2);
    for (size_t i = 0; i < concurrent.size(); ++i)
      EXPECT_EQ(concurrent[i], alone[i % alone.size()])
          << "prompt " << i << " pipeline " << pipeline;
    EXPECT_EQ(greedy_texts(spec, true, true), alone) << "streamed, pipeline " << pipeline;
    json body = {{"prompt", "sampled with logprobs"},
                 {"max_tokens", 24},
                 {"temperature", 0.8},
                 {"top_p", 0.9},
                 {"seed", 5},
                 {"logprobs", 3},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    auto r = post(spec, "/v1/completions", body.dump());
    int done = 0;
    int64_t tokens = 0;
    for (const auto& e : sse_events(r.raw, &done)) {
      if (!e["choices"].empty() && e["choices"][0].contains("logprobs") &&
          !e["choices"][0]["logprobs"].is_null())
        tokens += static_cast<int64_t>(e["choices"][0]["logprobs"]["tokens"].size());
      if (e.contains("usage") && !e["usage"].is_null()) {
        EXPECT_EQ(e["usage"]["completion_tokens"].get<int64_t>(), 24);
      }
    }
    EXPECT_EQ(done, 1);
    EXPECT_EQ(tokens, 24) << "every token has its logprobs";
    const double drafted = metric(spec, "vllm:spec_decode_num_draft_tokens_total");
    EXPECT_GT(drafted, 0.0);
    EXPECT_LE(metric(spec, "vllm:spec_decode_num_accepted_tokens_total"), drafted);
    EXPECT_GT(metric(spec, "vllm:spec_decode_num_drafts_total"), 0.0);
    EXPECT_EQ(spec.stop(), 0);
  }
}

// Prompt logprobs (and echo with logprobs, lm-eval's loglikelihood request) score each prompt
// token as generation scored it, over any chunking, the pipeline and prefix-cache hits.
TEST_F(ServeTest, PromptLogprobsScoreThePromptAsGenerationDid) {
  ASSERT_TRUE(server_->ready());
  json prompt = json::array();
  for (int i = 0; i < 300; ++i) prompt.push_back(1000 + (i * 37) % 5000);
  const Response gen = post(*server_, "/v1/completions",
                            json{{"prompt", prompt},
                                 {"max_tokens", 4},
                                 {"temperature", 0},
                                 {"logprobs", 0},
                                 {"return_token_ids", true}}
                                .dump());
  ASSERT_EQ(gen.status, 200) << gen.raw;
  const json toks = gen.body["choices"][0]["token_ids"];
  const json gen_lps = gen.body["choices"][0]["logprobs"]["token_logprobs"];
  ASSERT_EQ(toks.size(), 4u);
  json whole = prompt;
  for (const json& t : toks) whole.push_back(t);
  const std::string echo_body =
      json{{"prompt", whole}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}}.dump();
  auto check = [&](const Response& r, const char* what) {
    ASSERT_EQ(r.status, 200) << what << ": " << r.raw;
    const json& c = r.body["choices"][0];
    const json& lps = c["logprobs"]["token_logprobs"];
    const json& plp = c["prompt_logprobs"];
    ASSERT_EQ(lps.size(), whole.size()) << what;
    ASSERT_EQ(plp.size(), whole.size()) << what;
    EXPECT_TRUE(lps[0].is_null() && plp[0].is_null()) << what;
    for (size_t p = 1; p < whole.size(); ++p) {
      ASSERT_TRUE(lps[p].is_number()) << what << ": position " << p;
      const json& entry = plp[p][std::to_string(whole[p].get<int>())];
      ASSERT_TRUE(entry.is_object()) << what << ": position " << p;
      EXPECT_EQ(entry["logprob"].get<double>(), lps[p].get<double>());
      EXPECT_GE(entry["rank"].get<int>(), 1);
      EXPECT_LE(plp[p].size(), 2u);  // the token and the top one
    }
    for (size_t k = 0; k < 4; ++k) {  // the generated tail, scored as generation scored it
      const size_t p = prompt.size() + k;
      EXPECT_NEAR(lps[p].get<double>(), gen_lps[k].get<double>(), 1e-3) << what << " " << k;
      EXPECT_EQ(plp[p][std::to_string(toks[k].get<int>())]["rank"], 1) << "greedy: rank 1";
    }
    EXPECT_EQ(c["finish_reason"], "length");
  };
  const Response first = post(*server_, "/v1/completions", echo_body);
  check(first, "one chunk");
  // Again: the prompt's blocks are cached now, but every position must still be scored.
  const Response again = post(*server_, "/v1/completions", echo_body);
  check(again, "after a prefix-cache fill");
  EXPECT_EQ(again.body["choices"][0]["logprobs"], first.body["choices"][0]["logprobs"]);
  EXPECT_EQ(again.body["choices"][0]["text"], first.body["choices"][0]["text"]);
  // Chunks of 64 tokens, in one process and over two pipeline stages.
  for (const char* pp : {"1", "2"}) {
    auto flags = base_flags();
    flags.insert(flags.end(), {"--api-key", kKey, "--max-num-batched-tokens", "64",
                               "--pipeline-parallel-size", pp});
    e2e::ServerProcess chunked(model_dir(), flags,
                               std::string("/tmp/chunkpipe_e2e_plp_pp") + pp + ".log");
    ASSERT_TRUE(chunked.ready());
    const Response r = post(chunked, "/v1/completions", echo_body);
    check(r, pp[0] == '1' ? "chunks of 64" : "chunks of 64 over two stages");
    const json& a = r.body["choices"][0]["logprobs"]["token_logprobs"];
    const json& b = first.body["choices"][0]["logprobs"]["token_logprobs"];
    for (size_t p = 1; p < whole.size(); ++p)
      EXPECT_NEAR(a[p].get<double>(), b[p].get<double>(), 1e-3) << "position " << p;
    EXPECT_EQ(chunked.stop(), 0);
  }
  // Streamed echo: the first event holds the prompt's tokens; text_offset runs on in characters.
  const Response st = post(*server_, "/v1/completions",
                           R"({"prompt":"hi there","max_tokens":3,"echo":true,"logprobs":1,
                               "stream":true,"ignore_eos":true})");
  ASSERT_EQ(st.status, 200);
  int done = 0;
  const auto events = sse_events(st.raw, &done);
  ASSERT_GE(events.size(), 2u);
  const json& e0 = events[0]["choices"][0];
  EXPECT_EQ(e0["text"].get<std::string>().rfind("hi there", 0), 0u) << e0.dump();
  EXPECT_TRUE(e0["logprobs"]["token_logprobs"][0].is_null());
  const std::string text0 = e0["text"].get<std::string>();
  const size_t chars = static_cast<size_t>(std::count_if(  // UTF-8 code points
      text0.begin(), text0.end(),
      [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0) != 0x80; }));
  EXPECT_EQ(events[1]["choices"][0]["logprobs"]["text_offset"][0].get<size_t>(), chars);
  // Chat puts prompt_logprobs at the top level; bad values are refused by name.
  const Response chat = post(*server_, "/v1/chat/completions",
                             R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,
                                 "prompt_logprobs":2})");
  ASSERT_EQ(chat.status, 200) << chat.raw;
  EXPECT_TRUE(chat.body["prompt_logprobs"].is_array());
  EXPECT_TRUE(chat.body["prompt_logprobs"][0].is_null());
  for (const char* bad :
       {R"({"prompt":"a","prompt_logprobs":21})", R"({"prompt":"a","prompt_logprobs":-1})",
        R"({"prompt":"a","max_tokens":0})", R"({"prompt":"a","suffix":"b"})"}) {
    const Response r = post(*server_, "/v1/completions", bad);
    EXPECT_EQ(r.status, 400) << bad;
  }
}

// --dtype auto follows the checkpoint's torch_dtype (this one is bfloat16), as vLLM's does:
// the shared server must score exactly as an explicit --dtype bfloat16 pipeline of two stages
// (same chunks, same kernels, rounding in each stage's process), and --dtype float32 must move
// the scores off both. float16 is refused by name.
TEST_F(ServeTest, DtypeAutoFollowsTheCheckpointIntoEveryStage) {
  ASSERT_TRUE(server_->ready());
  json prompt = json::array();
  for (int i = 0; i < 100; ++i) prompt.push_back(500 + (i * 53) % 4000);
  const std::string body =
      json{{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 0}}.dump();
  auto scores = [&](const e2e::ServerProcess& s, const char* what) {
    const Response r = post(s, "/v1/completions", body);
    EXPECT_EQ(r.status, 200) << what << ": " << r.raw;
    std::vector<double> out;
    if (r.status != 200) return out;
    const json& lps = r.body["choices"][0]["logprobs"]["token_logprobs"];
    for (size_t p = 1; p < lps.size(); ++p) out.push_back(lps[p].get<double>());
    return out;
  };
  const std::vector<double> automatic = scores(*server_, "auto");
  std::vector<std::vector<double>> explicit_scores;  // float32 with one stage, bfloat16 with two
  for (const auto& [dtype, pp] : {std::pair{"float32", "1"}, std::pair{"bfloat16", "2"}}) {
    auto flags = base_flags();
    flags.insert(flags.end(),
                 {"--api-key", kKey, "--dtype", dtype, "--pipeline-parallel-size", pp});
    e2e::ServerProcess s(model_dir(), flags,
                         std::string("/tmp/chunkpipe_e2e_") + dtype + "_pp" + pp + ".log");
    ASSERT_TRUE(s.ready());
    explicit_scores.push_back(scores(s, dtype));
    EXPECT_EQ(s.stop(), 0);
  }
  const std::vector<double>& f32 = explicit_scores[0];
  const std::vector<std::vector<double>> bf16 = {automatic, explicit_scores[1]};
  ASSERT_EQ(f32.size(), prompt.size() - 1);
  ASSERT_EQ(bf16[0].size(), f32.size());
  ASSERT_EQ(bf16[1].size(), f32.size());
  double moved = 0;
  for (size_t p = 0; p < f32.size(); ++p) {
    moved = std::max(moved, std::abs(bf16[0][p] - f32[p]));
    EXPECT_EQ(bf16[1][p], bf16[0][p])
        << "position " << p + 1 << ": auto with one stage differs from bfloat16 with two";
  }
  EXPECT_GT(moved, 1e-4) << "--dtype float32 and auto (bfloat16) did not differ";
  const auto refused = e2e::run_shell("timeout 60 " + std::string(CHUNKPIPE_BINARY) + " serve " +
                                      model_dir() + " --dtype float16");
  EXPECT_EQ(refused.exit_code, 2) << refused.out;
  EXPECT_NE(refused.out.find("--dtype float16 is not supported on CPU; use bfloat16 or float32"),
            std::string::npos)
      << refused.out;
}

// allowed_token_ids, bad_words and truncate_prompt_tokens act on the tokens (through a
// two-stage pipeline, so the step message carries them), and continuous_usage_stats puts each
// choice's usage on every chunk.
TEST_F(ServeTest, SamplingFieldsActThroughThePipeline) {
  auto flags = base_flags();
  flags.insert(flags.end(), {"--api-key", kKey, "--pipeline-parallel-size", "2"});
  e2e::ServerProcess s(model_dir(), flags, "/tmp/chunkpipe_e2e_sampling_fields.log");
  ASSERT_TRUE(s.ready());
  auto ids_of = [&](const json& body) {
    const Response r = post(s, "/v1/completions", body.dump());
    EXPECT_EQ(r.status, 200) << body.dump() << ": " << r.raw;
    return r.status == 200 ? r.body["choices"][0]["token_ids"].get<std::vector<int32_t>>()
                           : std::vector<int32_t>{};
  };
  const json base = {{"prompt", "The future of AI is"},
                     {"max_tokens", 6},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_token_ids", true}};
  const std::vector<int32_t> greedy = ids_of(base);
  ASSERT_EQ(greedy.size(), 6u);

  json allowed = base;
  allowed["allowed_token_ids"] = {300, 301, 302};
  allowed["temperature"] = 1.0;
  allowed["seed"] = 5;
  for (int32_t id : ids_of(allowed)) EXPECT_TRUE(id >= 300 && id <= 302) << id;

  // Ban a greedy token by its text, as vLLM reads bad words (the word without its leading
  // spaces, and after one space when that is as many ids): the output departs right there.
  auto tokenize = [&](const std::string& text) {
    const Response r =
        post(s, "/tokenize", json{{"prompt", text}, {"add_special_tokens", false}}.dump());
    return r.body["tokens"].get<std::vector<int32_t>>();
  };
  bool banned_one = false;
  for (size_t j = 0; j < greedy.size() && !banned_one; ++j) {
    const Response word = post(s, "/detokenize", json{{"tokens", {greedy[j]}}}.dump());
    ASSERT_EQ(word.status, 200) << word.raw;
    const std::string text = word.body["prompt"];
    const size_t start = text.find_first_not_of(' ');
    if (start == std::string::npos) continue;
    const auto bare = tokenize(text.substr(start)), spaced = tokenize(" " + text.substr(start));
    const std::vector<int32_t> one = {greedy[j]};
    if (bare != one && !(spaced == one && bare.size() == 1)) continue;
    banned_one = true;
    json banned = base;
    banned["bad_words"] = {text};
    const std::vector<int32_t> without = ids_of(banned);
    ASSERT_EQ(without.size(), greedy.size());
    EXPECT_EQ(std::vector<int32_t>(without.begin(), without.begin() + long(j)),
              std::vector<int32_t>(greedy.begin(), greedy.begin() + long(j)));
    for (int32_t id : without) EXPECT_NE(id, greedy[j]) << "the bad word was generated";
  }
  EXPECT_TRUE(banned_one) << "no greedy token is a one-token word: pick another prompt";

  // Truncation keeps the BOS and the prompt's last ids: the same as sending those ids.
  const Response full =
      post(s, "/tokenize", json{{"prompt", "one two three four five six"}}.dump());
  ASSERT_EQ(full.status, 200);
  const auto all = full.body["tokens"].get<std::vector<int32_t>>();
  ASSERT_GE(all.size(), 5u);
  json cut = base;
  cut["prompt"] = "one two three four five six";
  cut["truncate_prompt_tokens"] = 3;
  json kept = base;
  kept["prompt"] = {all[0], all[all.size() - 2], all.back()};
  const Response truncated = post(s, "/v1/completions", cut.dump());
  ASSERT_EQ(truncated.status, 200) << truncated.raw;
  EXPECT_EQ(truncated.body["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(truncated.body["choices"][0]["token_ids"].get<std::vector<int32_t>>(), ids_of(kept));
  cut["truncate_prompt_tokens"] = 100000;
  EXPECT_EQ(post(s, "/v1/completions", cut.dump()).status, 400);

  // Continuous usage: each choice's count so far on every chunk, then the total. With
  // return_token_ids every token gets its chunk, even one whose text is an unfinished UTF-8
  // character (which sends no empty content delta of its own).
  const Response streamed =
      post(s, "/v1/chat/completions",
           json{{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                {"max_tokens", 3},
                {"ignore_eos", true},
                {"n", 2},
                {"return_token_ids", true},
                {"stream", true},
                {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}}
               .dump());
  ASSERT_EQ(streamed.status, 200) << streamed.raw;
  int done = 0;
  const auto events = sse_events(streamed.raw, &done);
  ASSERT_EQ(events.size(), 2u + 2u * 3u + 1u);  // role chunks, tokens, usage
  std::map<int, int> seen;
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json& e = events[i];
    ASSERT_TRUE(e["usage"].is_object()) << e.dump();
    const int index = e["choices"][0]["index"];
    if (i >= 2) {  // a token chunk counts its own token; role chunks count 0
      EXPECT_EQ(e["choices"][0]["token_ids"].size(), 1u) << e.dump();
      ++seen[index];
    }
    EXPECT_EQ(e["usage"]["completion_tokens"], seen[index]) << e.dump();
    prompt_tokens = e["usage"]["prompt_tokens"];
    EXPECT_EQ(e["usage"]["total_tokens"], prompt_tokens + seen[index]);
  }
  EXPECT_EQ(seen[0], 3);
  EXPECT_EQ(seen[1], 3);
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 6);
  EXPECT_EQ(s.stop(), 0);
}

// The 12 token ids a seeded completion samples with `body`'s sampling fields: equal ids mean
// equal sampling parameters.
std::vector<int32_t> seeded_ids(const e2e::ServerProcess& server, json body) {
  body["prompt"] = "Sampling defaults decide this";
  body["max_tokens"] = 12;
  body["ignore_eos"] = true;
  body["seed"] = 11;
  body["return_token_ids"] = true;
  const Response r = post(server, "/v1/completions", body.dump());
  EXPECT_EQ(r.status, 200) << r.raw;
  return r.status == 200 ? r.body["choices"][0]["token_ids"].get<std::vector<int32_t>>()
                         : std::vector<int32_t>{};
}

// Server flags vLLM users set: --generation-config (the model's sampling defaults, logged as
// vLLM logs them; `vllm` turns them off), --enable-force-include-usage and
// --enable-prompt-tokens-details (prefix-cache hits in usage).
TEST_F(ServeTest, GenerationConfigAndUsageFlags) {
  auto flags = base_flags();
  flags.insert(flags.end(), {"--api-key", kKey, "--enable-force-include-usage",
                             "--enable-prompt-tokens-details", "--enable-prefix-caching"});
  setenv("VLLM_LOG_STATS_INTERVAL", "1", 1);  // inherited by the servers started here
  e2e::ServerProcess s(model_dir(), flags, "/tmp/chunkpipe_e2e_usage_flags.log");
  ASSERT_TRUE(s.ready());
  // The test model's generation_config.json says temperature 0.6, top_p 0.95.
  const auto defaulted = seeded_ids(s, json::object());
  EXPECT_EQ(defaulted, seeded_ids(s, {{"temperature", 0.6}, {"top_p", 0.95}}));
  EXPECT_NE(defaulted, seeded_ids(s, {{"temperature", 1.0}, {"top_p", 1.0}}));

  const std::string prompt(400, 'x');
  const json body = {{"prompt", prompt}, {"max_tokens", 2}, {"stream", true}};
  post(s, "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 2}}.dump());  // warms
  const Response streamed = post(s, "/v1/completions", body.dump());
  ASSERT_EQ(streamed.status, 200);
  int done = 0;
  const auto events = sse_events(streamed.raw, &done);
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back()["choices"].empty()) << "usage without stream_options";
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 2);
  EXPECT_GT(events.back()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0)
      << events.back().dump();
  const Response whole =
      post(s, "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 2}}.dump());
  EXPECT_GT(whole.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past one stats interval
  EXPECT_EQ(s.stop(), 0);
  std::ifstream log("/tmp/chunkpipe_e2e_usage_flags.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("Using default chat sampling params from model: {'temperature': 0.6, "
                      "'top_p': 0.95}"),
            std::string::npos);
  EXPECT_NE(text.find("Engine 000: Avg prompt throughput: "), std::string::npos)
      << "the periodic stats line (VLLM_LOG_STATS_INTERVAL=1 here)";

  flags = base_flags();
  flags.insert(flags.end(),
               {"--api-key", kKey, "--generation-config", "vllm", "--disable-log-stats"});
  e2e::ServerProcess plain(model_dir(), flags, "/tmp/chunkpipe_e2e_generation_vllm.log");
  ASSERT_TRUE(plain.ready());
  EXPECT_EQ(seeded_ids(plain, json::object()),
            seeded_ids(plain, {{"temperature", 1.0}, {"top_p", 1.0}}));
  const Response no_usage = post(plain, "/v1/completions", body.dump());
  EXPECT_EQ(no_usage.raw.find("\"choices\":[]"), std::string::npos)
      << "no usage chunk without the flag or include_usage";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past one stats interval
  EXPECT_EQ(plain.stop(), 0);
  unsetenv("VLLM_LOG_STATS_INTERVAL");
  std::ifstream plain_log("/tmp/chunkpipe_e2e_generation_vllm.log");
  const std::string plain_text((std::istreambuf_iterator<char>(plain_log)),
                               std::istreambuf_iterator<char>());
  EXPECT_EQ(plain_text.find("Avg prompt throughput"), std::string::npos) << "--disable-log-stats";
  EXPECT_EQ(plain_text.find("Using default"), std::string::npos) << "--generation-config vllm";
}

// vLLM's server flags for routers and clients: /load counts a completion until its stream ends
// (and /ping answers POST), --enable-request-id-headers names every response, --response-role
// names the chat answer's role, and --override-generation-config replaces the model's sampling
// defaults field by field. Flags that change nothing here are accepted with a log line.
TEST_F(ServeTest, LoadTrackingRequestIdsRoleAndGenerationOverrides) {
  auto flags = base_flags();
  flags.insert(flags.end(),
               {"--api-key", kKey, "--enable-server-load-tracking", "--enable-request-id-headers",
                "--response-role", "narrator", "--override-generation-config",
                R"({"temperature": 1.0, "top_p": 1.0})", "--disable-uvicorn-access-log",
                "--kv-cache-dtype", "auto", "--distributed-executor-backend", "mp"});
  e2e::ServerProcess s(model_dir(), flags, "/tmp/chunkpipe_e2e_load_tracking.log");
  ASSERT_TRUE(s.ready());
  auto load = [&] {
    auto r = s.client().Get("/load");
    return r && r->status == 200 ? json::parse(r->body, nullptr, false).value("server_load", -1)
                                 : -1;
  };
  EXPECT_EQ(load(), 0);
  auto ping = s.client().Post("/ping", "", "text/plain");
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->status, 200);

  // A long stream: /load says 1 while it runs and 0 once it has ended.
  int stream_status = 0;
  std::atomic<bool> stream_done{false};
  std::thread stream([&] {
    stream_status =
        post(s, "/v1/completions",
             R"({"prompt": "Count", "max_tokens": 500, "ignore_eos": true, "stream": true})")
            .status;
    stream_done = true;
  });
  // Until the stream is seen or has ended; the bound is time, as a loaded machine (sanitizers)
  // may take seconds to connect.
  int seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (seen != 1 && !stream_done && std::chrono::steady_clock::now() < deadline) {
    seen = load();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stream.join();
  ASSERT_EQ(stream_status, 200);
  EXPECT_EQ(seen, 1) << "the stream counted while it ran";
  // The server lets go of a request just after its last byte: the count settles soon after.
  auto settled = [&] {
    int now = load();
    for (int i = 0; i < 100 && now != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      now = load();
    }
    return now;
  };
  EXPECT_EQ(settled(), 0) << "and no longer once it ended";
  EXPECT_EQ(post(s, "/v1/completions", R"({"prompt": "x", "max_tokens": "many"})").status, 400);
  EXPECT_EQ(settled(), 0) << "a refused request counts out too";

  // X-Request-Id: the client's comes back; without one, a fresh one on every response.
  auto c = s.client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->get_header_value("X-Request-Id").size(), 32u);
  auto models = c.Get("/v1/models", {{"Authorization", std::string("Bearer ") + kKey},
                                     {"X-Request-Id", "client-id-7"}});
  ASSERT_TRUE(models);
  EXPECT_EQ(models->get_header_value("X-Request-Id"), "client-id-7");
  EXPECT_EQ(models->get_header_value_count("X-Request-Id"), 1u);

  const Response chat =
      post(s, "/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})");
  ASSERT_EQ(chat.status, 200) << chat.raw;
  EXPECT_EQ(chat.body["choices"][0]["message"]["role"], "narrator");

  // The test model's generation_config.json says temperature 0.6 and top_p 0.95; the overrides
  // put both back to 1.0, so an empty request samples as one that asks for 1.0.
  EXPECT_EQ(seeded_ids(s, json::object()), seeded_ids(s, {{"temperature", 1.0}, {"top_p", 1.0}}));
  EXPECT_NE(seeded_ids(s, json::object()), seeded_ids(s, {{"temperature", 0.6}, {"top_p", 0.95}}));
  EXPECT_EQ(s.stop(), 0);
  std::ifstream log("/tmp/chunkpipe_e2e_load_tracking.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("--kv-cache-dtype auto: the latent KV cache holds float32"),
            std::string::npos);
  EXPECT_NE(text.find("--distributed-executor-backend mp: accepted"), std::string::npos);
}

// A request's own chat template is refused, in both places a client can put it, unless the
// server runs with --trust-request-chat-template, which then renders the messages with it.
TEST_F(ServeTest, RequestChatTemplateNeedsTrust) {
  ASSERT_TRUE(server_->ready());
  const std::string own = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
  const json messages = json::array({{{"role", "user"}, {"content", "hello world"}}});
  const json top = {{"messages", messages}, {"chat_template", own}, {"max_tokens", 2}};
  const json nested = {{"messages", messages},
                       {"chat_template_kwargs", {{"chat_template", own}}},
                       {"max_tokens", 2}};
  const std::string refusal =
      "Chat template is passed with request, but --trust-request-chat-template is not set. "
      "Refused request with untrusted chat template.";
  for (const auto& [path, body] :
       {std::pair{"/v1/chat/completions", top}, std::pair{"/v1/chat/completions", nested},
        std::pair{"/tokenize", top}}) {
    const Response r = post(*server_, path, body.dump());
    EXPECT_EQ(r.status, 400) << path << ": " << r.raw;
    EXPECT_EQ(r.body["error"]["message"], refusal) << path;
  }
  auto flags = base_flags();
  flags.insert(flags.end(), {"--api-key", kKey, "--trust-request-chat-template"});
  e2e::ServerProcess trusted(model_dir(), flags, "/tmp/chunkpipe_e2e_trusted_template.log");
  ASSERT_TRUE(trusted.ready());
  const Response rendered = post(trusted, "/tokenize", top.dump());
  const Response plain = post(
      trusted, "/tokenize", json{{"prompt", "hello world"}, {"add_special_tokens", false}}.dump());
  ASSERT_EQ(rendered.status, 200) << rendered.raw;
  ASSERT_EQ(plain.status, 200) << plain.raw;
  EXPECT_EQ(rendered.body["tokens"], plain.body["tokens"]);
  const Response chat = post(trusted, "/v1/chat/completions", nested.dump());
  EXPECT_EQ(chat.status, 200) << chat.raw;
  EXPECT_EQ(chat.body["usage"]["prompt_tokens"], plain.body["tokens"].size());
  const Response broken = post(trusted, "/v1/chat/completions",
                               json{{"messages", messages}, {"chat_template", "{% for %}"}}.dump());
  EXPECT_EQ(broken.status, 400) << broken.raw;
  EXPECT_NE(broken.raw.find("the request's chat_template"), std::string::npos) << broken.raw;
  EXPECT_EQ(trusted.stop(), 0);
}

// vLLM's per-request histograms: one request moves each count by one, the token sums by its
// prompt, its output and its max_tokens, and its phases add up (queue + inference <= e2e,
// prefill + decode = inference). The per-parent ones count a prompt and its n choices once.
TEST_F(ServeTest, PerRequestHistogramsCountEachFinishedRequest) {
  ASSERT_TRUE(server_->ready());
  const std::vector<std::string> names = {"vllm:e2e_request_latency_seconds",
                                          "vllm:request_queue_time_seconds",
                                          "vllm:request_inference_time_seconds",
                                          "vllm:request_prefill_time_seconds",
                                          "vllm:request_decode_time_seconds",
                                          "vllm:request_time_per_output_token_seconds",
                                          "vllm:request_prompt_tokens",
                                          "vllm:request_generation_tokens",
                                          "vllm:request_params_max_tokens",
                                          "vllm:request_params_n",
                                          "vllm:request_max_num_generation_tokens"};
  auto read = [&](const std::string& suffix) {
    std::map<std::string, double> v;
    for (const std::string& n : names) v[n] = metric(*server_, n + suffix);
    return v;
  };
  const auto count0 = read("_count"), sum0 = read("_sum");
  const json body = {
      {"prompt", "Count me once"}, {"max_tokens", 7}, {"temperature", 0}, {"ignore_eos", true}};
  auto r = post(*server_, "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200);
  const auto count1 = read("_count"), sum1 = read("_sum");
  for (const std::string& n : names) {
    EXPECT_EQ(count1.at(n) - count0.at(n), 1.0) << n;
    EXPECT_GE(sum1.at(n) - sum0.at(n), 0.0) << n;
  }
  auto delta = [&](const std::string& n) { return sum1.at(n) - sum0.at(n); };
  EXPECT_EQ(delta("vllm:request_prompt_tokens"), r.body["usage"]["prompt_tokens"].get<double>());
  EXPECT_EQ(delta("vllm:request_generation_tokens"), 7.0);
  EXPECT_EQ(delta("vllm:request_params_max_tokens"), 7.0);
  const double e2e = delta("vllm:e2e_request_latency_seconds");
  const double inference = delta("vllm:request_inference_time_seconds");
  EXPECT_GT(inference, 0.0);
  EXPECT_LE(delta("vllm:request_queue_time_seconds") + inference, e2e + 1e-6);
  EXPECT_NEAR(
      delta("vllm:request_prefill_time_seconds") + delta("vllm:request_decode_time_seconds"),
      inference, 1e-6);
  EXPECT_NEAR(delta("vllm:request_time_per_output_token_seconds"),
              delta("vllm:request_decode_time_seconds") / 6, 1e-6);
  EXPECT_EQ(delta("vllm:request_params_n"), 1.0);
  EXPECT_EQ(delta("vllm:request_max_num_generation_tokens"), 7.0);
  // Two prompts with n = 3: six engine requests, two parents of three choices each.
  const json batch = {{"prompt", {"Count us", "Twice"}},
                      {"n", 3},
                      {"max_tokens", 5},
                      {"ignore_eos", true},
                      {"temperature", 1.0},
                      {"seed", 7}};
  ASSERT_EQ(post(*server_, "/v1/completions", batch.dump()).status, 200);
  const auto count2 = read("_count"), sum2 = read("_sum");
  auto moved = [](const auto& after, const auto& before, const std::string& n) {
    return after.at(n) - before.at(n);
  };
  EXPECT_EQ(moved(count2, count1, "vllm:request_generation_tokens"), 6.0);
  EXPECT_EQ(moved(count2, count1, "vllm:request_params_n"), 2.0);
  EXPECT_EQ(moved(sum2, sum1, "vllm:request_params_n"), 6.0);
  EXPECT_EQ(moved(count2, count1, "vllm:request_max_num_generation_tokens"), 2.0);
  EXPECT_EQ(moved(sum2, sum1, "vllm:request_max_num_generation_tokens"), 10.0);
  // Token buckets run 1, 2, 5, ... up to max_model_len.
  auto text = server_->client().Get("/metrics");
  ASSERT_TRUE(text);
  EXPECT_NE(text->body.find("vllm:request_prompt_tokens_bucket{model_name=\"deepseek_v3\","
                            "engine=\"0\",le=\"5.0\"}"),
            std::string::npos);
  // The process's resident memory, as prometheus_client's process collector names it: at least
  // the test model's weights, and no more than its peak.
  const size_t rss_at = text->body.find("\nprocess_resident_memory_bytes ");
  const size_t peak_at = text->body.find("\nchunkpipe:process_peak_resident_memory_bytes ");
  ASSERT_NE(rss_at, std::string::npos);
  ASSERT_NE(peak_at, std::string::npos);
  const double rss = std::stod(text->body.substr(text->body.find(' ', rss_at) + 1));
  const double peak = std::stod(text->body.substr(text->body.find(' ', peak_at) + 1));
  EXPECT_GT(rss, 1e6);
  EXPECT_LE(rss, peak * 1.001 + 4096);
}

TEST_F(ServeTest, RepeatedPromptHitsThePrefixCache) {
  ASSERT_TRUE(server_->ready());
  std::string prompt;
  for (int i = 0; i < 40; ++i)
    prompt += "word" + std::to_string(i) + " ";  // > 3 blocks of 16 tokens
  const double before = metric(*server_, "vllm:prefix_cache_hits_total");
  json body = {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}};
  auto first = post(*server_, "/v1/completions", body.dump());
  auto second = post(*server_, "/v1/completions", body.dump());
  ASSERT_EQ(first.status, 200);
  EXPECT_EQ(first.body["choices"][0]["text"], second.body["choices"][0]["text"]);
  EXPECT_GE(metric(*server_, "vllm:prefix_cache_hits_total") - before, 48.0);
}

// return_tokens_as_token_ids names each logprob's token "token_id:N" (N the generated id), on
// completions and chat, whole and streamed; chat logprobs carry the token's UTF-8 bytes.
TEST_F(ServeTest, ReturnTokensAsTokenIds) {
  ASSERT_TRUE(server_->ready());
  for (const bool chat : {false, true}) {
    for (const bool stream : {false, true}) {
      json body = {{"max_tokens", 3},          {"temperature", 0},
                   {"ignore_eos", true},       {"return_tokens_as_token_ids", true},
                   {"return_token_ids", true}, {"stream", stream}};
      if (chat) {
        body["messages"] = {{{"role", "user"}, {"content", "Name a color"}}};
        body["logprobs"] = true;
        body["top_logprobs"] = 2;
      } else {
        body["prompt"] = "Name a color";
        body["logprobs"] = 2;
      }
      const Response r =
          post(*server_, chat ? "/v1/chat/completions" : "/v1/completions", body.dump());
      ASSERT_EQ(r.status, 200) << r.raw;
      std::vector<std::string> names;
      std::vector<int> ids;
      auto collect = [&](const json& choice) {
        if (choice.contains("token_ids") && choice["token_ids"].is_array())
          for (const auto& id : choice["token_ids"]) ids.push_back(id.get<int>());
        const json& lp = choice["logprobs"];
        if (lp.is_null()) return;
        if (chat) {
          for (const auto& t : lp["content"]) {
            names.push_back(t["token"]);
            EXPECT_EQ(t["bytes"].size(), t["token"].get<std::string>().size());
            EXPECT_EQ(t["top_logprobs"].size(), 2u);
          }
        } else {
          for (const auto& t : lp["tokens"]) names.push_back(t);
        }
      };
      if (stream) {
        int done = 0;
        for (const auto& e : sse_events(r.raw, &done))
          if (!e["choices"].empty()) collect(e["choices"][0]);
      } else {
        collect(r.body["choices"][0]);
      }
      ASSERT_EQ(ids.size(), 3u) << r.raw;
      ASSERT_EQ(names.size(), 3u) << r.raw;
      for (size_t i = 0; i < 3; ++i)
        EXPECT_EQ(names[i], "token_id:" + std::to_string(ids[i])) << chat << stream;
    }
  }
}

// cache_salt: a prompt cached under one salt is a miss for another salt and for no salt, and a
// hit for the same salt; the outputs do not change. An empty salt gets vLLM's 400.
TEST_F(ServeTest, CacheSaltSeparatesPrefixCacheHits) {
  ASSERT_TRUE(server_->ready());
  std::string prompt = "salted ";
  for (int i = 0; i < 40; ++i) prompt += "token" + std::to_string(i) + " ";  // > 3 blocks
  json body = {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}};
  auto hits_of = [&](const json& salt) {
    json b = body;
    if (!salt.is_null()) b["cache_salt"] = salt;
    const double before = metric(*server_, "vllm:prefix_cache_hits_total");
    const Response r = post(*server_, "/v1/completions", b.dump());
    EXPECT_EQ(r.status, 200) << r.raw;
    return std::pair{metric(*server_, "vllm:prefix_cache_hits_total") - before,
                     r.body["choices"][0]["text"].get<std::string>()};
  };
  const auto [first_hits, text] = hits_of("tenant-a");
  EXPECT_EQ(first_hits, 0.0);
  EXPECT_EQ(hits_of("tenant-b").first, 0.0);
  EXPECT_EQ(hits_of(nullptr).first, 0.0);
  const auto [same_hits, same_text] = hits_of("tenant-a");
  EXPECT_GE(same_hits, 48.0);
  EXPECT_EQ(same_text, text);
  EXPECT_GE(hits_of(nullptr).first, 48.0);  // the unsalted run cached its own blocks
  body["cache_salt"] = "";
  const Response empty = post(*server_, "/v1/completions", body.dump());
  EXPECT_EQ(empty.status, 400);
  EXPECT_EQ(empty.body["error"]["message"],
            "Parameter 'cache_salt' must be a non-empty string if provided.");
}

// vLLM's default --logprobs-mode raw_logprobs: logprobs come from the model's logits before
// logit_bias and the other processors, so a token forced by a bias reports the logprob it had
// without it (not ~0, its probability after the bias).
TEST_F(ServeTest, LogprobsAreRawBeforeLogitBias) {
  ASSERT_TRUE(server_->ready());
  json body = {{"prompt", "The capital of France is"},
               {"max_tokens", 1},
               {"temperature", 0},
               {"logprobs", 3},
               {"return_tokens_as_token_ids", true}};
  const Response plain = post(*server_, "/v1/completions", body.dump());
  ASSERT_EQ(plain.status, 200) << plain.raw;
  const json& top = plain.body["choices"][0]["logprobs"]["top_logprobs"][0];
  ASSERT_EQ(top.size(), 3u) << top;
  std::string third;  // the least likely of the three: never the greedy choice
  double third_logprob = 0;
  for (const auto& [token, logprob] : top.items()) {
    if (third.empty() || logprob.get<double>() < third_logprob) {
      third = token;
      third_logprob = logprob.get<double>();
    }
  }
  ASSERT_EQ(third.rfind("token_id:", 0), 0u) << third;
  ASSERT_LT(third_logprob, -0.01);
  body["logit_bias"] = {{third.substr(9), 100}};
  const Response biased = post(*server_, "/v1/completions", body.dump());
  ASSERT_EQ(biased.status, 200) << biased.raw;
  const json& lp = biased.body["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"][0], third);
  EXPECT_NEAR(lp["token_logprobs"][0].get<double>(), third_logprob, 1e-4);
}

// Without --scheduling-policy priority a non-zero priority is refused, as vLLM refuses it.
TEST_F(ServeTest, PriorityNeedsThePriorityPolicy) {
  ASSERT_TRUE(server_->ready());
  const json body = {{"prompt", "hi"}, {"max_tokens", 2}, {"priority", 0}};
  EXPECT_EQ(post(*server_, "/v1/completions", body.dump()).status, 200);
  json urgent = body;
  urgent["priority"] = -1;
  const Response r = post(*server_, "/v1/completions", urgent.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["message"], "Got priority -1 but Priority scheduling is not enabled.");
}

// --scheduling-policy priority, one sequence at a time: of two requests queued behind a long
// one, the later with the smaller priority runs first (first come, first served would run the
// earlier one first).
TEST(ServePriorityTest, ASmallerPriorityQueuedLaterRunsFirst) {
  auto flags = base_flags();
  flags.insert(flags.end(), {"--scheduling-policy", "priority", "--max-num-seqs", "1"});
  e2e::ServerProcess server(model_dir(), flags, "/tmp/chunkpipe_e2e_priority.log");
  ASSERT_TRUE(server.ready());
  // Polls a gauge until it reads `value`, for at most 10 s.
  auto reaches = [&](const std::string& gauge, double value) {
    for (int i = 0; i < 2000; ++i) {
      if (metric(server, gauge) == value) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  std::thread blocker([&] {
    const json hold = {{"prompt", "hold the engine"}, {"max_tokens", 480}, {"ignore_eos", true}};
    EXPECT_EQ(post(server, "/v1/completions", hold.dump(), false).status, 200);
  });
  ASSERT_TRUE(reaches("vllm:num_requests_running", 1)) << "the long request never ran";
  std::mutex mu;
  std::vector<std::string> finished;
  auto queue = [&](const std::string& name, int priority) {
    return std::thread([&, name, priority] {
      const json b = {{"prompt", name}, {"max_tokens", 4}, {"priority", priority}};
      const Response r = post(server, "/v1/completions", b.dump(), false);
      EXPECT_EQ(r.status, 200) << r.raw;
      std::lock_guard<std::mutex> lock(mu);
      finished.push_back(name);
    });
  };
  std::thread background = queue("background", 5);
  const bool first_queued = reaches("vllm:num_requests_waiting", 1);
  std::thread urgent = queue("urgent", -5);
  // Both waiting at once: the order they start in is then the scheduler's choice.
  const bool both_queued = first_queued && reaches("vllm:num_requests_waiting", 2);
  blocker.join();
  background.join();
  urgent.join();
  ASSERT_TRUE(both_queued) << "the long request (480 tokens) ended before both were queued";
  EXPECT_EQ(finished, (std::vector<std::string>{"urgent", "background"}));
  EXPECT_EQ(server.stop(), 0);
}

TEST_F(ServeTest, SixtyFourConcurrentStreamsWithDisconnects) {
  ASSERT_TRUE(server_->ready());
  std::atomic<int> correct{0}, disconnected{0};
  std::mutex failures_mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int i = 0; i < 64; ++i) {
    threads.emplace_back([&, i] {
      const int max_tokens = 4 + (i * 7) % 29;
      std::string prompt;
      for (int w = 0; w < 1 + (i * 13) % 40; ++w) prompt += "token" + std::to_string(w) + " ";
      json body = {{"prompt", prompt},
                   {"max_tokens", max_tokens},
                   {"ignore_eos", true},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}},
                   {"seed", i}};
      auto c = server_->client();
      httplib::Headers h = {{"Authorization", "Bearer " + kKey}};
      if (i % 8 == 7) {  // these clients hang up after the second chunk
        int chunks = 0;
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/completions";
        req.headers = h;
        req.body = body.dump();
        req.set_header("Content-Type", "application/json");
        req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
          return ++chunks < 2;
        };
        c.send(req);
        ++disconnected;
        return;
      }
      auto r = c.Post("/v1/completions", h, body.dump(), "application/json");
      std::string why;
      if (!r || r->status != 200) {
        why = r ? "HTTP " + std::to_string(r->status) + " " + r->body.substr(0, 200)
                : "no response: " + httplib::to_string(r.error());
      } else {
        int done = 0;
        auto events = sse_events(r->body, &done);
        int tokens = 0;
        for (const auto& e : events) tokens += e["choices"].empty() ? 0 : 1;
        if (done == 1 && !events.empty() &&
            events.back()["usage"]["completion_tokens"] == max_tokens && tokens <= max_tokens) {
          ++correct;
          return;
        }
        why = "done=" + std::to_string(done) + " tokens=" + std::to_string(tokens) +
              " max=" + std::to_string(max_tokens) +
              " last=" + (events.empty() ? "" : events.back().dump().substr(0, 200));
      }
      std::lock_guard<std::mutex> lock(failures_mu);
      failures.push_back("request " + std::to_string(i) + ": " + why);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(correct.load(), 56);
  for (size_t k = 0; k < std::min<size_t>(failures.size(), 5); ++k) ADD_FAILURE() << failures[k];
  EXPECT_EQ(disconnected.load(), 8);
  // Aborted requests free their blocks: usage drains back to zero.
  double usage = -1, running = -1;
  for (int i = 0; i < 100; ++i) {
    usage = metric(*server_, "vllm:kv_cache_usage_perc");
    running = metric(*server_, "vllm:num_requests_running");
    if (usage == 0.0 && running == 0.0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(usage, 0.0);
  EXPECT_EQ(running, 0.0);
  EXPECT_GE(metric(*server_, "vllm:request_success_total"), 0.0);
}

TEST_F(ServeTest, StopStringsStopTokensEchoAndN) {
  ASSERT_TRUE(server_->ready());
  json body = {{"prompt", "The future of AI is"},
               {"max_tokens", 12},
               {"temperature", 0},
               {"ignore_eos", true}};
  auto full = post(*server_, "/v1/completions", body.dump());
  ASSERT_EQ(full.status, 200);
  const std::string text = full.body["choices"][0]["text"];
  ASSERT_GE(text.size(), 6u);
  const std::string stop = text.substr(3, 3);
  body["stop"] = {stop};
  auto stopped = post(*server_, "/v1/completions", body.dump());
  EXPECT_EQ(stopped.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(stopped.body["choices"][0]["stop_reason"], stop);
  EXPECT_EQ(stopped.body["choices"][0]["text"], text.substr(0, text.find(stop)));
  // Streamed, the same text arrives (held back while it could still become the stop string).
  body["stream"] = true;
  auto streamed = post(*server_, "/v1/completions", body.dump());
  int done = 0;
  std::string joined;
  for (const auto& e : sse_events(streamed.raw, &done))
    joined += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(joined, text.substr(0, text.find(stop)));

  json echo = {{"prompt", "Echo me"}, {"max_tokens", 2}, {"echo", true}, {"n", 2}, {"seed", 5}};
  auto r = post(*server_, "/v1/completions", echo.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"].size(), 2u);
  for (const auto& c : r.body["choices"])
    EXPECT_EQ(c["text"].get<std::string>().rfind("Echo me", 0), 0u);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 4);

  auto ids = post(*server_, "/tokenize", R"({"prompt": "The future of AI is"})");
  ASSERT_EQ(ids.status, 200);
  EXPECT_TRUE(ids.body["token_strs"].is_null());
  auto strs = post(*server_, "/tokenize",
                   R"({"prompt": "The future of AI is", "return_token_strs": true})");
  ASSERT_EQ(strs.status, 200);
  EXPECT_EQ(strs.body["token_strs"], json({"<｜begin▁of▁sentence｜>", "The", "\u0120future",
                                           "\u0120of", "\u0120AI", "\u0120is"}))
      << strs.raw;
  auto back = post(*server_, "/detokenize", json({{"tokens", ids.body["tokens"]}}).dump());
  EXPECT_EQ(back.body["prompt"], "<｜begin▁of▁sentence｜>The future of AI is");
  const int first_generated =
      post(*server_, "/tokenize", json({{"prompt", text}, {"add_special_tokens", false}}).dump())
          .body["tokens"][0];
  json stop_tok = {{"prompt", "The future of AI is"},
                   {"max_tokens", 12},
                   {"temperature", 0},
                   {"stop_token_ids", {first_generated}}};
  auto st = post(*server_, "/v1/completions", stop_tok.dump());
  EXPECT_EQ(st.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(st.body["choices"][0]["stop_reason"], first_generated);
}

// continue_final_message leaves the final message open (its prompt is the closed one's, less
// the end of turn) and may not be combined with add_generation_prompt; chat echo starts each
// answer with the final message, streamed or not; without a generation prompt the answer takes
// the final message's role, as in vLLM.
TEST_F(ServeTest, ContinueFinalMessageAndChatEcho) {
  ASSERT_TRUE(server_->ready());
  const json messages = json::parse(R"([{"role": "user", "content": "Tell a story"},
      {"role": "assistant", "content": "Once upon a time"}])");
  const Response closed = post(*server_, "/tokenize", json{{"messages", messages}}.dump());
  const Response open = post(*server_, "/tokenize",
                             json{{"messages", messages}, {"continue_final_message", true}}.dump());
  ASSERT_EQ(closed.status, 200) << closed.raw;
  ASSERT_EQ(open.status, 200) << open.raw;
  const auto closed_ids = closed.body["tokens"].get<std::vector<int>>();
  const auto open_ids = open.body["tokens"].get<std::vector<int>>();
  ASSERT_LT(open_ids.size(), closed_ids.size());
  EXPECT_TRUE(std::equal(open_ids.begin(), open_ids.end(), closed_ids.begin()));
  const std::string both =
      "Cannot set both `continue_final_message` and `add_generation_prompt` to True.";
  for (const char* path : {"/tokenize", "/v1/chat/completions"}) {
    const json body = {
        {"messages", messages}, {"continue_final_message", true}, {"add_generation_prompt", true}};
    const Response r = post(*server_, path, body.dump());
    EXPECT_EQ(r.status, 400) << path;
    EXPECT_EQ(r.body["error"]["message"], both) << path;
  }
  json body = {{"messages", messages}, {"continue_final_message", true},
               {"echo", true},         {"max_tokens", 3},
               {"temperature", 0},     {"n", 2}};
  const Response r = post(*server_, "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], open_ids.size());
  std::string answer;
  for (const auto& c : r.body["choices"]) {
    EXPECT_EQ(c["message"]["role"], "assistant");
    answer = c["message"]["content"].get<std::string>();
    EXPECT_EQ(answer.rfind("Once upon a time", 0), 0u) << answer;
    EXPECT_GT(answer.size(), std::string("Once upon a time").size());
  }
  body["stream"] = true;
  const Response streamed = post(*server_, "/v1/chat/completions", body.dump());
  int done = 0;
  std::map<int, std::string> joined;
  for (const auto& e : sse_events(streamed.raw, &done)) {
    const json& c = e["choices"][0];
    if (c["delta"].contains("content")) joined[c["index"]] += c["delta"]["content"];
  }
  EXPECT_EQ(done, 1);
  ASSERT_EQ(joined.size(), 2u);
  for (const auto& [index, text] : joined) EXPECT_EQ(text, answer) << index;
  // Without a generation prompt after a user turn, the answer is the user's.
  const json user_last = {{"messages", {messages[0]}},
                          {"add_generation_prompt", false},
                          {"max_tokens", 1},
                          {"echo", true}};
  const Response as_user = post(*server_, "/v1/chat/completions", user_last.dump());
  ASSERT_EQ(as_user.status, 200) << as_user.raw;
  EXPECT_EQ(as_user.body["choices"][0]["message"]["role"], "user");
  EXPECT_EQ(
      as_user.body["choices"][0]["message"]["content"].get<std::string>().rfind("Tell a story", 0),
      0u);
}

TEST_F(ServeTest, BenchServeCountsEveryTokenAndReadsServerTimings) {
  ASSERT_TRUE(server_->ready());
  const std::string dir =
      std::filesystem::temp_directory_path() / ("chunkpipe_bench_" + std::to_string(getpid()));
  const std::string cmd =
      "OPENAI_API_KEY=" + kKey + " " + CHUNKPIPE_BINARY +
      " bench serve --base-url http://127.0.0.1:" + std::to_string(server_->port()) +
      " --random-input 48 --random-output-len 8 --num-prompt 24 --max-concurrency 6 --ignore-eos"
      " --percentile-metrics ttft,tpot,itl,e2el --save-result --result-dir " +
      dir + " --result-filename r.json --request-id-prefix bench";
  auto r = e2e::run_shell(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* field : {"Successful requests:                     24",
                            "Failed requests:                         0",
                            "Maximum request concurrency:             6",
                            "Benchmark duration (s):",
                            "Total input tokens:",
                            "Total generated tokens:                  192",
                            "Request throughput (req/s):",
                            "Output token throughput (tok/s):",
                            "Peak output token throughput (tok/s):",
                            "Peak concurrent requests:",
                            "Total token throughput (tok/s):",
                            "Mean TTFT (ms):",
                            "Median TTFT (ms):",
                            "P99 TTFT (ms):",
                            "Mean TPOT (ms):",
                            "Median TPOT (ms):",
                            "P99 TPOT (ms):",
                            "Mean ITL (ms):",
                            "Median ITL (ms):",
                            "P99 ITL (ms):",
                            "Mean E2EL (ms):",
                            "P99 E2EL (ms):"}) {
    EXPECT_NE(r.out.find(field), std::string::npos) << field << "\n" << r.out;
  }
  std::ifstream in(dir + "/r.json");
  json result = json::parse(in);
  EXPECT_EQ(result["completed"], 24);
  EXPECT_EQ(result["total_output_tokens"], 24 * 8);
  int64_t sum = 0;
  for (const auto& n : result["output_lens"]) sum += n.get<int64_t>();
  EXPECT_EQ(sum, 24 * 8);
  for (const char* key :
       {"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "mean_itl_ms", "mean_e2el_ms", "request_throughput", "output_throughput",
        "total_token_throughput", "ttfts", "itls", "start_times", "input_lens"}) {
    EXPECT_TRUE(result.contains(key)) << key;
  }
  // The server logs each finished request's TTFT and E2E (printed next to the client's).
  std::ifstream log("/tmp/chunkpipe_e2e_main.log");
  std::vector<double> server_ttft, server_e2e;
  int received = 0, generated = 0;  // --enable-log-requests / --enable-log-outputs lines
  for (std::string line; std::getline(log, line);) {
    received += line.find("Received request cmpl-bench-") != std::string::npos &&
                line.find("max_tokens=8") != std::string::npos &&
                line.find("seed=None") != std::string::npos;  // unseeded, as the client sent it
    generated += line.find("Generated response cmpl-bench-") != std::string::npos &&
                 line.find("finish_reason: length") != std::string::npos;
    if (line.find("Finished request cmpl-bench-") == std::string::npos) continue;
    server_ttft.push_back(std::stod(line.substr(line.find("ttft_ms=") + 8)));
    server_e2e.push_back(std::stod(line.substr(line.find("e2e_ms=") + 7)));
  }
  ASSERT_EQ(server_ttft.size(), 24u);
  EXPECT_EQ(received, 24);
  EXPECT_EQ(generated, 24);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  const double client_ttft = result["median_ttft_ms"], client_e2e = result["median_e2el_ms"];
  std::printf(
      "    median TTFT client %.2f ms / server %.2f ms; median E2E client %.2f ms / server %.2f "
      "ms\n",
      client_ttft, median(server_ttft), client_e2e, median(server_e2e));
  // No timing assertion here (tests must not depend on machine speed or load):
  // bench/ttft_agreement.sh checks the 5 ms agreement on a quiet machine.
  EXPECT_GT(client_ttft, 0.0);
  EXPECT_GT(client_e2e, client_ttft);

  // vLLM's other request flags, and --append-result: the second run is a second line.
  const std::string base =
      "OPENAI_API_KEY=" + kKey + " " + CHUNKPIPE_BINARY +
      " bench serve --base-url http://127.0.0.1:" + std::to_string(server_->port()) +
      " --random-input 16 --random-output-len 4 --num-prompts 4";
  r = e2e::run_shell(base +
                     " --trust-remote-code --min-p 0.1 --logprobs 2 --temperature 0.7 --save-result"
                     " --append-result --result-dir " +
                     dir + " --result-filename r.json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("Successful requests:                     4"), std::string::npos) << r.out;
  std::ifstream appended(dir + "/r.json");
  std::vector<json> lines;
  for (std::string line; std::getline(appended, line);)
    if (!line.empty()) lines.push_back(json::parse(line, nullptr, false));
  ASSERT_EQ(lines.size(), 2u) << "the first result, then the appended one";
  EXPECT_EQ(lines[0]["completed"], 24);
  EXPECT_EQ(lines[1]["completed"], 4);
  r = e2e::run_shell(base + " --use-beam-search");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("beam search is not served"), std::string::npos) << r.out;

  // The endpoint ready check (vLLM's --ready-check-timeout-sec): a live server passes it before
  // the warm-up; a port nobody serves fails the run with exit 1 after the timeout.
  r = e2e::run_shell(base + " --ready-check-timeout-sec 30 --num-warmups 1 --metadata k=v");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const size_t ready = r.out.find("Initial test run completed.");
  EXPECT_NE(ready, std::string::npos) << r.out;
  EXPECT_LT(ready, r.out.find("Warmup run completed.")) << r.out;
  EXPECT_EQ(r.out.find("Skipping endpoint ready check."), std::string::npos) << r.out;
  r = e2e::run_shell(std::string(CHUNKPIPE_BINARY) + " bench serve --model m --tokenizer " +
                     CHUNKPIPE_TOKENIZER_DIR + " --num-prompts 2 --random-input 16 --port " +
                     std::to_string(e2e::free_port()) + " --ready-check-timeout-sec 2");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("the endpoint did not answer the first request within 2 s"),
            std::string::npos)
      << r.out;
  r = e2e::run_shell(base + " --metadata novalue");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("argument --metadata: expected KEY=VALUE, got 'novalue'"), std::string::npos)
      << r.out;
  std::filesystem::remove_all(dir);
}

TEST_F(ServeTest, BenchDatasetsChatBackendAndOfflineModes) {
  ASSERT_TRUE(server_->ready());
  const std::string dir =
      std::filesystem::temp_directory_path() / ("chunkpipe_ds_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/sharegpt.json") << R"([
    {"conversations": [{"from": "human", "value": "What is the capital of France? Answer with some history."},
                       {"from": "gpt", "value": "The capital of France is Paris, a city founded long ago."}]},
    {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}])";
  std::ofstream(dir + "/synthetic.json")
      << R"({"Type": "string", "RequestCount": 6, "StringConfig": {
    "Input": {"Method": "uniform", "Params": {"MinValue": 20, "MaxValue": 40}},
    "Output": {"Method": "fixed", "Params": {"Value": 5}}}})";
  const std::string base =
      "OPENAI_API_KEY=" + kKey + " " + CHUNKPIPE_BINARY +
      " bench serve --base-url http://127.0.0.1:" + std::to_string(server_->port()) +
      " --ignore-eos ";
  auto sharegpt = e2e::run_shell(base + "--dataset-name sharegpt --dataset-path " + dir +
                                 "/sharegpt.json --num-prompts 10");
  EXPECT_EQ(sharegpt.exit_code, 0) << sharegpt.out;
  EXPECT_NE(sharegpt.out.find("Successful requests:                     1 "), std::string::npos)
      << sharegpt.out;  // "hi" is filtered
  auto synthetic = e2e::run_shell(base + "--dataset-name synthetic --dataset-path " + dir +
                                  "/synthetic.json --backend openai-chat");
  EXPECT_EQ(synthetic.exit_code, 0) << synthetic.out;
  EXPECT_NE(synthetic.out.find("Successful requests:                     6"), std::string::npos)
      << synthetic.out;
  EXPECT_NE(synthetic.out.find("Total generated tokens:                  30"), std::string::npos)
      << synthetic.out;
  auto paced = e2e::run_shell(base +
                              "--num-prompts 6 --random-input-len 16 --random-output-len 2 "
                              "--request-rate 50 --burstiness 0.5");
  EXPECT_NE(paced.out.find("Traffic request rate: 50.0"), std::string::npos) << paced.out;
  EXPECT_NE(paced.out.find("Request rate configured (RPS):           50.00"), std::string::npos)
      << paced.out;
  auto bad = e2e::run_shell(base + "--dataset-name sharegpt");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("--dataset-path is required for sharegpt"), std::string::npos) << bad.out;
  std::filesystem::remove_all(dir);

  const std::string model = model_dir();
  auto latency = e2e::run_shell(
      std::string(CHUNKPIPE_BINARY) + " bench latency " + model +
      " --input-len 8 --output-len 4 --batch-size 2 --num-iters-warmup 1 --num-iters 2"
      " --kv-cache-memory 4000000 --max-model-len 512 --block-size 16");
  EXPECT_EQ(latency.exit_code, 0) << latency.out;
  EXPECT_NE(latency.out.find("Avg latency:"), std::string::npos) << latency.out;
  EXPECT_NE(latency.out.find("99% percentile latency:"), std::string::npos) << latency.out;
  auto throughput =
      e2e::run_shell(std::string(CHUNKPIPE_BINARY) + " bench throughput " + model +
                     " --input-len 8 --output-len 4 --num-prompts 6 --kv-cache-memory 4000000"
                     " --max-model-len 512 --block-size 16");
  EXPECT_EQ(throughput.exit_code, 0) << throughput.out;
  EXPECT_NE(throughput.out.find("Total num output tokens:  24"), std::string::npos)
      << throughput.out;
}

TEST(BenchErrorsTest, FailuresAreCountedAndTheRunCompletes) {
  // A stub that answers 200 with a stream holding no choice, and 400 for long prompts.
  httplib::Server stub;
  stub.Post("/v1/completions", [](const httplib::Request& req, httplib::Response& res) {
    if (req.body.size() > 2000) {
      res.status = 400;
      res.set_content(
          R"({"error":{"message":"too long","type":"BadRequestError","param":null,"code":400}})",
          "application/json");
      return;
    }
    res.set_content("data: [DONE]\n\n", "text/event-stream");
  });
  const int port = stub.bind_to_any_port("127.0.0.1");
  std::thread serving([&] { stub.listen_after_bind(); });
  const std::string common = std::string(CHUNKPIPE_BINARY) +
                             " bench serve --model m --tokenizer " CHUNKPIPE_TOKENIZER_DIR
                             " --num-prompts 5 --random-output-len 4 --max-concurrency 2 ";
  auto never = e2e::run_shell(common + "--random-input-len 16 --port " + std::to_string(port));
  EXPECT_EQ(never.exit_code, 0) << never.out;
  EXPECT_NE(never.out.find("Failed requests:                         5"), std::string::npos)
      << never.out;
  EXPECT_NE(never.out.find("Never received a valid chunk to calculate TTFT."), std::string::npos)
      << never.out;
  auto rejected = e2e::run_shell(common + "--random-input-len 1500 --port " + std::to_string(port));
  EXPECT_EQ(rejected.exit_code, 0) << rejected.out;
  EXPECT_NE(rejected.out.find("Failed requests:                         5"), std::string::npos)
      << rejected.out;
  EXPECT_NE(rejected.out.find("HTTP 400"), std::string::npos) << rejected.out;
  stub.stop();
  serving.join();
  auto down =
      e2e::run_shell(common + "--random-input-len 16 --port " + std::to_string(e2e::free_port()));
  EXPECT_EQ(down.exit_code, 0) << down.out;
  EXPECT_NE(down.out.find("Failed requests:                         5"), std::string::npos)
      << down.out;
  EXPECT_NE(down.out.find("transport error"), std::string::npos) << down.out;
}

TEST_F(ServeTest, NpmOpenAiClientWorks) {
  ASSERT_TRUE(server_->ready());
  const std::string cmd = "node " CHUNKPIPE_SOURCE_DIR
                          "/tests/e2e/openai_client_test.mjs http://127.0.0.1:" +
                          std::to_string(server_->port()) + "/v1 " + kKey + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("5 passed, 0 failed"), std::string::npos) << out;
}

TEST(ServeGoldenTest, FirstTokenIsTheArgmaxOfTheGoldenLogits) {
  const std::string data = CHUNKPIPE_TEST_DATA_DIR;
  e2e::ServerProcess s(
      data + "/tiny-bf16",
      {"--tokenizer", CHUNKPIPE_TOKENIZER_DIR, "--block-size", "16", "--max-model-len", "1024",
       "--kv-cache-memory", "8000000", "--threads", "1", "--dtype", "float32"},
      "/tmp/chunkpipe_e2e_golden.log");
  ASSERT_TRUE(s.ready()) << "see /tmp/chunkpipe_e2e_golden.log";
  for (const char* seq : {"short", "s64", "s200"}) {
    std::ifstream in(data + "/golden/tiny-bf16." + std::string(seq) + ".json");
    json g = json::parse(in);
    json body = {{"prompt", g["ids"]}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 1}};
    auto r = post(s, "/v1/completions", body.dump(), false);
    ASSERT_EQ(r.status, 200) << r.raw;
    auto d = post(s, "/detokenize", json({{"tokens", {g["last_argmax"]}}}).dump(), false);
    EXPECT_EQ(r.body["choices"][0]["text"], d.body["prompt"]) << seq;
    const double golden_max = *std::max_element(g["last_logits"].begin(), g["last_logits"].end());
    (void)golden_max;
    EXPECT_EQ(r.body["choices"][0]["logprobs"]["tokens"][0], d.body["prompt"]) << seq;
  }
  EXPECT_EQ(s.stop(), 0);
}

TEST(ServeFlagsTest, UnbuiltFeaturesAndUnknownFlagsFailClearly) {
  const std::string m = CHUNKPIPE_TEST_DATA_DIR "/tiny-bf16";
  auto run = [&](const std::string& args, int timeout_s = 60) {
    // `timeout` guards against a command line that unexpectedly starts serving. The API port
    // is bound before the model's checks: --port 0 (the kernel's pick) unless args name one.
    auto r = e2e::run_shell("timeout " + std::to_string(timeout_s) + " " +
                            std::string(CHUNKPIPE_BINARY) + " serve " + m + " --port 0 " + args);
    return std::make_pair(r.exit_code, r.out);
  };
  auto [rc, out] = run("--bogus-flag 1");
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("unrecognized argument: --bogus-flag"), std::string::npos) << out;
  // Data-parallel layouts that cannot work name the flag.
  const std::pair<std::string, std::string> dp_cases[] = {
      {"--data-parallel-size 2 --data-parallel-rank 2",
       "--data-parallel-rank 2 must be below --data-parallel-size 2"},
      {"--data-parallel-size 4 --data-parallel-size-local 2 --data-parallel-start-rank 2",
       "--data-parallel-start-rank is for --headless nodes"},
      {"--headless --data-parallel-size 4 --data-parallel-size-local 2",
       "a --headless node needs --data-parallel-start-rank > 0"},
      {"--headless --data-parallel-size 4 --data-parallel-start-rank 3 --data-parallel-size-local "
       "2",
       "exceeds --data-parallel-size 4"},
      {"--headless", "--headless needs --nnodes > 1 (a pipeline) or --data-parallel-size > 1"},
      {"--data-parallel-size 2 --dp-engine-of 127.0.0.1:1",
       "--dp-engine-of needs --data-parallel-rank"},
  };
  for (const auto& [args, message] : dp_cases) {
    std::tie(rc, out) = run("--host 127.0.0.1 " + args);
    EXPECT_EQ(rc, 2) << args;
    EXPECT_NE(out.find(message), std::string::npos) << args << "\n" << out;
  }
  // The model can be given as --model instead of the positional.
  auto by_flag = e2e::run_shell("timeout 60 " + std::string(CHUNKPIPE_BINARY) + " serve --model " +
                                m + " --host 127.0.0.1 --data-parallel-size 2 -dpn 3");
  EXPECT_EQ(by_flag.exit_code, 2) << by_flag.out;
  EXPECT_NE(by_flag.out.find("--data-parallel-rank 3"), std::string::npos) << by_flag.out;
  // finegrained_tp_config as vllm-ascend checks it: the lm_head group must divide the DP size.
  std::tie(rc, out) =
      run("--host 127.0.0.1 --additional-config "
          "'{\"finegrained_tp_config\": {\"lmhead_tensor_parallel_size\": 16}}'");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("finegrained tp sizes must divide by data_parallel_size"), std::string::npos)
      << out;
  // A tensor-parallel decoder would have to load every rank's cache: not built; a TP prefiller
  // must say its TP size in the connector's layout.
  const std::string kv =
      R"('{"kv_connector": "MooncakeConnectorV1", "kv_role": "ROLE", )"
      R"("kv_port": "39000", "kv_connector_extra_config": {"prefill": )"
      R"({"pp_size": 1, "dp_size": 1, "tp_size": 1}, "decode": {"dp_size": 1, "tp_size": 1}}}')";
  auto role = [&](const std::string& r) {
    std::string c = kv;
    c.replace(c.find("ROLE"), 4, r);
    return c;
  };
  std::tie(rc, out) = run("--host 127.0.0.1 -tp 2 --kv-transfer-config " + role("kv_consumer"));
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("a kv_consumer with --tensor-parallel-size > 1 is not built yet"),
            std::string::npos)
      << out;
  std::tie(rc, out) = run("--host 127.0.0.1 -tp 2 --kv-transfer-config " + role("kv_producer"));
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("'kv_connector_extra_config.prefill.tp_size' is 1 but "
                     "--tensor-parallel-size is 2"),
            std::string::npos)
      << out;
  // A tensor-parallel size the model's heads do not split into.
  std::tie(rc, out) = run("--host 127.0.0.1 --tensor-parallel-size 3");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("num_attention_heads (4) is not divisible by --tensor-parallel-size 3"),
            std::string::npos)
      << out;
  // A port in use fails at once, before the model loads (vLLM binds before building its
  // engine), and names the address.
  {
    const int taken = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    ASSERT_EQ(bind(taken, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(listen(taken, 1), 0);
    ASSERT_EQ(getsockname(taken, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    const std::string port = std::to_string(ntohs(addr.sin_port));
    std::tie(rc, out) = run("--host 127.0.0.1 --port " + port);
    close(taken);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("cannot listen on 127.0.0.1:" + port + ": Address already in use"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("Resolved architecture"), std::string::npos) << "the model loaded first";
  }
  std::tie(rc, out) = run("--port notaport");
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("argument --port: invalid int value: 'notaport'"), std::string::npos) << out;
  // profiling_chunk_config is validated at startup with vllm-ascend's messages.
  const std::pair<std::string, std::string> cpp_cases[] = {
      {R"({"enabled": true})", "profiling_chunk_config requires pipeline parallelism (pp > 1)."},
      {R"({"enabled": true, "smooth_factor": 0})", "smooth_factor must be in (0, 1], got 0.0"},
      {R"({"enabled": true, "smooth_factor": 1.5})", "smooth_factor must be in (0, 1], got 1.5"},
      {R"({"enabled": true, "max_fit_chunk": 5})",
       "Recommend to use at least 30 data points for fitting, got 5"},
  };
  for (const auto& [cfg, message] : cpp_cases) {
    std::tie(rc, out) =
        run("--host 127.0.0.1 --additional-config '{\"scheduler_config\": "
            "{\"profiling_chunk_config\": " +
            cfg + "}}'");
    EXPECT_EQ(rc, 2) << cfg;
    EXPECT_NE(out.find(message), std::string::npos) << cfg << "\n" << out;
  }
  std::tie(rc, out) =
      run("--host 127.0.0.1 --additional-config '{\"expanded_kv_cache\": \"yes\"}'");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("additional_config.expanded_kv_cache must be a boolean"), std::string::npos)
      << out;
  std::tie(rc, out) = run("--host 127.0.0.1 --additional-config '{\"lm_head_int8\": 1}'");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("additional_config.lm_head_int8 must be a boolean"), std::string::npos) << out;
  std::tie(rc, out) =
      run("--host 127.0.0.1 -pp 2 -tp 2 --max-num-batched-tokens 1024 --additional-config "
          "'{\"scheduler_config\": {\"profiling_chunk_config\": {\"enabled\": true}}}'");
  EXPECT_NE(out.find("Clamping min_chunk to 1024"), std::string::npos) << out;
  // Every `vllm serve` command line of the seed documents parses (no unknown or invalid flag).
  // Each stops at the first feature not built yet, or passes every check and stops only because
  // the tiny model here has no tokenizer or is too small: 4 heads, not the 128 that the seed's
  // --tensor-parallel-size splits, or 16 experts, not the 256 that the seed's 32 expert-parallel
  // decoder ranks split. --host 127.0.0.1 last keeps tests on loopback.
  std::ifstream in(CHUNKPIPE_TEST_DATA_DIR "/seed_serve_commands.txt");
  int lines = 0, runnable = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    ++lines;
    std::tie(rc, out) = run(line + " --host 127.0.0.1 --port 0");
    // The tiny model directory has no tokenizer: a line that gets as far as loading it has
    // passed every check of its flags (the seed's MTP lines, since speculative decoding).
    const bool model_too_small =
        rc == 1 &&
        (out.find("num_attention_heads (4) is not divisible by --tensor-parallel-size") !=
             std::string::npos ||
         out.find("n_routed_experts (16) is not divisible by the expert-parallel size") !=
             std::string::npos ||
         out.find("tokenizer.json: cannot open") != std::string::npos ||
         // vllm-ascend's own check: the PD decoder lines give lmhead_tensor_parallel_size 16
         // with --data-parallel-size 2 (the seed scales DP out with launch_online_dp.py).
         out.find("finegrained tp sizes must divide by data_parallel_size") != std::string::npos);
    runnable += model_too_small;
    if (!model_too_small) {
      EXPECT_EQ(rc, 2) << line << "\n" << out;
      EXPECT_NE(out.find("is not built yet"), std::string::npos) << line << "\n" << out;
    }
    EXPECT_EQ(out.find("unrecognized"), std::string::npos) << line << "\n" << out;
    EXPECT_EQ(out.find("invalid"), std::string::npos) << line << "\n" << out;
  }
  EXPECT_EQ(lines, 10);
  EXPECT_GE(runnable, 3) << "the seed's TP x PP prefiller and its DP decoders pass every check";
}

}  // namespace
