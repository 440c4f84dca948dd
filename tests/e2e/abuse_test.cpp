// The server under abuse (issue 10): every test is a hostile or clumsy client, and every test
// ends by checking the server still answers. Covers streaming with logprobs, duplicate request
// ids, deep JSON, slow readers, vanished clients, connection floods, pipelining, bogus lengths,
// chunked bodies over the limit, HTTP/1.0, SIGTERM mid-stream, wrong types, validation gaps and
// vLLM's routing errors. Reads and waits are bounded; nothing here times performance.
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "random_requests.h"
#include "raw_http.h"
#include "test_model.h"

namespace {

using nlohmann::json;
const std::string kKey = "abuse-key";
const std::string kAuth = "Authorization: Bearer " + kKey + "\r\n";
constexpr int kBodyLimit = 200000;

std::vector<std::string> abuse_flags() {
  auto flags = e2e::base_flags();
  flags.insert(flags.end(),
               {"--api-key", kKey, "--max-stream-buffer-bytes", "32768", "--max-request-body-bytes",
                std::to_string(kBodyLimit), "--enable-auto-tool-choice", "--tool-call-parser",
                "deepseek_v31", "--shutdown-drain-timeout", "1"});
  return flags;
}

struct Reply {
  int status = 0;
  std::string headers;
  std::string body;
};

// One request on a fresh connection; reads until the peer closes or the reply is complete.
Reply request(int port, const std::string& raw, int timeout_ms = 60000) {
  e2e::RawConnection c(port);
  Reply r;
  if (!c.connected() || !c.send(raw)) return r;
  std::string data;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool open = true;
  while (open && std::chrono::steady_clock::now() < deadline) {
    open = c.read_for(50, &data);
    const size_t head_end = data.find("\r\n\r\n");
    if (head_end == std::string::npos) continue;
    r.headers = data.substr(0, head_end);
    std::smatch m;
    if (std::regex_search(r.headers, m, std::regex("Content-Length: (\\d+)", std::regex::icase)) &&
        data.size() >= head_end + 4 + std::stoul(m[1])) {
      break;
    }
    if (r.headers.find("chunked") != std::string::npos &&
        data.find("\r\n0\r\n\r\n", head_end) != std::string::npos)
      break;
  }
  const size_t head_end = data.find("\r\n\r\n");
  if (data.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos) return r;
  r.status = std::stoi(data.substr(9, 3));
  r.headers = data.substr(0, head_end);
  r.body = data.substr(head_end + 4);
  return r;
}

Reply post(int port, const std::string& path, const std::string& body, bool key = true,
           const std::string& headers = "") {
  return request(port, e2e::http_post(path, body, (key ? kAuth : "") + headers));
}

Reply get(int port, const std::string& path, bool key = true) {
  return request(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + (key ? kAuth : "") +
                           "Connection: close\r\n\r\n");
}

// The number after a metric line that starts with `prefix`.
double metric(int port, const std::string& prefix) {
  const Reply r = get(port, "/metrics", false);
  size_t pos = r.body.find(prefix);
  if (pos == std::string::npos) return -1;
  pos = r.body.find("} ", pos);
  return std::stod(r.body.substr(pos + 2));
}
double aborted(int port) {
  return metric(port,
                "vllm:request_success_total{model_name=\"deepseek_v3\",engine=\"0\","
                "finished_reason=\"abort\"}");
}
double running(int port) {
  return metric(port, "vllm:num_requests_running{");
}

// Waits (bounded) until pred() holds; returns whether it did.
template <typename Pred>
bool eventually(Pred pred, int timeout_ms = 30000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

void expect_alive(int port) {
  EXPECT_EQ(get(port, "/health", false).status, 200) << "the server must keep serving";
  const Reply r = post(port, "/v1/completions", R"({"prompt": "still there?", "max_tokens": 2})");
  EXPECT_EQ(r.status, 200) << r.body;
}

class AbuseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new e2e::ServerProcess(e2e::model_dir(), abuse_flags(), "/tmp/chunkpipe_abuse.log");
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->stop(), 0) << "SIGTERM must exit 0";
    delete server_;
  }
  int port() const { return server_->port(); }
  static e2e::ServerProcess* server_;
};
e2e::ServerProcess* AbuseTest::server_ = nullptr;

// 1. Streaming with logprobs crashed the server (a lambda read dead locals).
TEST_F(AbuseTest, StreamingWithLogprobs) {
  ASSERT_TRUE(server_->ready()) << "see /tmp/chunkpipe_abuse.log";
  Reply r = post(port(), "/v1/completions",
                 R"({"prompt":"Hello","max_tokens":3,"logprobs":0,"stream":true})");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"token_logprobs\""), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos);
  r = post(port(), "/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"logprobs":true,
               "top_logprobs":2,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"top_logprobs\""), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("\"usage\":{"), std::string::npos);
  EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos);
  expect_alive(port());
}

