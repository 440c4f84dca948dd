// Prefill-decode disaggregation end to end on loopback, with the pull connector
// (MooncakeConnectorV1) and `chunkpipe proxy`: greedy outputs equal colocated serving for a
// prefiller with PP=2 and CPP, the decoder computes only the prompt's last token and pulls
// exactly the prompt's blocks, and faults (a decoder that never reads, a prefiller killed
// before the read, a decoder that refuses, clients that vanish under load, a decoder out of KV)
// never leak a block or return garbage.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "pids_limit.h"
#include "random_requests.h"
#include "raw_http.h"
#include "server_process.h"
#include "test_model.h"

namespace {

using e2e::metric;
using e2e::ServerProcess;
using nlohmann::json;

constexpr int kBlock = 16;
constexpr int kLayers = 2;
constexpr int kRowBytes = (32 + 16) * 4;  // kv_lora_rank + qk_rope_head_dim, f32

// Side-channel ports: one base per test process, so parallel test runs do not collide, and
// below Linux's ephemeral range (32768-60999), where any outgoing connection's source port
// could take them.
int kv_port_base() {
  return 20000 + (getpid() % 1400) * 8;
}

std::vector<std::string> flags(int max_model_len = 4096) {
  return {"--served-model-name",
          "model",
          "--max-model-len",
          std::to_string(max_model_len),
          "--block-size",
          "16",
          "--kv-cache-memory",
          "16000000",
          "--threads",
          "1",
          "--max-num-seqs",
          "64",
          "--max-num-batched-tokens",
          "512"};
}

json kv_config(const std::string& role, int kv_port, int prefill_pp,
               const std::string& policy = "fail", int prefill_tp = 1) {
  return {{"kv_connector", "MooncakeConnectorV1"},
          {"kv_role", role},
          {"kv_port", std::to_string(kv_port)},
          {"engine_id", "0"},
          {"kv_load_failure_policy", policy},
          {"kv_connector_extra_config",
           {{"prefill", {{"pp_size", prefill_pp}, {"dp_size", 1}, {"tp_size", prefill_tp}}},
            {"decode", {{"dp_size", 2}, {"tp_size", 1}}}}}};
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::string> prefiller_flags(int kv_port, int pp, int tp = 1) {
  auto f = with(flags(),
                {"--kv-transfer-config", kv_config("kv_producer", kv_port, pp, "fail", tp).dump()});
  if (pp > 1) f = with(f, {"--pipeline-parallel-size", std::to_string(pp)});
  if (tp > 1) f = with(f, {"--tensor-parallel-size", std::to_string(tp)});
  return f;
}

std::vector<std::string> decoder_flags(int kv_port, int prefill_pp,
                                       const std::string& policy = "fail", int prefill_tp = 1) {
  return with(
      flags(),
      {"--kv-transfer-config",
       kv_config("kv_consumer", kv_port, prefill_pp, policy, prefill_tp).dump(),
       "--additional-config", R"({"scheduler_config": {"recompute_scheduler_enable": true}})",
       "--no-enable-prefix-caching"});  // as the seed's decoders: every block is pulled
}

std::string words(int n, int from = 0) {
  std::string s;
  for (int i = 0; i < n; ++i) s += "word" + std::to_string(from + i) + " ";
  return s;
}

json post(const ServerProcess& s, const std::string& path, const json& body,
          int* status = nullptr) {
  auto r = s.client().Post(path, body.dump(), "application/json");
  if (status) *status = r ? r->status : -1;
  if (!r) return json();
  return json::parse(r->body, nullptr, false);
}

// A streamed completion's text, in order; empty on failure. A body that asks for a stream its
// own way (as "stream": "true") keeps it.
std::string stream_text(const ServerProcess& s, json body, bool chat = false) {
  if (!body.contains("stream")) body["stream"] = true;
  std::string text;
  auto r = s.client().Post(chat ? "/v1/chat/completions" : "/v1/completions", body.dump(),
                           "application/json");
  if (!r || r->status != 200) return "";
  for (const std::string& data : e2e::sse_payloads(r->body)) {
    json c = json::parse(data, nullptr, false);
    if (!c.is_object() || !c.contains("choices") || c["choices"].empty()) continue;
    const json& ch = c["choices"][0];
    if (chat) {
      if (ch["delta"].contains("content") && ch["delta"]["content"].is_string())
        text += ch["delta"]["content"].get<std::string>();
    } else {
      text += ch["text"].get<std::string>();
    }
  }
  return text;
}

// Polls until `name` reads `want` (KV usage drains after DONE reaches P); the last value.
double await_metric(const ServerProcess& s, const std::string& name, double want,
                    double timeout_s = 10) {
  double v = metric(s, name);
  for (int i = 0; i < timeout_s * 20 && v != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    v = metric(s, name);
  }
  return v;
}

// The proxy's count of requests in flight, once it reaches 0 or after timeout_s: it drops a
// request after relaying its end, so a client can see [DONE] a moment before the count does.
int64_t await_proxy_idle(const ServerProcess& proxy, double timeout_s = 10) {
  auto in_flight = [&] {
    return json::parse(proxy.client().Get("/healthcheck")->body)["request_num"].get<int64_t>();
  };
  int64_t n = in_flight();
  for (int i = 0; i < timeout_s * 20 && n != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    n = in_flight();
  }
  return n;
}

json complete_body(const std::string& prompt, int max_tokens = 8) {
  return {{"model", "model"},
          {"prompt", prompt},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

class PdTest : public ::testing::Test {
 protected:
  void SetUp() override { setenv("VLLM_HOST_IP", "127.0.0.1", 1); }
};

// 1P1D with a plain P (pp 1), or P with PP=2 and CPP (profiling_chunk_config) as the seed
// runs it, tensor-parallel too as the seed's P is (each stage's TP rank 0 serves its KV); the
// prefix cache on either way.
void outputs_match_colocated(int pp, int tp = 1) {
  const int kv_p = kv_port_base() + (pp == 1 ? 0 : 7), kv_d = kv_p + 4;
  ServerProcess colocated(e2e::model_dir(), flags(), "/tmp/chunkpipe_pd_colocated.log");
  auto pf = with(prefiller_flags(kv_p, pp, tp), {"--enable-prefix-caching"});
  if (pp > 1) {
    pf = with(pf, {"--additional-config",
                   R"({"scheduler_config": {"profiling_chunk_config": {"enabled": true,)"
                   R"( "smooth_factor": 1.0, "min_chunk": 64}}})"});
  }
  ServerProcess p(e2e::model_dir(), pf, "/tmp/chunkpipe_pd_p.log");
  ServerProcess d(e2e::model_dir(), decoder_flags(kv_d, pp, "fail", tp), "/tmp/chunkpipe_pd_d.log");
  ASSERT_TRUE(colocated.ready() && p.ready() && d.ready()) << "see /tmp/chunkpipe_pd_*.log";
  ServerProcess proxy(
      {"proxy", "--prefiller-hosts", "127.0.0.1", "--prefiller-port", std::to_string(p.port()),
       "--decoder-hosts", "127.0.0.1", "--decoder-ports", std::to_string(d.port())},
      "/tmp/chunkpipe_pd_proxy.log", "/healthcheck");
  ASSERT_TRUE(proxy.ready()) << "see /tmp/chunkpipe_pd_proxy.log";

  // 8 prompts: shorter than a block, a block and one, block-aligned, long, 2,000+ tokens, and
  // a repeat (a prefix-cache hit on P).
  const std::vector<std::string> prompts = {"hi",       words(8),   words(16),   words(40),
                                            words(120), words(300), words(1100), words(300)};
  int64_t expected_bytes = 0;
  int d_requests = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const json body = complete_body(prompts[i]);
    const json want = post(colocated, "/v1/completions", body);
    ASSERT_TRUE(want.is_object()) << i;
    int status = 0;
    const json got = post(proxy, "/v1/completions", body, &status);
    ASSERT_EQ(status, 200) << i << " " << got.dump();
    EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]) << "prompt " << i;
    EXPECT_EQ(got["usage"], want["usage"]) << i;
    EXPECT_EQ(stream_text(proxy, body), want["choices"][0]["text"].get<std::string>())
        << "streamed prompt " << i;
    const int64_t n = want["usage"]["prompt_tokens"].get<int64_t>();
    expected_bytes += 2 * ((n - 1 + kBlock - 1) / kBlock) * kLayers * kBlock * kRowBytes;
    d_requests += 2;
  }
  EXPECT_GE(post(colocated, "/tokenize", {{"prompt", prompts[6]}})["count"].get<int>(), 2000);
  // The seed's verification request.
  const json chat = {{"model", "model"},
                     {"messages",
                      {{{"role", "system"}, {"content", "You are a useful AI assistant."}},
                       {{"role", "user"},
                        {"content",
                         "Question: Janet's ducks lay 16 eggs per day. She eats three "
                         "for breakfast and bakes muffins with four. She sells the "
                         "remainder for $2 each. How much does she make?\nAnswer:"}}}},
                     {"max_completion_tokens", 100},
                     {"temperature", 0}};
  int status = 0;
  const json chat_got = post(proxy, "/v1/chat/completions", chat, &status);
  ASSERT_EQ(status, 200) << chat_got.dump();
  const json chat_want = post(colocated, "/v1/chat/completions", chat);
  EXPECT_EQ(chat_got["choices"][0]["message"], chat_want["choices"][0]["message"]);
  EXPECT_EQ(stream_text(proxy, chat, true),
            chat_want["choices"][0]["message"]["content"].get<std::string>());
  const int64_t chat_tokens = chat_want["usage"]["prompt_tokens"].get<int64_t>();
  expected_bytes += 2 * ((chat_tokens - 1 + kBlock - 1) / kBlock) * kLayers * kBlock * kRowBytes;
  d_requests += 2;

  // D computed one token per prompt (the last, for its logits) and pulled the rest.
  EXPECT_EQ(metric(d, "vllm:prompt_tokens_total"), double(d_requests));
  EXPECT_EQ(metric(d, "chunkpipe:kv_pull_bytes_total"), double(expected_bytes));
  EXPECT_EQ(metric(d, "chunkpipe:kv_pull_failures_total"), 0.0);
  EXPECT_GT(metric(p, "vllm:prefix_cache_hits_total"), 0.0) << "the repeated prompt";
  std::printf("    D computed %.0f prompt tokens for %d requests and pulled %.0f bytes\n",
              metric(d, "vllm:prompt_tokens_total"), d_requests,
              metric(d, "chunkpipe:kv_pull_bytes_total"));
  EXPECT_EQ(await_metric(p, "vllm:kv_cache_usage_perc", 0.0), 0.0) << "P freed on DONE";
  EXPECT_EQ(metric(p, "chunkpipe:kv_leases_expired_total"), 0.0);
  EXPECT_EQ(metric(d, "vllm:kv_cache_usage_perc"), 0.0);
  EXPECT_EQ(await_proxy_idle(proxy), 0);
  EXPECT_EQ(proxy.stop(), 0);
  EXPECT_EQ(p.stop(), 0);
  EXPECT_EQ(d.stop(), 0);
}

TEST_F(PdTest, OutputsMatchColocatedServingOnePrefillerOneDecoder) {
  outputs_match_colocated(1);
}

TEST_F(PdTest, OutputsMatchColocatedServingWithAPipelinedCppPrefiller) {
  outputs_match_colocated(2);
}

// The seed's P layout scaled down: PP=2 x TP=2 with CPP.
TEST_F(PdTest, OutputsMatchColocatedServingWithAPipelinedTensorParallelPrefiller) {
  outputs_match_colocated(2, 2);
}

// The P leg by hand, as the proxy sends it.
json prefill(const ServerProcess& p, const std::string& prompt) {
  json body = complete_body(prompt, 1);
  body["min_tokens"] = 1;
  body["kv_transfer_params"] = {{"do_remote_decode", true}, {"do_remote_prefill", false}};
  return post(p, "/v1/completions", body);
}

// The proxy's two steps by hand: P prefills body's prompt, then D runs body with the
// kv_transfer_params P answered (its status in *status; 0 when P gave none).
json prefill_then_decode(const ServerProcess& p, const ServerProcess& d, const json& body,
                         int* status) {
  const json params = prefill(p, body["prompt"].get<std::string>())["kv_transfer_params"];
  *status = 0;
  if (!params.is_object()) return params;
  json pd = body;
  pd["kv_transfer_params"] = params;
  return post(d, "/v1/completions", pd, status);
}

// The n choices of a request and the prompts of a batch through PD: P prefills each prompt once
// and keeps only the blocks its answer names; on D the choices pull them once (the others share
// the puller's blocks, with or without a prefix cache), a prompt whose blocks P did not keep is
// computed on D, as is one that asks for prompt_logprobs, and nothing is left on either side.
TEST_F(PdTest, ChoicesAndPromptBatchesPullEachPromptOnce) {
  const int kv_p = kv_port_base() + 2;
  ServerProcess colocated(e2e::model_dir(), flags(), "/tmp/chunkpipe_pd_n_colocated.log");
  ServerProcess p(e2e::model_dir(), with(prefiller_flags(kv_p, 1), {"--enable-prefix-caching"}),
                  "/tmp/chunkpipe_pd_n_p.log");
  ServerProcess seed_d(e2e::model_dir(), decoder_flags(kv_p + 4, 1), "/tmp/chunkpipe_pd_n_d1.log");
  ServerProcess cached_d(
      e2e::model_dir(),
      with(flags(), {"--kv-transfer-config", kv_config("kv_consumer", kv_p + 5, 1).dump()}),
      "/tmp/chunkpipe_pd_n_d2.log");
  // Two engines behind one server: a request's choices must all go to the engine that pulls.
  ServerProcess dp_d(e2e::model_dir(),
                     with(decoder_flags(kv_p + 6, 1), {"--data-parallel-size", "2"}),
                     "/tmp/chunkpipe_pd_n_d3.log");
  ASSERT_TRUE(colocated.ready() && p.ready() && seed_d.ready() && cached_d.ready() && dp_d.ready())
      << "see /tmp/chunkpipe_pd_n_*.log";
  // Summed over the engines; a data-parallel engine's counters reach /metrics a moment after
  // its request ends, so a reading waits (bounded) for the value it expects.
  auto total = [](const ServerProcess& s, const std::string& name, double want = -2) {
    double v = e2e::metric_total(s, name);
    for (int i = 0; i < 100 && want != -2 && v != want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      v = e2e::metric_total(s, name);
    }
    return v;
  };
  const std::string prompt = words(60), other = words(45, 100);
  const int64_t prompt_tokens = post(colocated, "/tokenize", {{"prompt", prompt}})["count"];
  const int64_t prompt_bytes =  // all but the last token's, in whole blocks
      ((prompt_tokens - 1 + kBlock - 1) / kBlock) * kLayers * kBlock * kRowBytes;
  for (const ServerProcess* d : {&seed_d, &cached_d, &dp_d}) {
    SCOPED_TRACE(d == &seed_d     ? "decoder without a prefix cache"
                 : d == &cached_d ? "decoder with a prefix cache"
                                  : "decoder with two data-parallel engines");
    const double pulled_before = total(*d, "chunkpipe:kv_pull_bytes_total");
    const double computed_before = total(*d, "vllm:prompt_tokens_total");
    json leg = complete_body(prompt, 1);
    leg["n"] = 3;
    leg["kv_transfer_params"] = {{"do_remote_decode", true}, {"do_remote_prefill", false}};
    const json answer = post(p, "/v1/completions", leg);
    ASSERT_TRUE(answer.contains("kv_transfer_params")) << answer.dump();
    EXPECT_EQ(answer["choices"].size(), 1u) << "P prefills the prompt once for all choices";
    json body = complete_body(prompt, 8);
    body["n"] = 3;
    const json want = post(colocated, "/v1/completions", body);
    body["kv_transfer_params"] = answer["kv_transfer_params"];
    int status = 0;
    const json got = post(*d, "/v1/completions", body, &status);
    ASSERT_EQ(status, 200) << got.dump();
    ASSERT_EQ(got["choices"].size(), 3u);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(got["choices"][i]["text"], want["choices"][i]["text"]) << "choice " << i;
    EXPECT_EQ(total(*d, "chunkpipe:kv_pull_bytes_total", pulled_before + double(prompt_bytes)) -
                  pulled_before,
              double(prompt_bytes))
        << "one pull for three choices";
    const int64_t shared = (prompt_tokens - 1) / kBlock * kBlock;  // the pulled whole blocks
    const double computed = double(1 + 2 * (prompt_tokens - shared));
    EXPECT_EQ(total(*d, "vllm:prompt_tokens_total", computed_before + computed) - computed_before,
              computed)
        << "the first choice computes the last token, the others what follows the blocks";
    EXPECT_EQ(total(*d, "chunkpipe:kv_pull_failures_total"), 0.0);
    EXPECT_EQ(await_metric(p, "vllm:kv_cache_usage_perc", 0.0, 5), 0.0);
    EXPECT_EQ(await_metric(*d, "vllm:kv_cache_usage_perc", 0.0, 5), 0.0);
    EXPECT_EQ(total(*d, "vllm:kv_cache_usage_perc", 0.0), 0.0);
    // A proxy whose client left as the answer ended asks D to release P as well (twice here, so
    // that a DP server's round robin would reach both engines): the engine that ran the
    // request said DONE already, and no second one reaches P.
    for (int i = 0; i < 2; ++i) {
      post(*d, "/v1/kv_transfer/release", {{"kv_transfer_params", answer["kv_transfer_params"]}},
           &status);
      EXPECT_EQ(status, 200);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a DONE would be there by now
    post(p, "/v1/completions", complete_body("a step", 1));  // P reads its counters as it steps
    EXPECT_EQ(await_metric(p, "chunkpipe:kv_late_releases_total", 1.0, 1), 0.0);
  }
  // A batch of two prompts: P's answer names the first one's blocks and frees the second's.
  json leg = complete_body(prompt, 1);
  leg["prompt"] = {prompt, other};
  leg["kv_transfer_params"] = {{"do_remote_decode", true}, {"do_remote_prefill", false}};
  const json answer = post(p, "/v1/completions", leg);
  ASSERT_TRUE(answer.contains("kv_transfer_params")) << answer.dump();
  EXPECT_EQ(answer["choices"].size(), 2u);
  json body = complete_body(prompt, 8);
  body["prompt"] = {prompt, other};
  const json want = post(colocated, "/v1/completions", body);
  body["kv_transfer_params"] = answer["kv_transfer_params"];
  const double pulled_before = metric(seed_d, "chunkpipe:kv_pull_bytes_total");
  int status = 0;
  const json got = post(seed_d, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << got.dump();
  ASSERT_EQ(got["choices"].size(), 2u);
  EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]);
  EXPECT_EQ(got["choices"][1]["text"], want["choices"][1]["text"]) << "computed on D";
  EXPECT_EQ(metric(seed_d, "chunkpipe:kv_pull_bytes_total") - pulled_before, double(prompt_bytes));
  EXPECT_EQ(await_metric(p, "vllm:kv_cache_usage_perc", 0.0, 5), 0.0);
  EXPECT_EQ(metric(p, "chunkpipe:kv_leases_expired_total"), 0.0);
  EXPECT_EQ(metric(seed_d, "vllm:kv_cache_usage_perc"), 0.0);

  // prompt_logprobs need every prompt position's logits: D computes the prompt instead of
  // pulling it (the logprobs were all null) and releases P.
  leg = complete_body(prompt, 1);
  leg["prompt_logprobs"] = 1;
  leg["kv_transfer_params"] = {{"do_remote_decode", true}, {"do_remote_prefill", false}};
  const json with_logprobs = post(p, "/v1/completions", leg);
  body = complete_body(prompt, 4);
  body["prompt_logprobs"] = 1;
  const json want_logprobs = post(colocated, "/v1/completions", body);
  body["kv_transfer_params"] = with_logprobs["kv_transfer_params"];
  const double pulled = metric(seed_d, "chunkpipe:kv_pull_bytes_total");
  const json got_logprobs = post(seed_d, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << got_logprobs.dump();
  ASSERT_TRUE(want_logprobs["choices"][0]["prompt_logprobs"].is_array());
  EXPECT_EQ(got_logprobs["choices"][0]["prompt_logprobs"],
            want_logprobs["choices"][0]["prompt_logprobs"]);
  EXPECT_EQ(got_logprobs["choices"][0]["text"], want_logprobs["choices"][0]["text"]);
  EXPECT_EQ(metric(seed_d, "chunkpipe:kv_pull_bytes_total"), pulled);
  EXPECT_EQ(await_metric(p, "vllm:kv_cache_usage_perc", 0.0, 5), 0.0);
}

// The seed runs MTP on both sides: D's MTP layer reads the prompt's KV of P's MTP layer. With
// MTP on both the outputs equal colocated greedy decoding; a prefiller without it gets a clear
// error naming the flag, P is released, and D keeps serving.
TEST_F(PdTest, MtpDecoderPullsTheMtpLayerFromAnMtpPrefiller) {
  const int kv_base = kv_port_base();
  const std::vector<std::string> mtp = {"--speculative-config",
                                        R"({"method": "mtp", "num_speculative_tokens": 1})"};
  ServerProcess colocated(e2e::model_dir(), flags(), "/tmp/chunkpipe_pd_mtp_colocated.log");
  ServerProcess p_mtp(e2e::model_dir(), with(prefiller_flags(kv_base + 1, 1), mtp),
                      "/tmp/chunkpipe_pd_mtp_p.log");
  ServerProcess p_plain(e2e::model_dir(), prefiller_flags(kv_base + 3, 1),
                        "/tmp/chunkpipe_pd_mtp_plain_p.log");
  ServerProcess d(e2e::model_dir(), with(decoder_flags(kv_base + 6, 1), mtp),
                  "/tmp/chunkpipe_pd_mtp_d.log");
  ASSERT_TRUE(colocated.ready() && p_mtp.ready() && p_plain.ready() && d.ready())
      << "see /tmp/chunkpipe_pd_mtp_*.log";
  const json body = complete_body(words(40), 12);
  const json want = post(colocated, "/v1/completions", body);
  int status = 0;
  json got = prefill_then_decode(p_mtp, d, body, &status);
  ASSERT_EQ(status, 200) << got.dump();
  EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]);
  const int64_t n = want["usage"]["prompt_tokens"].get<int64_t>();
  EXPECT_EQ(metric(d, "chunkpipe:kv_pull_bytes_total"),
            double(((n - 1 + kBlock - 1) / kBlock) * (kLayers + 1) * kBlock * kRowBytes))
      << "the main layers and the MTP layer";
  EXPECT_EQ(await_metric(p_mtp, "vllm:kv_cache_usage_perc", 0.0, 5), 0.0);

