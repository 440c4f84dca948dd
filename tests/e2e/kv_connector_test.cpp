// The KV connector seam end to end, with vLLM's SharedStorageConnector: server A serves a
// prompt and saves its KV; server B (and a two-stage pipeline C), started later on the same
// directory, serve the same prompt with the same greedy output while computing only the tokens
// that were not stored. Bad --kv-transfer-config values stop the server with a message naming
// the field.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server_process.h"
#include "test_model.h"

namespace {

using nlohmann::json;

std::vector<std::string> storage_flags(const std::string& dir) {
  auto flags = e2e::base_flags();
  const json config = {{"kv_connector", "SharedStorageConnector"},
                       {"kv_role", "kv_both"},
                       {"kv_connector_extra_config", {{"shared_storage_path", dir}}}};
  flags.insert(flags.end(), {"--kv-transfer-config", config.dump()});
  return flags;
}

json complete(const e2e::ServerProcess& s, const std::string& prompt,
              const std::string& cache_salt = "") {
  json body = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
  if (!cache_salt.empty()) body["cache_salt"] = cache_salt;
  auto r = s.client().Post("/v1/completions", body.dump(), "application/json");
  if (!r || r->status != 200) return json();
  return json::parse(r->body);
}

using e2e::metric;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(SharedStorageConnectorTest, SecondServerLoadsWhatTheFirstSaved) {
  const std::string dir = "/tmp/chunkpipe_kvstore_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::string prompt;
  for (int i = 0; i < 30; ++i) prompt += "word" + std::to_string(i) + " ";
  json first;
  {
    e2e::ServerProcess a(e2e::model_dir(), storage_flags(dir), "/tmp/chunkpipe_kv_a.log");
    ASSERT_TRUE(a.ready()) << "see /tmp/chunkpipe_kv_a.log";
    first = complete(a, prompt);
    ASSERT_TRUE(first.is_object());
    EXPECT_EQ(metric(a, "vllm:external_prefix_cache_hits_total"), 0);
    EXPECT_EQ(a.stop(), 0);
  }
  const int64_t prompt_tokens = first["usage"]["prompt_tokens"].get<int64_t>();
  const int64_t stored = (prompt_tokens - 1) / 16 * 16;  // whole blocks before the last token
  ASSERT_GT(stored, 0) << "the prompt must span more than a block";
  size_t files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir))
    files += entry.path().extension() == ".kv";
  EXPECT_EQ(files, 2u) << "one file per decoder layer";

  e2e::ServerProcess b(e2e::model_dir(), storage_flags(dir), "/tmp/chunkpipe_kv_b.log");
  ASSERT_TRUE(b.ready()) << "see /tmp/chunkpipe_kv_b.log";
  // A salted request does not find the unsalted files (cache_salt isolates the store too).
  const json salted = complete(b, prompt, "tenant-a");
  ASSERT_TRUE(salted.is_object());
  EXPECT_EQ(salted["choices"][0]["text"], first["choices"][0]["text"]);
  EXPECT_EQ(metric(b, "vllm:external_prefix_cache_hits_total"), 0);
  const json second = complete(b, prompt);
  ASSERT_TRUE(second.is_object());
  EXPECT_EQ(second["choices"][0]["text"], first["choices"][0]["text"]);
  EXPECT_EQ(metric(b, "vllm:external_prefix_cache_hits_total"), double(stored));
  EXPECT_EQ(metric(b, "vllm:prompt_tokens_total"), double(prompt_tokens + prompt_tokens - stored))
      << "B computes the salted prompt whole, then only the tokens that were not stored";
  std::printf("    prompt %lld tokens: A computed all, B loaded %.0f and computed %.0f\n",
              static_cast<long long>(prompt_tokens),
              metric(b, "vllm:external_prefix_cache_hits_total"),
              metric(b, "vllm:prompt_tokens_total"));
  EXPECT_EQ(b.stop(), 0);

  auto flags = storage_flags(dir);  // each pipeline stage loads its own layers' files
  flags.insert(flags.end(), {"--pipeline-parallel-size", "2"});
  e2e::ServerProcess c(e2e::model_dir(), flags, "/tmp/chunkpipe_kv_c.log");
  ASSERT_TRUE(c.ready()) << "see /tmp/chunkpipe_kv_c.log";
  const json third = complete(c, prompt);
  ASSERT_TRUE(third.is_object());
  EXPECT_EQ(third["choices"][0]["text"], first["choices"][0]["text"]);
  EXPECT_EQ(metric(c, "vllm:external_prefix_cache_hits_total"), double(stored));
  EXPECT_EQ(c.stop(), 0);
  std::filesystem::remove_all(dir);
}