// 2. Two live requests with one X-Request-Id hit a CHECK in the engine.
TEST_F(AbuseTest, DuplicateRequestIdsBothComplete) {
  ASSERT_TRUE(server_->ready());
  std::vector<Reply> replies(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < replies.size(); ++i) {
    threads.emplace_back([&, i] {
      replies[i] = post(port(), "/v1/completions",
                        std::string(R"({"prompt":"same id","max_tokens":12,"ignore_eos":true,)") +
                            (i % 2 ? R"("stream":true})" : R"("stream":false})"),
                        true, "X-Request-Id: dup-1\r\n");
    });
  }
  // The body's request_id names the response when no header does (vLLM), the header wins.
  for (const bool with_header : {false, true}) {
    threads.emplace_back([&, with_header] {
      const Reply r = post(port(), "/v1/completions",
                           R"({"prompt":"same id","max_tokens":4,"request_id":"body-id"})", true,
                           with_header ? "X-Request-Id: dup-1\r\n" : "");
      EXPECT_EQ(r.status, 200) << r.body;
      EXPECT_NE(r.body.find(with_header ? "\"cmpl-dup-1\"" : "\"cmpl-body-id\""), std::string::npos)
          << r.body;
    });
  }
  for (auto& t : threads) t.join();
  for (const Reply& r : replies) {
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_NE(r.headers.find("dup-1"), std::string::npos) << "the client's id comes back";
    EXPECT_NE(r.body.find("\"cmpl-dup-1\""), std::string::npos) << r.body;
  }
  const Reply bad = post(port(), "/v1/completions", R"({"prompt":"x","request_id":7})", true, "");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("request_id"), std::string::npos) << bad.body;
  expect_alive(port());
}

// 3. 60k levels of nesting overflowed the stack (recursive dump and copies).
TEST_F(AbuseTest, DeepNestingIsRefusedAtParseTime) {
  ASSERT_TRUE(server_->ready());
  const std::string deep = std::string(60000, '[') + std::string(60000, ']');
  for (
      const auto& [path, body, key] : std::vector<std::tuple<std::string, std::string, bool>>{
          {"/v1/completions", R"({"prompt":"x","model":)" + deep + "}", true},
          {"/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"x"}],"model":)" + deep + "}", true},
          {"/v1/chat/completions",
           R"({"messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":)" +
               deep + "}}]}]}",
           true},
          {"/tokenize", R"({"prompt":"x","model":)" + deep + "}", false}}) {
    const Reply r = post(port(), path, body, key);
    EXPECT_EQ(r.status, 400) << path << ": " << r.body.substr(0, 200);
    EXPECT_NE(r.body.find("deeper than"), std::string::npos) << r.body.substr(0, 200);
  }
  expect_alive(port());
}

// 4. A client that stops reading its stream froze every request for the write timeout.
TEST_F(AbuseTest, StalledStreamReaderIsDroppedWithoutStallingOthers) {
  ASSERT_TRUE(server_->ready());
  const double aborts_before = aborted(port());
  e2e::RawConnection stalled(port(), /*rcvbuf=*/2048);
  ASSERT_TRUE(stalled.send(e2e::http_post(
      "/v1/completions",
      // n=12 x 480 tokens x 20 logprobs is ~12 MB: more than the kernel buffers hold. Plain
      // temperature sampling, whatever the model's generation_config says: the test is about
      // the stalled reader, and under TSan top-p's sort would take the budget.
      R"({"prompt":"flood","max_tokens":480,"ignore_eos":true,"logprobs":20,"n":12,"stream":true,)"
      R"("temperature":1.0,"top_p":1.0})",
      kAuth)));
  // While that client reads nothing, other requests are served.
  for (int i = 0; i < 3; ++i) {
    const Reply r = post(port(), "/v1/completions", R"({"prompt":"others","max_tokens":4})");
    EXPECT_EQ(r.status, 200) << r.body;
  }
  // Bounded generously: under the sanitizers the engine needs minutes to fill the buffers.
  EXPECT_TRUE(eventually([&] { return aborted(port()) >= aborts_before + 1; }, 300000))
      << "the stalled stream must be cut once its buffer passes the limit";
  EXPECT_TRUE(eventually([&] { return running(port()) == 0; }));
  expect_alive(port());
}