  got = prefill_then_decode(p_plain, d, body, &status);
  EXPECT_EQ(status, 500) << got.dump();
  EXPECT_NE(got.dump().find("--speculative-config"), std::string::npos) << got.dump();
  EXPECT_EQ(await_metric(p_plain, "vllm:kv_cache_usage_perc", 0.0, 5), 0.0);
  got = post(d, "/v1/completions", body, &status);
  EXPECT_EQ(status, 200) << "D keeps serving: " << got.dump();
  EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]);
  EXPECT_EQ(metric(d, "vllm:kv_cache_usage_perc"), 0.0);
}

// --kv-cache-dtype bfloat16 on both sides: the pull moves half the f32 bytes. An f32 prefiller
// (the default) against that bf16 decoder: its blocks are twice D's, so the pull fails with an
// error that names both sizes and the flag, P is released, and D keeps serving.
TEST_F(PdTest, APrefillerWithAnotherCacheDtypeIsRefusedByName) {
  const int kv_base = kv_port_base();
  ServerProcess p_bf16(e2e::model_dir(),
                       with(prefiller_flags(kv_base + 1, 1), {"--kv-cache-dtype", "bfloat16"}),
                       "/tmp/chunkpipe_pd_dtype_p.log");
  ServerProcess p_f32(e2e::model_dir(), prefiller_flags(kv_base + 3, 1),
                      "/tmp/chunkpipe_pd_dtype_p32.log");
  ServerProcess d(e2e::model_dir(),
                  with(decoder_flags(kv_base + 6, 1), {"--kv-cache-dtype", "bfloat16"}),
                  "/tmp/chunkpipe_pd_dtype_d.log");
  ASSERT_TRUE(p_bf16.ready() && p_f32.ready() && d.ready()) << "see /tmp/chunkpipe_pd_dtype_*.log";
  const json body = complete_body(words(40), 8);
  int status = 0;
  {
    const json got = prefill_then_decode(p_bf16, d, body, &status);
    ASSERT_EQ(status, 200) << got.dump();
    const int64_t n = got["usage"]["prompt_tokens"].get<int64_t>();
    EXPECT_EQ(metric(d, "chunkpipe:kv_pull_bytes_total"),
              double(((n - 1 + kBlock - 1) / kBlock) * kLayers * kBlock * kRowBytes / 2))
        << "bf16 blocks: half the f32 bytes";
    EXPECT_EQ(await_metric(p_bf16, "vllm:kv_cache_usage_perc", 0.0, 5), 0.0);
  }
  json got = prefill_then_decode(p_f32, d, body, &status);
  EXPECT_EQ(status, 500) << got.dump();
  EXPECT_NE(got.dump().find("values of 4 bytes do not match this decoder's"), std::string::npos)
      << got.dump();
  EXPECT_NE(got.dump().find("--kv-cache-dtype"), std::string::npos) << got.dump();
  EXPECT_EQ(await_metric(p_f32, "vllm:kv_cache_usage_perc", 0.0, 5), 0.0);
  got = post(d, "/v1/completions", body, &status);
  EXPECT_EQ(status, 200) << "D keeps serving: " << got.dump();
  EXPECT_EQ(metric(d, "vllm:kv_cache_usage_perc"), 0.0);
}