// A decoder with the recompute scheduler and room for about one request: requests that do not
// fit are handed back with finish_reason stop and stop_reason "recomputed" (for the proxy to
// re-prefill elsewhere), every request gets a 200, and the blocks all come back.
TEST(RecomputeSchedulerTest, DecoderWithoutSlotsHandsRequestsBack) {
  const std::string dir = "/tmp/chunkpipe_kvstore_recompute_" + std::to_string(getpid());
  auto flags = e2e::base_flags();
  const json config = {{"kv_connector", "SharedStorageConnector"},
                       {"kv_role", "kv_consumer"},
                       {"kv_connector_extra_config", {{"shared_storage_path", dir}}}};
  flags.insert(flags.end(), {"--kv-transfer-config", config.dump(), "--additional-config",
                             R"({"recompute_scheduler_enable": true})", "--max-model-len", "128",
                             "--kv-cache-memory", "49152"});  // 8 blocks of 16 tokens
  e2e::ServerProcess d(e2e::model_dir(), flags, "/tmp/chunkpipe_kv_recompute.log");
  ASSERT_TRUE(d.ready()) << "see /tmp/chunkpipe_kv_recompute.log";
  std::vector<json> replies(4);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < replies.size(); ++i) {
    clients.emplace_back([&, i] {
      const json body = {{"prompt", "request number " + std::to_string(i) + " says hello"},
                         {"max_tokens", 90},
                         {"temperature", 0},
                         {"ignore_eos", true}};
      auto r = d.client().Post("/v1/completions", body.dump(), "application/json");
      if (r && r->status == 200) replies[i] = json::parse(r->body);
    });
  }
  for (auto& t : clients) t.join();
  int recomputed = 0;
  for (const json& r : replies) {
    ASSERT_TRUE(r.is_object()) << "every request gets a 200";
    const json& choice = r["choices"][0];
    if (choice["stop_reason"] == "recomputed") {
      ++recomputed;
      EXPECT_EQ(choice["finish_reason"], "stop");
      EXPECT_LT(r["usage"]["completion_tokens"].get<int>(), 90);
    } else {
      EXPECT_EQ(r["usage"]["completion_tokens"], 90);
    }
  }
  EXPECT_GT(recomputed, 0);
  EXPECT_EQ(metric(d, "chunkpipe:recomputed_requests_total"), double(recomputed));
  EXPECT_EQ(metric(d, "vllm:kv_cache_usage_perc"), 0.0);
  EXPECT_EQ(d.stop(), 0);
  std::filesystem::remove_all(dir);

  auto plain = e2e::base_flags();  // as vllm-ascend: an error outside PD
  plain.insert(plain.end(), {"--additional-config", R"({"recompute_scheduler_enable": true})"});
  e2e::ServerProcess refused(e2e::model_dir(), plain, "/tmp/chunkpipe_kv_recompute_bad.log");
  EXPECT_FALSE(refused.ready());
  EXPECT_NE(refused.wait_exit(30), 0);
  EXPECT_NE(
      read_file("/tmp/chunkpipe_kv_recompute_bad.log").find("recompute_scheduler_enable needs"),
      std::string::npos);
}

TEST(SharedStorageConnectorTest, BadConfigNamesTheField) {
  struct Case {
    std::string config, expected;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"kv_connector":"SharedStorageConnector","kv_role":"both"})", "'kv_role'"},
           {R"({"kv_role":"kv_both"})", "'kv_connector' is required"},
           {R"({"kv_connector":"SharedStorageConnector","kv_role":"kv_both","kv_port":[1]})",
            "'kv_port'"},
           {R"({"kv_connector":"SharedStorageConnector","kv_role":"kv_both",)"
            R"("kv_connector_extra_config":{"shared_storage_path":7}})",
            "shared_storage_path"},
           {"not json", "not a JSON object"}}) {
    auto flags = e2e::base_flags();
    flags.insert(flags.end(), {"--kv-transfer-config", c.config});
    e2e::ServerProcess s(e2e::model_dir(), flags, "/tmp/chunkpipe_kv_bad.log");
    EXPECT_FALSE(s.ready()) << c.config;
    EXPECT_NE(s.wait_exit(30), 0) << c.config;
    const std::string log = read_file("/tmp/chunkpipe_kv_bad.log");
    EXPECT_NE(log.find(c.expected), std::string::npos) << c.config << "\n" << log;
  }
}

}  // namespace