// 5. Clients that hang up on a non-streamed request left the engine busy; huge fan-outs.
TEST_F(AbuseTest, VanishedNonStreamingClientsAreAbortedAndFanOutIsCapped) {
  ASSERT_TRUE(server_->ready());
  const double aborts_before = aborted(port());
  {
    std::vector<std::unique_ptr<e2e::RawConnection>> clients;
    for (int i = 0; i < 4; ++i) {
      clients.push_back(std::make_unique<e2e::RawConnection>(port()));
      ASSERT_TRUE(clients.back()->send(e2e::http_post(
          "/v1/completions", R"({"prompt":"long","max_tokens":480,"ignore_eos":true})", kAuth)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (size_t i = 0; i < clients.size(); ++i) {
      if (i % 2)
        clients[i]->reset();  // RST
      else
        clients[i]->close();  // FIN
    }
  }
  EXPECT_TRUE(eventually([&] { return aborted(port()) >= aborts_before + 4; }))
      << "each vanished client's request must be aborted";
  EXPECT_TRUE(eventually([&] { return running(port()) == 0; }));

  json prompts = json::array();
  for (int i = 0; i < 2000; ++i) prompts.push_back("p");
  const Reply r = post(port(), "/v1/completions",
                       json({{"prompt", prompts}, {"n", 16}, {"max_tokens", 1}}).dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("32000 completions"), std::string::npos) << r.body;
  expect_alive(port());
}

// 6. Thread-per-connection: slowloris sockets, many streams, bogus lengths, pipelining.
TEST_F(AbuseTest, ConnectionFloodsDoNotStarveLiveness) {
  ASSERT_TRUE(server_->ready());
  std::vector<std::unique_ptr<e2e::RawConnection>> slowloris;
  for (int i = 0; i < 300; ++i) {
    slowloris.push_back(std::make_unique<e2e::RawConnection>(port()));
    slowloris.back()->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");  // never finished
  }
  e2e::RawConnection bogus(port());
  bogus.send("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"prompt\"");
  EXPECT_EQ(get(port(), "/health", false).status, 200);
  EXPECT_EQ(get(port(), "/metrics", false).status, 200);

  // 300 concurrent streams, all served.
  std::vector<std::unique_ptr<e2e::RawConnection>> streams;
  for (int i = 0; i < 300; ++i) {
    streams.push_back(std::make_unique<e2e::RawConnection>(port()));
    streams.back()->send(e2e::http_post(
        "/v1/completions", R"({"prompt":"many","max_tokens":2,"stream":true})", kAuth));
  }
  EXPECT_EQ(get(port(), "/health", false).status, 200) << "while 300 streams are open";
  int done = 0;
  for (auto& s : streams) {
    const std::string data = s->read_until("data: [DONE]", 60000);
    done += data.find("data: [DONE]") != std::string::npos;
  }
  EXPECT_EQ(done, 300);

  // Ten pipelined keep-alive requests on one connection: ten answers, in order.
  e2e::RawConnection pipelined(port());
  std::string burst;
  for (int i = 0; i < 10; ++i) {
    burst += e2e::http_post("/tokenize", R"({"prompt":"request )" + std::to_string(i) + "\"}");
  }
  ASSERT_TRUE(pipelined.send(burst));
  std::string answers;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto count = [&] {
    size_t n = 0;
    for (size_t p = 0; (p = answers.find("HTTP/1.1 200", p)) != std::string::npos; ++p) ++n;
    return n;
  };
  while (count() < 10 && std::chrono::steady_clock::now() < deadline)
    pipelined.read_for(50, &answers);
  EXPECT_EQ(count(), 10u) << answers;
  expect_alive(port());
}

// 8. A chunked body bypassed the body limit.
TEST_F(AbuseTest, ChunkedBodyOverTheLimitGets413) {
  ASSERT_TRUE(server_->ready());
  e2e::RawConnection c(port());
  c.send(
      "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n");
  const std::string piece(60000, ' ');
  char size_line[32];
  std::snprintf(size_line, sizeof(size_line), "%zx\r\n", piece.size());
  for (int i = 0; i < 20 && c.send(size_line + piece + "\r\n"); ++i) {
  }
  bool closed = false;
  const std::string reply = c.read_until("", 10000, &closed);
  EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply.substr(0, 200);
  EXPECT_TRUE(closed);
  const Reply ok = post(port(), "/tokenize", R"({"prompt":"fits"})", false);
  EXPECT_EQ(ok.status, 200);
  expect_alive(port());
}

// 11. Wrong-typed fields gave a 500 with nlohmann's exception text. Those pydantic converts
// (lax mode, as vLLM's request models validate) are converted.
TEST_F(AbuseTest, WrongTypesGetA400NamingTheField) {
  ASSERT_TRUE(server_->ready());
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":"maybe"})",
       "add_generation_prompt"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":null})",
       "add_generation_prompt"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":[{"type":5}]}]})",
       "content[0]"},
      {"/tokenize", R"({"prompt":"x","add_special_tokens":[true]})", "add_special_tokens"},
      {"/tokenize", R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":2})",
       "add_generation_prompt"},
      {"/v1/completions", R"({"prompt":"x","echo":"sure"})", "echo"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":"16.5"})", "max_tokens"},
      {"/v1/completions", R"({"prompt":"x","n":2.5})", "'n'"},
      {"/v1/completions", R"({"prompt":"x","temperature":"nan"})", "temperature"},
      {"/v1/completions", R"({"prompt":"x","model":5})", "model"},
      {"/v1/completions", R"({"prompt":"x","stop":[1]})", "stop"},
      {"/v1/completions", R"({"prompt":"x","logit_bias":[1]})", "logit_bias"},
  };
  for (const auto& [path, body, field] : cases) {
    const Reply r = post(port(), path, body, path != "/tokenize");
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    EXPECT_NE(r.body.find(field), std::string::npos) << body << " -> " << r.body;
    EXPECT_EQ(r.body.find("json.exception"), std::string::npos) << r.body;
  }
  // What pydantic's lax mode converts for vLLM is accepted the same way.
  const Reply lax = post(port(), "/v1/completions",
                         R"({"prompt":"x","max_tokens":"3","temperature":" 0 ","n":1.0,
                             "stream":"false","echo":0,"ignore_eos":"True","logprobs":true})");
  ASSERT_EQ(lax.status, 200) << lax.body;
  const json j = json::parse(lax.body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0].size(), 1u) << "logprobs true is 1";
  expect_alive(port());
}