// Sends SIGSTOP and waits until every thread of `pid` has stopped: a thread stops only when it
// next runs, which on a loaded machine can be long enough for it to serve a request first.
bool freeze(pid_t pid) {
  if (kill(pid, SIGSTOP) != 0) return false;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (int i = 0; i < 500; ++i) {
    bool all_stopped = true;
    for (const auto& t : std::filesystem::directory_iterator(tasks)) {
      std::ifstream stat(t.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const size_t close = line.rfind(')');
      const char state =
          close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
      all_stopped &= state == 'T' || state == 't';
    }
    if (all_stopped) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST_F(PdTest, LeaseExpiresWhenTheDecoderDiesWithTheRequest) {
  const int kv_p = kv_port_base() + 1;
  setenv("VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT", "2", 1);
  ServerProcess p(e2e::model_dir(), prefiller_flags(kv_p, 1), "/tmp/chunkpipe_pd_lease_p.log");
  unsetenv("VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT");
  ServerProcess d(e2e::model_dir(), decoder_flags(kv_p + 4, 1), "/tmp/chunkpipe_pd_lease_d.log");
  ASSERT_TRUE(p.ready() && d.ready());
  const json answer = prefill(p, words(60));
  ASSERT_TRUE(answer.contains("kv_transfer_params")) << answer.dump();
  EXPECT_GT(metric(p, "vllm:kv_cache_usage_perc"), 0.0) << "P holds the blocks for D";
  // D takes the request but dies before it reads: frozen, handed the request, killed.
  ASSERT_TRUE(freeze(d.pid())) << "D did not stop";
  std::thread leg([&] {
    json body = complete_body(words(60));
    body["kv_transfer_params"] = answer["kv_transfer_params"];
    auto c = d.client(3);
    c.Post("/v1/completions", body.dump(), "application/json");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(d.pid(), SIGKILL);
  leg.join();
  EXPECT_EQ(await_metric(p, "vllm:kv_cache_usage_perc", 0.0, 8), 0.0) << "within the lease";
  EXPECT_EQ(metric(p, "chunkpipe:kv_leases_expired_total"), 1.0);
  // P keeps serving.
  EXPECT_TRUE(prefill(p, words(10)).contains("kv_transfer_params"));
}

TEST_F(PdTest, PrefillerKilledBeforeTheReadRecomputesOrFailsCleanly) {
  const int kv_p = kv_port_base() + 2;
  ServerProcess colocated(e2e::model_dir(), flags(), "/tmp/chunkpipe_pd_kill_c.log");
  ServerProcess recompute(e2e::model_dir(), decoder_flags(kv_p + 4, 1, "recompute"),
                          "/tmp/chunkpipe_pd_kill_d1.log");
  ServerProcess strict(e2e::model_dir(), decoder_flags(kv_p + 5, 1, "fail"),
                       "/tmp/chunkpipe_pd_kill_d2.log");
  json params;
  {
    ServerProcess p(e2e::model_dir(), prefiller_flags(kv_p, 1), "/tmp/chunkpipe_pd_kill_p.log");
    ASSERT_TRUE(p.ready() && colocated.ready() && recompute.ready() && strict.ready());
    params = prefill(p, words(60))["kv_transfer_params"];
    ASSERT_TRUE(params.is_object());
    kill(p.pid(), SIGKILL);
    p.wait_exit(10);
  }
  json body = complete_body(words(60));
  body["kv_transfer_params"] = params;
  int status = 0;
  const json got = post(recompute, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << got.dump();
  EXPECT_EQ(got["choices"][0]["text"],
            post(colocated, "/v1/completions", complete_body(words(60)))["choices"][0]["text"])
      << "recomputed locally, never decoded over missing KV";
  EXPECT_EQ(metric(recompute, "chunkpipe:kv_pull_failures_total"), 1.0);
  const json failed = post(strict, "/v1/completions", body, &status);
  EXPECT_NE(status, 200) << failed.dump();
  EXPECT_NE(failed.dump().find("could not be loaded"), std::string::npos) << failed.dump();
  EXPECT_EQ(metric(strict, "vllm:kv_cache_usage_perc"), 0.0);
  // Both keep serving.
  EXPECT_EQ(post(strict, "/v1/completions", complete_body("hello"), &status).is_object(), true);
  EXPECT_EQ(status, 200);
}

// P dies in the middle of a read: over TCP, UCX serves a read from P's side, so a frozen P
// holds the read open (D already has P's metadata from an earlier pull); then P is killed.
// D's read fails on the broken connection, and D recomputes the prompt itself. Both use TCP
// only (UCX_TLS): on one host UCX could also read P's memory through shared memory (cma),
// which a frozen P does not hold up.
TEST_F(PdTest, PrefillerKilledMidReadIsSurvivedByTheDecoder) {
  const int kv_p = kv_port_base() + 4;
  ServerProcess colocated(e2e::model_dir(), flags(), "/tmp/chunkpipe_pd_midread_c.log");
  setenv("ASCEND_TRANSFER_TIMEOUT", "20000", 1);
  setenv("UCX_TLS", "tcp", 1);
  ServerProcess d(e2e::model_dir(), decoder_flags(kv_p + 4, 1, "recompute"),
                  "/tmp/chunkpipe_pd_midread_d.log");
  unsetenv("ASCEND_TRANSFER_TIMEOUT");
  ServerProcess p(e2e::model_dir(), prefiller_flags(kv_p, 1), "/tmp/chunkpipe_pd_midread_p.log");
  unsetenv("UCX_TLS");
  ASSERT_TRUE(p.ready() && d.ready() && colocated.ready());
  json body = complete_body(words(300));
  body["kv_transfer_params"] = prefill(p, words(300))["kv_transfer_params"];
  int status = 0;
  ASSERT_EQ(post(d, "/v1/completions", body, &status)["choices"][0]["finish_reason"], "length");
  const json second = prefill(p, words(300));
  ASSERT_TRUE(second.contains("kv_transfer_params") && second["kv_transfer_params"].is_object())
      << "P kept no blocks for the second prefill: " << second.dump();
  body["kv_transfer_params"] = second["kv_transfer_params"];
  ASSERT_TRUE(freeze(p.pid())) << "P did not stop";
  json got;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread leg([&] { got = post(d, "/v1/completions", body, &status); });
  // The read starts once D has scheduled the request (later on a loaded machine), then waits.
  double in_flight = 0;
  for (int i = 0; i < 100 && in_flight == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    in_flight = metric(d, "chunkpipe:kv_pulls_in_flight");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(metric(d, "chunkpipe:kv_pulls_in_flight"), 1.0)
      << "the read waits on the frozen P (in flight: " << in_flight
      << "; pulled: " << metric(d, "chunkpipe:kv_pull_blocks_total") << " blocks)";
  kill(p.pid(), SIGKILL);
  kill(p.pid(), SIGCONT);
  leg.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(status, 200) << got.dump();
  EXPECT_EQ(got["choices"][0]["text"],
            post(colocated, "/v1/completions", complete_body(words(300)))["choices"][0]["text"]);
  EXPECT_EQ(metric(d, "chunkpipe:kv_pull_failures_total"), 1.0);
  EXPECT_LT(seconds, 15.0) << "the broken connection ends the read, not the 20 s timeout";
  std::printf("    P killed mid-read: D recomputed and answered in %.1f s\n", seconds);
  EXPECT_EQ(metric(d, "vllm:kv_cache_usage_perc"), 0.0);
}

TEST_F(PdTest, RefusedOrAbandonedRequestsReleaseThePrefillerAtOnce) {
  const int kv_p = kv_port_base() + 3;
  ServerProcess p(e2e::model_dir(), prefiller_flags(kv_p, 1), "/tmp/chunkpipe_pd_refuse_p.log");
  ServerProcess d(e2e::model_dir(), with(decoder_flags(kv_p + 4, 1), {"--max-model-len", "256"}),
                  "/tmp/chunkpipe_pd_refuse_d.log");
  ASSERT_TRUE(p.ready() && d.ready());
  // D refuses a prompt longer than its max_model_len (P's is longer): P frees at once, not
  // after the 480 s lease.
  json params = prefill(p, words(200))["kv_transfer_params"];
  ASSERT_TRUE(params.is_object());
  json body = complete_body(words(200));
  body["kv_transfer_params"] = params;
  int status = 0;
  const json refused = post(d, "/v1/completions", body, &status);
  EXPECT_EQ(status, 400) << refused.dump();
  EXPECT_EQ(await_metric(p, "vllm:kv_cache_usage_perc", 0.0, 5), 0.0);
  // A proxy whose client left between the legs hands the params to a decoder to release.
  params = prefill(p, words(50))["kv_transfer_params"];
  EXPECT_GT(metric(p, "vllm:kv_cache_usage_perc"), 0.0);
  post(d, "/v1/kv_transfer/release", {{"kv_transfer_params", params}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(await_metric(p, "vllm:kv_cache_usage_perc", 0.0, 5), 0.0);
  EXPECT_EQ(metric(p, "chunkpipe:kv_leases_expired_total"), 0.0);
}

TEST_F(PdTest, ProxyUnderLoadWithVanishingClientsLeaksNothing) {
  const int kv_p = kv_port_base() + 5;
  ServerProcess p(e2e::model_dir(), prefiller_flags(kv_p, 1), "/tmp/chunkpipe_pd_load_p.log");
  ServerProcess d1(e2e::model_dir(), decoder_flags(kv_p + 1, 1), "/tmp/chunkpipe_pd_load_d1.log");
  ServerProcess d2(e2e::model_dir(), decoder_flags(kv_p + 2, 1), "/tmp/chunkpipe_pd_load_d2.log");
  ASSERT_TRUE(p.ready() && d1.ready() && d2.ready());
  // Started with a soft limit of 48 descriptors, below what 32 clients need there (a client's
  // socket and a backend's each): the proxy must raise it to its hard limit, as vLLM does.
  std::optional<e2e::ChildFileLimit> low_limit(std::in_place, 48);
  ServerProcess proxy({"proxy", "--prefiller-hosts", "127.0.0.1", "--prefiller-ports",
                       std::to_string(p.port()), "--decoder-hosts", "127.0.0.1", "127.0.0.1",
                       "--decoder-ports", std::to_string(d1.port()), std::to_string(d2.port())},
                      "/tmp/chunkpipe_pd_load_proxy.log", "/healthcheck");
  low_limit.reset();
  ASSERT_TRUE(proxy.ready());
  std::atomic<int> next{0}, ok{0}, dropped{0};
  std::mutex failures_mu;
  std::vector<std::string> failures;  // what a client got instead of a 200 (for the message)
  std::vector<std::thread> clients;
  for (int c = 0; c < 32; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(c);
      for (int i; (i = next++) < 200;) {
        json body = complete_body(words(10 + i % 50, i), 12);
        body["stream"] = i % 2 == 0;
        e2e::RawConnection conn(proxy.port());
        const bool sent =
            conn.connected() && conn.send(e2e::http_post("/v1/completions", body.dump()));
        if (rng() % 4 == 0) {  // a client that leaves at a random moment
          std::string some;
          conn.read_for(static_cast<int>(rng() % 200), &some);
          conn.reset();
          ++dropped;
          continue;
        }
        const std::string reply = conn.read_until(i % 2 == 0 ? "[DONE]" : "\"usage\"", 120000);
        if (reply.find("200 OK") != std::string::npos) {
          ++ok;
        } else {
          std::lock_guard<std::mutex> lock(failures_mu);
          failures.push_back("request " + std::to_string(i) + (body["stream"] ? " (stream)" : "") +
                             (sent ? "" : " (not sent)") + ": " + reply.substr(0, 400));
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  std::string failed;
  for (const std::string& f : failures) failed += "\n  " + f;
  EXPECT_EQ(ok + dropped, 200) << "replies that were not 200:" << failed;
  EXPECT_GT(ok.load(), 100);
  for (const ServerProcess* s : {&p, &d1, &d2})
    EXPECT_EQ(await_metric(*s, "vllm:kv_cache_usage_perc", 0.0, 15), 0.0)
        << (s == &p ? "P" : "a decoder") << " still holds blocks";
  EXPECT_EQ(await_proxy_idle(proxy), 0) << "the proxy's accounting drains too";
  std::printf("    200 requests at concurrency 32: %d answered, %d clients vanished\n", ok.load(),
              dropped.load());
}

// The seed's deployment scaled down (P with PP=2, CPP and MTP; a decoder without a prefix cache,
// as the seed's, and one with; the proxy) under random requests with every option, n and prompt
// batches included, from clients that also leave: no answer breaks the rules of
// random_requests.h, and afterwards nothing runs, no block is held and no lease had to expire.
TEST_F(PdTest, RandomRequestsThroughTheProxyLeaveNothingBehind) {
  const int kv_p = kv_port_base() + 1;
  const std::vector<std::string> mtp = {"--speculative-config",
                                        R"({"method": "mtp", "num_speculative_tokens": 1})"};
  ServerProcess p(e2e::model_dir(),
                  with(with(prefiller_flags(kv_p, 2), mtp),
                       {"--enable-prefix-caching", "--additional-config",
                        R"({"scheduler_config": {"profiling_chunk_config": {"enabled": true}}})"}),
                  "/tmp/chunkpipe_pd_random_p.log");
  ServerProcess d1(e2e::model_dir(), with(decoder_flags(kv_p + 3, 2), mtp),
                   "/tmp/chunkpipe_pd_random_d1.log");
  ServerProcess d2(e2e::model_dir(),
                   with(with(flags(), mtp),
                        {"--kv-transfer-config", kv_config("kv_consumer", kv_p + 4, 2).dump()}),
                   "/tmp/chunkpipe_pd_random_d2.log");
  ASSERT_TRUE(p.ready() && d1.ready() && d2.ready()) << "see /tmp/chunkpipe_pd_random_*.log";
  ServerProcess proxy({"proxy", "--prefiller-hosts", "127.0.0.1", "--prefiller-ports",
                       std::to_string(p.port()), "--decoder-hosts", "127.0.0.1", "127.0.0.1",
                       "--decoder-ports", std::to_string(d1.port()), std::to_string(d2.port())},
                      "/tmp/chunkpipe_pd_random_proxy.log", "/healthcheck");
  ASSERT_TRUE(proxy.ready());
  e2e::expect_random_requests_answered_well(proxy.port(), /*seed=*/1000);
  for (const ServerProcess* s : {&p, &d1, &d2}) {
    EXPECT_EQ(await_metric(*s, "vllm:kv_cache_usage_perc", 0.0, 15), 0.0);
    EXPECT_EQ(metric(*s, "vllm:num_requests_running"), 0.0);
    EXPECT_EQ(metric(*s, "vllm:num_requests_waiting"), 0.0);
  }
  // A client that leaves while D pulls has the proxy ask D to release P as well: D leaves that
  // to its request, so P gets one DONE per prompt and no pull reads freed blocks.
  for (const ServerProcess* d : {&d1, &d2})
    EXPECT_EQ(metric(*d, "chunkpipe:kv_pull_failures_total"), 0.0);
  post(p, "/v1/completions", complete_body("a step", 1));  // P reads its counters as it steps
  EXPECT_EQ(metric(p, "chunkpipe:kv_late_releases_total"), 0.0);
  EXPECT_EQ(metric(p, "chunkpipe:kv_leases_expired_total"), 0.0);
  EXPECT_EQ(await_proxy_idle(proxy), 0);
}

// A backend that answers with wrong types, odd shapes or nothing at all (a bug, another
// server, a version skew) costs only that request: the proxy reads every backend field by its
// type, a stream always ends, and the proxy keeps serving. Before, a string where it expected
// a number threw in the request's thread and ended the proxy, and so did "stream": "true" in
// the client's body, and a body nested 300,000 deep.
TEST_F(PdTest, ProxySurvivesMalformedBodiesAndAnswers) {
  // One fake backend plays P and D; the prompt names the answer. "recompute" answers the first
  // decode leg with a hand-back, the next with a chat message of the wrong type.
  std::atomic<int> recompute_round{0};
  httplib::Server backend;
  backend.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"object":"list","data":[]})", "application/json");
  });
  auto answer = [&](const httplib::Request& req, httplib::Response& res) {
    const json body = json::parse(req.body, nullptr, false);
    // The chat request's second round is a completion of token ids.
    const bool named = body.contains("prompt") && body["prompt"].is_string();
    const std::string c = named ? body["prompt"].get<std::string>() : "recompute";
    const json kv = body.value("kv_transfer_params", json::object());
    if (kv.is_object() && kv.value("do_remote_decode", false)) {  // the prefill leg
      res.set_content(
          R"({"choices":[{"text":"x"}],"usage":{"prompt_tokens":"many"},)"
          R"("kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":"none"}})",
          "application/json");
      return;
    }
    std::string out;
    if (c == "bad usage") {
      out = R"({"choices":[{"text":"ok","finish_reason":"length"}],)"
            R"("usage":{"prompt_tokens":null,"completion_tokens":"2"}})";
    } else if (c == "choices string") {
      out = R"({"choices":"zzz","usage":"none"})";
    } else if (c == "bad ids") {
      out = R"({"choices":[{"text":"t","token_ids":["a"],"prompt_token_ids":[1.5]}],)"
            R"("usage":{"completion_tokens":[]}})";
    } else if (c == "deep answer") {
      out = R"({"choices":)" + std::string(300000, '[') + std::string(300000, ']') + "}";
    } else if (c == "stream odd") {
      out =
          "data: {\"choices\":[{\"text\":5,\"token_ids\":\"x\"}],"
          "\"usage\":{\"completion_tokens\":\"3\",\"prompt_tokens\":null}}\n\ndata: [DONE]\n\n";
    } else if (c == "stream empty") {
      out = "data: [DONE]\n\n";
    } else if (c == "stream handed back without ids") {
      out =
          "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"stop\","
          "\"stop_reason\":\"recomputed\"}]}\n\ndata: [DONE]\n\n";
    } else if (c == "recompute" && recompute_round++ % 2 == 0) {
      out = R"({"choices":[{"message":{"content":"a"},"finish_reason":"stop",)"
            R"("stop_reason":"recomputed","token_ids":[3]}],"prompt_token_ids":[1,2]})";
    } else {
      out = R"({"choices":[{"message":"oops","text":7}],"usage":{"completion_tokens":null}})";
    }
    res.set_content(out, out.rfind("data:", 0) == 0 ? "text/event-stream" : "application/json");
  };
  backend.Post("/v1/completions", answer);
  backend.Post("/v1/chat/completions", answer);
  const int port = backend.bind_to_any_port("127.0.0.1");
  struct Serving {  // stops and joins however the test ends
    httplib::Server& backend;
    std::thread thread{[this] { backend.listen_after_bind(); }};
    ~Serving() {
      backend.stop();
      thread.join();
    }
  } serving{backend};
  ServerProcess proxy(
      {"proxy", "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", std::to_string(port),
       "--decoder-hosts", "127.0.0.1", "--decoder-ports", std::to_string(port)},
      "/tmp/chunkpipe_pd_fake_backend_proxy.log", "/healthcheck");
  ASSERT_TRUE(proxy.ready());
  const std::vector<std::pair<json, bool>> requests = {
      {{{"prompt", "bad usage"}, {"stream", "false"}, {"max_tokens", "4"}}, false},
      {{{"prompt", "choices string"}, {"return_token_ids", "yes"}}, false},
      {{{"prompt", "bad ids"}, {"return_token_ids", true}}, false},
      {{{"prompt", "deep answer"}}, false},
      {{{"prompt", "stream odd"}, {"stream", "true"}, {"stream_options", {{"include_usage", 1}}}},
       true},
      {{{"prompt", "stream empty"}, {"stream", 1}}, true},
      {{{"prompt", "stream handed back without ids"}, {"stream", true}}, true},
      {{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 5}}, false},
  };
  for (const auto& [body, streamed] : requests) {
    const bool chat = body.contains("messages");
    auto r = proxy.client(20).Post(chat ? "/v1/chat/completions" : "/v1/completions", body.dump(),
                                   "application/json");
    ASSERT_TRUE(r) << "no answer to " << body.dump();
    if (streamed && r->status == 200) {  // else the stream never started: a whole error
      EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos)
          << body.dump() << " -> " << r->body;
    } else {
      EXPECT_TRUE(json::parse(r->body, nullptr, false).is_object())
          << body.dump() << " -> " << r->body;
    }
  }
  EXPECT_EQ(recompute_round.load(), 2) << "the chat request was prefilled again after a hand-back";
  // A client's body nested deeper than the bound gets a 400 (copying it overflowed the stack).
  const std::string deep =
      R"({"prompt":"x","extra":)" + std::string(300000, '[') + std::string(300000, ']') + "}";
  auto r = proxy.client(20).Post("/v1/completions", deep, "application/json");
  ASSERT_TRUE(r) << "the proxy died";
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("deeper than 64"), std::string::npos) << r->body;
  EXPECT_EQ(proxy.client().Get("/healthcheck")->status, 200);
  EXPECT_EQ(await_proxy_idle(proxy), 0);
  EXPECT_EQ(proxy.stop(), 0) << "the proxy ran to its SIGTERM";
}

// SIGTERM to the proxy mid-stream, as serve handles it: a request that ends within the drain
// timeout (1 s, more under a sanitizer) completes, a longer stream gets an error event, [DONE] and
// the chunked terminator, the proxy exits 0, and P and D are left with nothing running and no block
// held.
TEST_F(PdTest, ProxySigtermDrainsThenEndsStreamsCleanly) {
  const int kv_p = kv_port_base() + 2;
  ServerProcess p(e2e::model_dir(), prefiller_flags(kv_p, 1), "/tmp/chunkpipe_pd_term_p.log");
  ServerProcess d(e2e::model_dir(), decoder_flags(kv_p + 4, 1), "/tmp/chunkpipe_pd_term_d.log");
  ASSERT_TRUE(p.ready() && d.ready());
  ServerProcess proxy(
      {"proxy", "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", std::to_string(p.port()),
       "--decoder-hosts", "127.0.0.1", "--decoder-ports", std::to_string(d.port()),
       "--shutdown-drain-timeout", std::to_string(e2e::sanitizer_slowdown())},
      "/tmp/chunkpipe_pd_term_proxy.log", "/healthcheck");
  ASSERT_TRUE(proxy.ready());
  auto start = [&](int max_tokens, bool stream) {
    json body = complete_body(words(20), max_tokens);
    body["stream"] = stream;
    auto c = std::make_unique<e2e::RawConnection>(proxy.port());
    c->send(e2e::http_post("/v1/completions", body.dump(), "Connection: close\r\n"));
    return c;
  };
  std::vector<std::unique_ptr<e2e::RawConnection>> long_streams;
  for (int i = 0; i < 2; ++i) {
    long_streams.push_back(start(3000, true));
    long_streams.back()->read_until("data: {", 30000);
  }
  auto short_one = start(8, false);
  // SIGTERM only once the proxy has the short request (or already answered it): one still in
  // the listen backlog is refused with the socket, which is not what this test is about.
  std::string whole;
  auto in_flight = [&] {
    return json::parse(proxy.client().Get("/healthcheck")->body)["request_num"].get<int64_t>();
  };
  for (int i = 0; i < 500 && in_flight() < 3 && whole.empty(); ++i) short_one->read_for(10, &whole);
  ASSERT_EQ(kill(proxy.pid(), SIGTERM), 0);
  whole += short_one->read_until("", 20000);
  EXPECT_NE(whole.find("200 OK"), std::string::npos) << whole.substr(0, 300);
  EXPECT_NE(whole.find("\"usage\""), std::string::npos) << "finished within the drain";
  for (auto& c : long_streams) {
    bool closed = false;
    const std::string tail = c->read_until("\r\n0\r\n\r\n", 20000, &closed);
    EXPECT_NE(tail.find("The proxy is shutting down"), std::string::npos) << tail.substr(0, 300);
    const size_t done = tail.rfind("data: [DONE]");
    ASSERT_NE(done, std::string::npos) << tail.substr(0, 300);
    EXPECT_NE(tail.find("\r\n0\r\n\r\n", done), std::string::npos) << "the chunked terminator";
  }
  EXPECT_EQ(proxy.wait_exit(20), 0);
  EXPECT_FALSE(e2e::RawConnection(proxy.port()).connected()) << "nothing listens any more";
  EXPECT_EQ(await_metric(d, "vllm:num_requests_running", 0.0), 0.0);
  EXPECT_EQ(await_metric(d, "vllm:kv_cache_usage_perc", 0.0), 0.0);
  EXPECT_EQ(await_metric(p, "vllm:kv_cache_usage_perc", 0.0), 0.0);
}

// upstream's /instances/add and /instances/remove: an added decoder serves once it answers
// GET /v1/models, one that never answers is dropped after --max-waiting-retries probes, a
// removed one takes no more requests, and bad bodies get a 400 or 404 that names the problem.
TEST_F(PdTest, ProxyInstancesAreAddedProbedAndRemoved) {
  const int kv_p = kv_port_base() + 3;
  ServerProcess p(e2e::model_dir(), prefiller_flags(kv_p, 1), "/tmp/chunkpipe_pd_inst_p.log");
  ServerProcess d1(e2e::model_dir(), decoder_flags(kv_p + 4, 1), "/tmp/chunkpipe_pd_inst_d1.log");
  ServerProcess d2(e2e::model_dir(), decoder_flags(kv_p + 5, 1), "/tmp/chunkpipe_pd_inst_d2.log");
  ASSERT_TRUE(p.ready() && d1.ready() && d2.ready());
  ServerProcess proxy(
      {"proxy", "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", std::to_string(p.port()),
       "--decoder-hosts", "127.0.0.1", "--decoder-ports", std::to_string(d1.port()),
       "--max-waiting-retries", "2", "--waiting-retry-interval", "0.2"},
      "/tmp/chunkpipe_pd_inst_proxy.log", "/healthcheck");
  ASSERT_TRUE(proxy.ready());
  auto decoders = [&] {  // instance -> ready
    std::map<std::string, bool> out;
    const json h = json::parse(proxy.client().Get("/healthcheck")->body);
    for (const json& i : h["instances"]["decode"])
      out[i["instance"].get<std::string>()] = i["ready"].get<bool>();
    return out;
  };
  auto wait_for = [&](const std::map<std::string, bool>& want) {
    for (int i = 0; i < 100 && decoders() != want; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return decoders();
  };
  const std::string k1 = "127.0.0.1:" + std::to_string(d1.port());
  const std::string k2 = "127.0.0.1:" + std::to_string(d2.port());
  const std::string never = "127.0.0.1:" + std::to_string(e2e::free_port());
  int status = 0;
  const json added =
      post(proxy, "/instances/add", {{"type", "decode"}, {"instances", {k2, never}}}, &status);
  EXPECT_EQ(status, 200) << added.dump();
  EXPECT_EQ(added["added"], json({k2, never}));
  EXPECT_EQ(wait_for({{k1, true}, {k2, true}}),
            (std::map<std::string, bool>{{k1, true}, {k2, true}}))
      << "d2 answered its probe; the silent one was dropped after two";
  post(proxy, "/instances/remove", {{"type", "decode"}, {"instances", k1}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(decoders(), (std::map<std::string, bool>{{k2, true}}));
  auto served_by_d2 = [&] { return std::max(0.0, metric_total(d2, "vllm:request_success_total")); };
  const double d2_before = served_by_d2();
  const json got = post(proxy, "/v1/completions", complete_body(words(20)), &status);
  EXPECT_EQ(status, 200) << got.dump();
  for (int i = 0; i < 40 && served_by_d2() < d2_before + 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(served_by_d2(), d2_before + 1) << "the one decoder left served it";
  for (const auto& [body, want] : std::vector<std::pair<json, int>>{
           {{{"type", "encode"}, {"instances", k1}}, 400},
           {{{"instances", k1}}, 400},
           {{{"type", "decode"}, {"instances", json::array()}}, 400},
           {{{"type", "decode"}, {"instances", "127.0.0.1"}}, 400},
           {{{"type", "decode"}, {"instances", "127.0.0.1:80abc"}}, 400},
           {{{"type", "decode"}, {"instances", "127.0.0.1:70000"}}, 400},
           {{{"type", "decode"}, {"instances", ":8000"}}, 400},
           {{{"type", "decode"}, {"instances", {5}}}, 400},
           {{{"type", "decode"}, {"instances", k1}}, 404}}) {  // already removed
    const json answer = post(proxy, "/instances/remove", body, &status);
    EXPECT_EQ(status, want) << body.dump();
    EXPECT_TRUE(answer.contains("error")) << answer.dump();
  }
  EXPECT_EQ(decoders(), (std::map<std::string, bool>{{k2, true}})) << "no bad body changed them";
}

// Where a container's pids.max stops the proxy from starting a thread for a request, that
// request gets a 503 that says why, the others their answers, and the proxy keeps serving. It
// counts every refused request out: SIGTERM ends it within its drain, not after a 10 s wait
// for requests that never ran.
TEST_F(PdTest, ProxyOutOfThreadsRefusesWithA503AndKeepsServing) {
  e2e::PidsLimit limit("chunkpipe_pd_pids_" + std::to_string(getpid()));
  if (!limit.ok()) GTEST_SKIP() << "no pids cgroup can be made here (needs root)";
  const int kv_p = kv_port_base() + 7;
  ServerProcess p(e2e::model_dir(), prefiller_flags(kv_p, 1), "/tmp/chunkpipe_pd_pids_p.log");
  ServerProcess d(e2e::model_dir(), decoder_flags(kv_p + 4, 1), "/tmp/chunkpipe_pd_pids_d.log");
  ASSERT_TRUE(p.ready() && d.ready());
  ServerProcess proxy({"proxy", "--prefiller-hosts", "127.0.0.1", "--prefiller-ports",
                       std::to_string(p.port()), "--decoder-hosts", "127.0.0.1", "--decoder-ports",
                       std::to_string(d.port()), "--shutdown-drain-timeout", "1"},
                      "/tmp/chunkpipe_pd_pids_proxy.log", "/healthcheck");
  ASSERT_TRUE(proxy.ready());
  ASSERT_TRUE(limit.confine(proxy.pid(), 2)) << "two threads beyond the proxy's own";
  std::vector<int> statuses(24, 0);
  std::vector<std::string> bodies(statuses.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < statuses.size(); ++i)
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", proxy.port());
      c.set_read_timeout(60, 0);
      auto r = c.Post("/v1/completions", complete_body(words(30, int(i)), 40).dump(),
                      "application/json");
      statuses[i] = r ? r->status : -1;
      if (r) bodies[i] = r->body;
    });
  for (auto& t : clients) t.join();
  int answered = 0, refused = 0;
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (statuses[i] == 200) {
      ++answered;
    } else {
      EXPECT_EQ(statuses[i], 503) << bodies[i];
      EXPECT_NE(bodies[i].find("overloaded"), std::string::npos) << bodies[i];
      ++refused;
    }
  }
  EXPECT_GT(answered, 0);
  EXPECT_GT(refused, 0) << "24 concurrent requests on two threads";
  int status = 0;
  post(proxy, "/v1/completions", complete_body(words(5)), &status);
  EXPECT_EQ(status, 200) << "the proxy serves on";
  EXPECT_EQ(await_proxy_idle(proxy), 0);
  ASSERT_EQ(kill(proxy.pid(), SIGTERM), 0);
  EXPECT_EQ(proxy.wait_exit(8), 0) << "no request left counted as running";
  EXPECT_EQ(await_metric(p, "vllm:kv_cache_usage_perc", 0.0), 0.0);
  EXPECT_EQ(await_metric(d, "vllm:kv_cache_usage_perc", 0.0), 0.0);
  std::printf("    24 concurrent requests, two threads to spare: %d answered, %d refused\n",
              answered, refused);
}

TEST_F(PdTest, DecoderOutOfKvHandsRequestsBackAndTheProxyCompletesThem) {
  const int kv_p = kv_port_base() + 6;
  ServerProcess p(e2e::model_dir(), prefiller_flags(kv_p, 1), "/tmp/chunkpipe_pd_rec_p.log");
  // 8 blocks of 16 tokens: room for about one request of 90 tokens at a time.
  ServerProcess d(
      e2e::model_dir(),
      with(decoder_flags(kv_p + 1, 1), {"--max-model-len", "128", "--kv-cache-memory", "49152"}),
      "/tmp/chunkpipe_pd_rec_d.log");
  ServerProcess colocated(e2e::model_dir(), flags(), "/tmp/chunkpipe_pd_rec_c.log");
  ASSERT_TRUE(p.ready() && d.ready() && colocated.ready());
  ServerProcess proxy(
      {"proxy", "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", std::to_string(p.port()),
       "--decoder-hosts", "127.0.0.1", "--decoder-ports", std::to_string(d.port())},
      "/tmp/chunkpipe_pd_rec_proxy.log", "/healthcheck");
  ASSERT_TRUE(proxy.ready());
  std::vector<json> replies(6);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < replies.size(); ++i) {
    clients.emplace_back([&, i] {
      json body = complete_body("request number " + std::to_string(i) + " says hello", 90);
      body["stream"] = i % 2 == 1;
      if (i >= 4) {  // typed as pydantic converts them: the proxy reads them as D will
        body["stream"] = i % 2 == 1 ? "true" : "false";
        body["max_tokens"] = "90";
      }
      if (i % 2 == 0) {
        replies[i] = post(proxy, "/v1/completions", body);
      } else {
        replies[i] = {{"text", stream_text(proxy, body)}};
      }
    });
  }
  // Two choices: the proxy resumes only a first choice, so D recomputes either one itself.
  json two_choices;
  clients.emplace_back([&] {
    json body = complete_body("two choices say hello", 90);
    body["n"] = 2;
    two_choices = post(proxy, "/v1/completions", body);
  });
  for (auto& t : clients) t.join();
  const json want_two =
      post(colocated, "/v1/completions", complete_body("two choices say hello", 90));
  ASSERT_TRUE(two_choices.contains("choices")) << two_choices.dump();
  ASSERT_EQ(two_choices["choices"].size(), 2u) << two_choices.dump();
  EXPECT_EQ(two_choices["usage"]["completion_tokens"], 180);
  for (const json& c : two_choices["choices"]) {
    EXPECT_EQ(c["text"], want_two["choices"][0]["text"]) << c.dump();
    EXPECT_EQ(c["finish_reason"], "length") << c.dump();
    EXPECT_TRUE(c["stop_reason"].is_null()) << c.dump();
  }
  for (size_t i = 0; i < replies.size(); ++i) {
    const json want =
        post(colocated, "/v1/completions",
             complete_body("request number " + std::to_string(i) + " says hello", 90));
    const json& r = replies[i];
    if (i % 2 == 0) {
      ASSERT_TRUE(r.contains("choices")) << r.dump();
      EXPECT_EQ(r["usage"]["completion_tokens"], 90);
      EXPECT_EQ(r["usage"]["prompt_tokens"], want["usage"]["prompt_tokens"]);
      EXPECT_EQ(r["choices"][0]["text"], want["choices"][0]["text"]) << i;
    } else {
      EXPECT_EQ(r["text"], want["choices"][0]["text"]) << i;
    }
  }
  EXPECT_GT(metric(d, "chunkpipe:recomputed_requests_total"), 0.0);
  std::printf(
      "    %.0f requests handed back by the decoder and finished elsewhere, %.0f "
      "preempted there\n",
      metric(d, "chunkpipe:recomputed_requests_total"), metric(d, "vllm:num_preemptions_total"));
  EXPECT_EQ(await_metric(d, "vllm:kv_cache_usage_perc", 0.0), 0.0);
  EXPECT_EQ(await_metric(p, "vllm:kv_cache_usage_perc", 0.0), 0.0);
}

}  // namespace