// 12. Validation gaps: min_tokens > max_tokens, 64-bit wrap, logit_bias, response_format.
TEST_F(AbuseTest, ValidationGapsAreClosed) {
  ASSERT_TRUE(server_->ready());
  for (const auto& [body, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt":"x","max_tokens":2,"min_tokens":5})", "min_tokens"},
           {R"({"prompt":"x","n":4294967297})", "'n' must be an integer in"},
           {R"({"prompt":"x","top_k":4294967295})", "'top_k' must be an integer in"},
           {R"({"prompt":"x","max_tokens":18446744073709551615})", "max_tokens"},
           {R"({"prompt":"x","logit_bias":{"99999999":5}})", "out-of-vocab"},
           {R"({"prompt":"x","logit_bias":{"abc":5}})", "logit_bias"},
           {R"({"prompt":"x","response_format":{"type":"json_object"}})", "not supported"}}) {
    const Reply r = post(port(), "/v1/completions", body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    EXPECT_NE(r.body.find(needle), std::string::npos) << body << " -> " << r.body;
  }
  // logit_bias is applied: +100 on one token makes every greedy token that token.
  const Reply r = post(port(), "/v1/completions",
                       R"({"prompt":"x","max_tokens":6,"temperature":0,"ignore_eos":true,
                           "logit_bias":{"1000":100},"logprobs":0})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  const Reply tok = post(port(), "/detokenize", R"({"tokens":[1000]})", false);
  const std::string piece = json::parse(tok.body)["prompt"];
  for (const auto& t : j["choices"][0]["logprobs"]["tokens"]) EXPECT_EQ(t, piece);
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), 6u);
  expect_alive(port());
}

// 12b. Token ids past the vocabulary (129280 rows) in every field that carries ids get a 400
// naming the field and the id, on both routes, streamed or not; one used to kill the engine.
TEST_F(AbuseTest, OutOfVocabularyIdsInEveryFieldGetA400) {
  ASSERT_TRUE(server_->ready());
  const std::string chat = R"("messages":[{"role":"user","content":"x"}])";
  struct Case {
    std::string path, body, needle;
  };
  std::vector<Case> cases;
  for (const std::string stream : {"false", "true"}) {
    for (const std::string& ids :
         {std::string("[129280]"), std::string("[190575]"), std::string("[3, 2147483647]")}) {
      const std::string field = R"("stream":)" + stream + R"(,"stop_token_ids":)" + ids;
      const std::string first = ids == "[3, 2147483647]" ? "2147483647" : ids.substr(1, 6);
      const std::string needle = "'stop_token_ids' holds token id " + first;
      cases.push_back(
          {"/v1/completions", R"({"prompt":"a","max_tokens":3,)" + field + "}", needle});
      cases.push_back({"/v1/completions",
                       R"({"prompt":"a","max_tokens":3,"min_tokens":2,)" + field + "}", needle});
      cases.push_back(
          {"/v1/chat/completions", "{" + chat + R"(,"max_tokens":3,)" + field + "}", needle});
    }
  }
  for (const std::string route_body :
       {R"("prompt":"a",)", R"("messages":[{"role":"user","content":"x"}],)"}) {
    const std::string path = route_body[1] == 'p' ? "/v1/completions" : "/v1/chat/completions";
    cases.push_back({path, "{" + route_body + R"("allowed_token_ids":[5,129280]})",
                     "allowed_token_ids contains out-of-vocab token id! (129280"});
    cases.push_back(
        {path, "{" + route_body + R"("logit_bias":{"129280":1}})", "[129280] in logit_bias"});
  }
  cases.push_back({"/v1/completions", R"({"prompt":[1,2,129280],"max_tokens":2})",
                   "'prompt' holds token id 129280"});
  cases.push_back({"/v1/completions", R"({"prompt":[[1,2],[7,-4]],"max_tokens":2})",
                   "'prompt' holds token id -4"});
  cases.push_back({"/v1/completions", R"({"prompt":[5,4294967296],"max_tokens":2})",
                   "'prompt' holds token id 4294967296"});
  cases.push_back({"/detokenize", R"({"tokens":[1,129280]})", "'tokens' holds token id 129280"});
  for (const Case& c : cases) {
    const Reply r = post(port(), c.path, c.body, c.path != "/detokenize");
    EXPECT_EQ(r.status, 400) << c.body << " -> " << r.body;
    EXPECT_NE(r.body.find(c.needle), std::string::npos) << c.body << " -> " << r.body;
    EXPECT_NE(r.body.find("BadRequestError"), std::string::npos) << r.body;
  }
  // The last id of the vocabulary is a valid stop id.
  const Reply last =
      post(port(), "/v1/completions", R"({"prompt":"a","max_tokens":3,"stop_token_ids":[129279]})");
  EXPECT_EQ(last.status, 200) << last.body;
  expect_alive(port());
}

// 13. Routes: 405, 401 before 404 on /v1, /tokenize's model, HTTP/1.0.
TEST_F(AbuseTest, RoutingErrorsFollowVllm) {
  ASSERT_TRUE(server_->ready());
  EXPECT_EQ(get(port(), "/v1/completions").status, 405);
  EXPECT_EQ(post(port(), "/health", "{}", false).status, 405);
  EXPECT_EQ(get(port(), "/v1/nothing-here", false).status, 401);
  EXPECT_EQ(get(port(), "/v1/nothing-here", true).status, 404);
  EXPECT_EQ(get(port(), "/nothing-here", false).status, 404);
  EXPECT_EQ(post(port(), "/tokenize", R"({"prompt":"x","model":"nope"})", false).status, 404);

  // The JSON endpoints take only application/json bodies (parameters and case aside), as
  // vLLM's validate_json_request: curl's -d without -H sends a form's media type.
  const auto with_type = [&](const std::string& path, const std::string& type) {
    const std::string body = R"({"prompt":"typed","max_tokens":1})";
    return request(port(), "POST " + path + " HTTP/1.1\r\nHost: x\r\n" + kAuth + type +
                               "Content-Length: " + std::to_string(body.size()) +
                               "\r\nConnection: close\r\n\r\n" + body);
  };
  for (const std::string path : {"/v1/completions", "/v1/chat/completions", "/tokenize"}) {
    for (const std::string type :
         {"Content-Type: application/x-www-form-urlencoded\r\n", "Content-Type: text/plain\r\n", "",
          "Content-Type: application/jsonx\r\n"}) {
      const Reply r = with_type(path, type);
      EXPECT_EQ(r.status, 400) << path << " " << type;
      EXPECT_NE(r.body.find("Only 'application/json' is allowed"), std::string::npos) << r.body;
      EXPECT_NE(r.body.find("\"BadRequestError\""), std::string::npos) << r.body;
    }
  }
  EXPECT_EQ(
      with_type("/v1/completions", "Content-Type: Application/JSON; charset=utf-8\r\n").status,
      200);
  EXPECT_EQ(with_type("/tokenize", "Content-Type: application/json;charset=UTF-8\r\n").status, 200);

  // HTTP/1.0: no chunked encoding; the stream ends with the connection.
  e2e::RawConnection c(port());
  c.send(e2e::http_post("/v1/completions",
                        R"({"prompt":"old client","max_tokens":3,"stream":true})", kAuth, "1.0"));
  bool closed = false;
  const std::string data = c.read_until("", 30000, &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(data.rfind("HTTP/1.0 200", 0), 0u) << data.substr(0, 200);
  EXPECT_EQ(data.find("chunked"), std::string::npos) << data.substr(0, 300);
  EXPECT_NE(data.find("data: [DONE]"), std::string::npos);
  const Reply whole = request(port(), e2e::http_post("/tokenize", R"({"prompt":"x"})", "", "1.0"));
  EXPECT_EQ(whole.status, 200);
  EXPECT_NE(whole.headers.find("Content-Length"), std::string::npos) << whole.headers;
  expect_alive(port());
}

// CORS and HEAD as vLLM's server answers them: a browser's preflight needs no key, every
// response to a cross-origin request (whole, streamed, refused) allows the origin, and HEAD is
// a GET without the body.
TEST_F(AbuseTest, CorsPreflightAndHeadFollowVllm) {
  ASSERT_TRUE(server_->ready());
  const Reply pre = request(port(),
                            "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                            "Origin: http://ui.example\r\nAccess-Control-Request-Method: POST\r\n"
                            "Access-Control-Request-Headers: authorization, content-type\r\n"
                            "Connection: close\r\n\r\n");
  EXPECT_EQ(pre.status, 200) << pre.headers;
  EXPECT_EQ(pre.body, "OK");
  EXPECT_NE(pre.headers.find("Access-Control-Allow-Origin: *"), std::string::npos) << pre.headers;
  EXPECT_NE(pre.headers.find("Access-Control-Allow-Headers: authorization, content-type"),
            std::string::npos)
      << pre.headers;
  const std::string origin = "Origin: http://ui.example\r\n";
  const Reply whole =
      post(port(), "/v1/completions", R"({"prompt":"x","max_tokens":2})", true, origin);
  EXPECT_EQ(whole.status, 200);
  EXPECT_NE(whole.headers.find("Access-Control-Allow-Origin: *"), std::string::npos);
  const Reply streamed = post(port(), "/v1/completions",
                              R"({"prompt":"x","max_tokens":2,"stream":true})", true, origin);
  EXPECT_EQ(streamed.status, 200);
  EXPECT_NE(streamed.headers.find("Access-Control-Allow-Origin: *"), std::string::npos);
  const Reply refused = post(port(), "/v1/completions", "{}", false, origin);
  EXPECT_EQ(refused.status, 401);
  EXPECT_NE(refused.headers.find("Access-Control-Allow-Origin: *"), std::string::npos)
      << "a browser must be able to read the 401";
  const Reply same_origin = post(port(), "/v1/completions", R"({"prompt":"x","max_tokens":2})");
  EXPECT_EQ(same_origin.headers.find("Access-Control"), std::string::npos);
  // OPTIONS that is no preflight reaches the router: 405, as vLLM (no key needed for that).
  EXPECT_EQ(
      request(port(), "OPTIONS /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").status,
      405);

  const Reply head =
      request(port(), "HEAD /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 10000);
  EXPECT_EQ(head.status, 200);
  EXPECT_NE(head.headers.find("Content-Length: 22"), std::string::npos) << head.headers;
  EXPECT_TRUE(head.body.empty()) << head.body;
  EXPECT_EQ(
      request(port(),
              "HEAD /v1/completions HTTP/1.1\r\nHost: x\r\n" + kAuth + "Connection: close\r\n\r\n",
              10000)
          .status,
      405);
  expect_alive(port());
}

// 15. Tool calling: flags, tool_choice, and the response shape.
TEST_F(AbuseTest, ToolChoiceIsValidated) {
  ASSERT_TRUE(server_->ready());
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])";
  const std::string messages = R"("messages":[{"role":"user","content":"weather?"}])";
  Reply r =
      post(port(), "/v1/chat/completions", "{" + messages + "," + tools + R"(,"max_tokens":3})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(json::parse(r.body)["choices"][0]["message"]["tool_calls"].is_array());
  r = post(port(), "/v1/chat/completions",
           "{" + messages + "," + tools +
               R"(,"tool_choice":{"type":"function","function":{"name":"nope"}}})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("nope"), std::string::npos) << r.body;
  r = post(port(), "/v1/chat/completions", "{" + messages + R"(,"tool_choice":"required"})");
  EXPECT_EQ(r.status, 400) << r.body;
  r = post(port(), "/v1/chat/completions",
           "{" + messages + "," + tools + R"(,"tool_choice":"sometimes"})");
  EXPECT_EQ(r.status, 400) << r.body;
  r = post(port(), "/v1/chat/completions",
           "{" + messages +
               R"(,"tools":[{"type":"function","function":{"name":"f","parameters":[1]}}]})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("tools[0].function.parameters"), std::string::npos) << r.body;
  expect_alive(port());
}

// The built-in template tells the model about the request's tools (as vLLM's V3.1 tool template
// does), on /tokenize as on chat completions; a malformed entry is named.
TEST_F(AbuseTest, ToolsAreRenderedIntoThePrompt) {
  ASSERT_TRUE(server_->ready());
  const std::string messages = R"("messages":[{"role":"user","content":"weather?"}])";
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"get_weather","description":"Weather now",)"
      R"("parameters":{"type":"object"}}}])";
  Reply plain = post(port(), "/tokenize", "{" + messages + "}");
  Reply with_tools = post(port(), "/tokenize", "{" + messages + "," + tools + "}");
  ASSERT_EQ(plain.status, 200) << plain.body;
  ASSERT_EQ(with_tools.status, 200) << with_tools.body;
  EXPECT_GT(json::parse(with_tools.body)["count"].get<int>(),
            json::parse(plain.body)["count"].get<int>());
  Reply text =
      post(port(), "/detokenize", json{{"tokens", json::parse(with_tools.body)["tokens"]}}.dump());
  ASSERT_EQ(text.status, 200) << text.body;
  const std::string prompt = json::parse(text.body)["prompt"].get<std::string>();
  EXPECT_NE(prompt.find("## Tools"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("### get_weather\nDescription: Weather now"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find(R"(Parameters: {"type": "object"})"), std::string::npos) << prompt;
  Reply bad =
      post(port(), "/tokenize",
           "{" + messages +
               R"(,"tools":[{"type":"function","function":{"name":"f","description":7}}]})");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("tools[0].function.description"), std::string::npos) << bad.body;
  expect_alive(port());
}

// return_token_ids (vLLM >= 0.10.2, which the PD proxy's exact recompute retry uses): the
// prompt's ids and the generated ids come back, whole or streamed, and a token-array prompt made
// from them continues exactly.
TEST_F(AbuseTest, ReturnTokenIdsWholeAndStreamed) {
  ASSERT_TRUE(server_->ready());
  const json request = {{"prompt", "the token ids of this prompt"},
                        {"max_tokens", 5},
                        {"temperature", 0},
                        {"ignore_eos", true},
                        {"return_token_ids", true}};
  Reply r = post(port(), "/v1/completions", request.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json whole = json::parse(r.body)["choices"][0];
  const json tokenized = json::parse(
      post(port(), "/tokenize", json{{"prompt", "the token ids of this prompt"}}.dump()).body);
  EXPECT_EQ(whole["prompt_token_ids"], tokenized["tokens"]);
  ASSERT_EQ(whole["token_ids"].size(), 5u);

  json streamed = request;
  streamed["stream"] = true;
  r = post(port(), "/v1/completions", streamed.dump());
  ASSERT_EQ(r.status, 200);
  json ids = json::array();
  int with_prompt_ids = 0;
  for (size_t pos = 0; (pos = r.body.find("data: {", pos)) != std::string::npos; ++pos) {
    const json chunk = json::parse(r.body.substr(pos + 6, r.body.find("\n", pos) - pos - 6));
    const json& choice = chunk["choices"][0];
    for (const json& id : choice["token_ids"]) ids.push_back(id);
    if (choice.contains("prompt_token_ids")) {
      ++with_prompt_ids;
      EXPECT_EQ(choice["prompt_token_ids"], tokenized["tokens"]);
    }
  }
  EXPECT_EQ(ids, whole["token_ids"]);
  EXPECT_EQ(with_prompt_ids, 1) << "only the first chunk carries the prompt's ids";

  // Prompt ids plus the first two generated ids, as a token-array prompt: the rest follows.
  json retry_prompt = whole["prompt_token_ids"];
  retry_prompt.push_back(whole["token_ids"][0]);
  retry_prompt.push_back(whole["token_ids"][1]);
  json retry = request;
  retry["prompt"] = retry_prompt;
  retry["max_tokens"] = 3;
  r = post(port(), "/v1/completions", retry.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json continued = json::parse(r.body)["choices"][0]["token_ids"];
  EXPECT_EQ(continued,
            json(std::vector<json>(whole["token_ids"].begin() + 2, whole["token_ids"].end())));

  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                     {"max_tokens", 3},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_token_ids", true}};
  r = post(port(), "/v1/chat/completions", chat.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json chat_whole = json::parse(r.body);
  EXPECT_FALSE(chat_whole["prompt_token_ids"].empty());
  EXPECT_EQ(chat_whole["choices"][0]["token_ids"].size(), 3u);
  r = post(port(), "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 1}}.dump());
  EXPECT_TRUE(json::parse(r.body)["choices"][0]["token_ids"].is_null());
  expect_alive(port());
}

// One SSE event per HTTP chunk, as vLLM writes them: the upstream PD proxy parses each chunk it
// reads as one event.
TEST_F(AbuseTest, EachSseEventIsItsOwnChunk) {
  ASSERT_TRUE(server_->ready());
  const json request = {{"prompt", "one event per chunk"},
                        {"max_tokens", 6},
                        {"temperature", 0},
                        {"ignore_eos", true},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}}};
  const Reply r = post(port(), "/v1/completions", request.dump());
  ASSERT_EQ(r.status, 200);
  size_t pos = 0, chunks = 0;
  while (pos < r.body.size()) {
    const size_t eol = r.body.find("\r\n", pos);
    ASSERT_NE(eol, std::string::npos);
    const size_t size = std::stoul(r.body.substr(pos, eol - pos), nullptr, 16);
    if (size == 0) break;
    const std::string data = r.body.substr(eol + 2, size);
    EXPECT_EQ(data.rfind("data: ", 0), 0u) << data;
    EXPECT_EQ(data.find("data: ", 1), std::string::npos) << "two events in one chunk: " << data;
    EXPECT_EQ(data.substr(data.size() - 2), "\n\n");
    ++chunks;
    pos = eol + 2 + size + 2;
  }
  EXPECT_GE(chunks, 8u);  // 6 tokens (or fewer text chunks), the usage chunk and [DONE]
  expect_alive(port());
}

// 15. The tool-call path end to end: logit_bias with a repetition penalty forces the model to
// emit the DeepSeek-V3.1 markup token by token (each biased token is 7 below the previous one,
// more than the random model's own logits differ; once emitted, the repetition penalty halves
// a token's biased logit), and the parser turns it into tool_calls.
TEST_F(AbuseTest, ForcedToolCallTokensBecomeToolCalls) {
  // The built-in template writes the markup tokens into the prompt when tools are given, and the
  // repetition penalty would then hold them down from the start; this server's template leaves
  // the tools out, so only emitted tokens are penalized.
  const std::string template_path = "/tmp/chunkpipe_abuse_no_tools_" + std::to_string(getpid());
  std::ofstream(template_path)
      << "{{ bos_token }}{% for m in messages %}<｜User｜>{{ m['content'] }}"
         "{% endfor %}<｜Assistant｜></think>";
  auto flags = abuse_flags();
  flags.insert(flags.end(), {"--chat-template", template_path});
  e2e::ServerProcess no_tools(e2e::model_dir(), flags, "/tmp/chunkpipe_abuse_no_tools.log");
  std::filesystem::remove(template_path);
  ASSERT_TRUE(no_tools.ready()) << "see /tmp/chunkpipe_abuse_no_tools.log";
  const auto port = [&] { return no_tools.port(); };
  auto single_id = [&](const std::string& text) {
    const Reply r = post(port(), "/tokenize",
                         json({{"prompt", text}, {"add_special_tokens", false}}).dump(), false);
    const json ids = json::parse(r.body)["tokens"];
    return ids.size() == 1 ? ids[0].get<int>() : -1;
  };
  std::vector<int> ids;
  for (const std::string piece :
       {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "search", "<｜tool▁sep｜>", "{}",
        "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"}) {
    ids.push_back(single_id(piece));
    ASSERT_GE(ids.back(), 0) << piece << " is not one token";
  }
  json bias = json::object();
  for (size_t i = 0; i < ids.size(); ++i) bias[std::to_string(ids[i])] = 100.0 - 7.0 * double(i);
  const json request = {{"messages", {{{"role", "user"}, {"content", "find chunkpipe"}}}},
                        {"tools", {{{"type", "function"}, {"function", {{"name", "search"}}}}}},
                        {"max_tokens", ids.size()},
                        {"temperature", 0},
                        {"repetition_penalty", 2.0},
                        {"logit_bias", bias}};
  Reply r = post(port(), "/v1/chat/completions", request.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json whole = json::parse(r.body)["choices"][0];
  ASSERT_EQ(whole["message"]["tool_calls"].size(), 1u) << r.body;
  EXPECT_EQ(whole["message"]["tool_calls"][0]["function"]["name"], "search");
  EXPECT_EQ(whole["message"]["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_EQ(whole["message"]["tool_calls"][0]["type"], "function");
  EXPECT_TRUE(whole["message"]["content"].is_null()) << r.body;
  EXPECT_EQ(whole["finish_reason"], "tool_calls");

  json streamed_request = request;
  streamed_request["stream"] = true;
  r = post(port(), "/v1/chat/completions", streamed_request.dump());
  ASSERT_EQ(r.status, 200);
  std::string name, arguments, finish;
  for (size_t pos = 0; (pos = r.body.find("data: {", pos)) != std::string::npos; ++pos) {
    const json chunk = json::parse(r.body.substr(pos + 6, r.body.find("\n", pos) - pos - 6));
    const json& choice = chunk["choices"][0];
    if (choice["finish_reason"].is_string()) finish = choice["finish_reason"];
    if (!choice["delta"].contains("tool_calls")) continue;
    for (const json& call : choice["delta"]["tool_calls"]) {
      EXPECT_EQ(call["index"], 0);
      if (call["function"].contains("name")) name += call["function"]["name"].get<std::string>();
      arguments += call["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(name, "search");
  EXPECT_EQ(arguments, "{}");
  EXPECT_EQ(finish, "tool_calls");
  expect_alive(port());
}

// kv_transfer_params mean something only to a PD instance: on a plain server a P-leg request
// keeps its n choices and gets no handoff.
TEST_F(AbuseTest, KvTransferParamsOnAPlainServerChangeNothing) {
  const Reply r = post(port(), "/v1/completions",
                       R"({"prompt": "hi", "max_tokens": 2, "n": 2,
                           "kv_transfer_params": {"do_remote_decode": true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  const auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["choices"].size(), 2u);
  EXPECT_TRUE(j["kv_transfer_params"].is_null()) << r.body;
}

// Random requests with every option (n, prompt batches, logprobs, echo, stop strings, penalties,
// streams with usage) from clients that also leave, against pipeline stages with CPP, MTP
// speculative decoding and the reasoning parser: no answer breaks the rules of
// random_requests.h, and afterwards nothing runs and no block is held.
TEST(AbuseRandomTest, RandomRequestsLeaveNothingBehind) {
  auto flags = e2e::base_flags();
  flags.insert(flags.end(),
               {"--pipeline-parallel-size", "2", "--additional-config",
                R"({"scheduler_config": {"profiling_chunk_config": {"enabled": true}}})",
                "--speculative-config", R"({"method": "mtp", "num_speculative_tokens": 2})",
                "--reasoning-parser", "deepseek_v3", "--enable-auto-tool-choice",
                "--tool-call-parser", "deepseek_v31"});
  e2e::ServerProcess s(e2e::model_dir(), flags, "/tmp/chunkpipe_abuse_random.log");
  ASSERT_TRUE(s.ready()) << "see /tmp/chunkpipe_abuse_random.log";
  e2e::expect_random_requests_answered_well(s.port(), /*seed=*/2000);
  EXPECT_TRUE(eventually([&] { return running(s.port()) == 0.0; }));
  EXPECT_TRUE(eventually([&] { return e2e::metric(s, "vllm:kv_cache_usage_perc") == 0.0; }));
  expect_alive(s.port());
}

// 7. SIGTERM with streams in flight: bounded drain, then an error event, [DONE], the chunked
// terminator, and exit 0.
TEST(AbuseShutdownTest, SigtermMidStreamEndsEveryStreamCleanly) {
  e2e::ServerProcess s(e2e::model_dir(), abuse_flags(), "/tmp/chunkpipe_abuse_sigterm.log");
  ASSERT_TRUE(s.ready());
  std::vector<std::unique_ptr<e2e::RawConnection>> streams;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(std::make_unique<e2e::RawConnection>(s.port()));
    streams.back()->send(e2e::http_post(
        "/v1/chat/completions",
        R"({"messages":[{"role":"user","content":"go on"}],"max_tokens":480,"ignore_eos":true,"stream":true})",
        kAuth));
  }
  for (auto& c : streams) c->read_until("data: {", 30000);
  const auto t0 = std::chrono::steady_clock::now();
  kill(s.pid(), SIGTERM);
  for (auto& c : streams) {
    bool closed = false;
    const std::string tail = c->read_until("\r\n0\r\n\r\n", 20000, &closed);
    EXPECT_NE(tail.find("shutting down"), std::string::npos) << tail.substr(0, 300);
    const size_t done = tail.rfind("data: [DONE]");
    EXPECT_NE(done, std::string::npos);
    EXPECT_NE(tail.find("\r\n0\r\n\r\n", done), std::string::npos) << "the chunked terminator";
  }
  EXPECT_EQ(s.wait_exit(20), 0);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("    SIGTERM to exit: %.2f s (drain timeout 1 s)\n", secs);
}

}  // namespace
