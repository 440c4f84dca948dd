// Test helper: seeded random OpenAI requests with the options the server takes (and now and then
// a wrong type), sent by clients that read the answer or leave before or during it. Each answer
// is held to what a hostile-client probe checks: never a 5xx, errors are JSON with an "error",
// a stream ends with [DONE] and carries no error event, a whole answer has n x prompts choices.
// The same seed gives the same requests; request loops are bounded.
#pragma once

#include <atomic>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "raw_http.h"

namespace e2e {

// How many random requests a test sends: fewer under ThreadSanitizer, where each costs about
// ten times as much (the races it looks for show in any of them).
constexpr int random_request_count() {
#if defined(__SANITIZE_THREAD__)
  return 60;
#else
  return 160;
#endif
}

struct RandomRequest {
  std::string path;
  nlohmann::json body;
  bool stream = false;
  int leave = 0;                // 0: reads the answer; 1: leaves before it; 2: during it
  size_t expected_choices = 0;  // for a whole 200 answer; 0: not checked
};

inline RandomRequest random_request(uint32_t seed) {
  std::mt19937 rng(seed);
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  auto pick = [&](auto... options) {
    const std::vector<nlohmann::json> v = {nlohmann::json(options)...};
    return v[rng() % v.size()];
  };
  static const char* kWords[] = {"the",   "of",  "and", "water", "people", "time", "word",
                                 "first", "way", "up",  "call",  "find",   "long", "day"};
  auto text = [&](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += std::string(i ? " " : "") + kWords[rng() % 14];
    return s;
  };
  RandomRequest r;
  nlohmann::json& b = r.body;  // without "model": the served model
  const bool chat = chance(0.5);
  size_t prompts = 1;
  if (chat) {
    r.path = "/v1/chat/completions";
    nlohmann::json messages = nlohmann::json::array();
    if (chance(0.3)) messages.push_back({{"role", "system"}, {"content", text(8)}});
    for (int turns = 1 + int(rng() % 3); turns > 0; --turns) {
      messages.push_back({{"role", "user"}, {"content", text(1 + int(rng() % 50))}});
      if (chance(0.4)) messages.push_back({{"role", "assistant"}, {"content", text(6)}});
    }
    b["messages"] = messages;
    if (chance(0.3)) b["logprobs"] = true;
    if (b.contains("logprobs") && chance(0.5)) b["top_logprobs"] = pick(0, 1, 5, 20);
    if (chance(0.1) && messages.back()["role"] == "assistant") {
      b["continue_final_message"] = true;
      b["add_generation_prompt"] = false;
    }
    if (chance(0.1)) b["echo"] = true;
    if (chance(0.1)) {  // a tool the model may (not) call; "required" forces the call's markup
      const nlohmann::json parameters = {{"type", "object"},
                                         {"properties", {{"word", {{"type", "string"}}}}}};
      const nlohmann::json tool = {{"type", "function"},
                                   {"function", {{"name", "find"}, {"parameters", parameters}}}};
      b["tools"] = nlohmann::json::array({tool});
      if (chance(0.5)) b["tool_choice"] = pick("none", "required");
    }
  } else {
    r.path = "/v1/completions";
    const uint32_t form = rng() % 10;
    if (form < 6) {
      b["prompt"] = text(int(rng() % 100));
    } else if (form < 8) {
      std::vector<int> ids(1 + rng() % 80);
      for (int& id : ids) id = int(rng() % 120000);
      b["prompt"] = ids;
    } else {
      prompts = 2;
      b["prompt"] = {text(1 + int(rng() % 30)), text(1 + int(rng() % 30))};
    }
    if (chance(0.3)) b["logprobs"] = pick(0, 1, 5);
    if (chance(0.15)) b["echo"] = true;
    if (chance(0.1)) b["return_tokens_as_token_ids"] = true;
  }
  b[chat && chance(0.3) ? "max_completion_tokens" : "max_tokens"] = 1 + int(rng() % 30);
  if (chance(0.15)) b["prompt_logprobs"] = pick(0, 1, 5);
  if (chance(0.1)) b["truncate_prompt_tokens"] = pick(-1, 1, 8);
  if (chance(0.1)) b["cache_salt"] = pick("a", "b");
  if (chance(0.05)) b["stop_token_ids"] = {int(rng() % 120000), 1};
  if (chance(0.05)) b["bad_words"] = {std::string(kWords[rng() % 14]), " the water"};
  if (chance(0.05)) {  // sampling then picks among these ids only
    std::vector<int> ids = {1, 2};
    for (int i = 0; i < 30; ++i) ids.push_back(int(rng() % 120000));
    b["allowed_token_ids"] = ids;
  }
  if (chance(0.05)) b["priority"] = 0;
  if (chance(0.05)) b["user"] = "someone";
  if (chance(0.3)) b["temperature"] = pick(0, 0.5, 1.0, 1.7);
  if (chance(0.3)) b["top_p"] = pick(0.01, 0.5, 0.95, 1.0);
  if (chance(0.3)) b["top_k"] = pick(-1, 1, 5, 50, 200000);
  if (chance(0.2)) b["min_p"] = pick(0.0, 0.05, 0.5);
  if (chance(0.3)) b["seed"] = int(rng() % 100000);
  if (chance(0.2)) b["presence_penalty"] = pick(-2, 0, 1.5);
  if (chance(0.2)) b["frequency_penalty"] = pick(-2, 0, 1.5);
  if (chance(0.2)) b["repetition_penalty"] = pick(0.5, 1.0, 1.3);
  if (chance(0.1)) b["logit_bias"] = {{std::to_string(rng() % 120000), pick(-100, 5, 100)}};
  if (chance(0.2)) b["stop"] = pick("the", std::vector<std::string>{"a", "of", "\n"});
  if (chance(0.1)) b["include_stop_str_in_output"] = true;
  if (chance(0.2)) b["min_tokens"] = int(rng() % 3);
  if (chance(0.2)) b["ignore_eos"] = true;
  if (chance(0.1)) b["return_token_ids"] = true;
  if (chance(0.1)) b["skip_special_tokens"] = false;
  const int n = chance(0.25) ? 2 + int(rng() % 2) : 1;
  if (n > 1) b["n"] = n;
  r.stream = chance(0.5);
  if (r.stream) {
    b["stream"] = true;
    if (chance(0.5))
      b["stream_options"] = {{"include_usage", chance(0.5)},
                             {"continuous_usage_stats", chance(0.5)}};
  }
  if (chance(0.03))  // a wrong type: a 400 naming the field
    b[std::string(pick("temperature", "n", "stop", "max_tokens", "seed"))] = pick("x", true);
  r.leave = chance(0.15) ? 1 + int(rng() % 2) : 0;
  r.expected_choices = size_t(n) * prompts;
  return r;
}

// The body of an HTTP/1.1 answer, with a chunked one put back together.
inline std::string http_body(const std::string& reply) {
  const size_t start = reply.find("\r\n\r\n");
  if (start == std::string::npos) return "";
  std::string head = reply.substr(0, start);
  for (char& c : head) c = char(std::tolower(static_cast<unsigned char>(c)));
  std::string body = reply.substr(start + 4);
  if (head.find("transfer-encoding: chunked") == std::string::npos) return body;
  std::string out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t len = std::stoul(body.substr(pos, eol - pos), nullptr, 16);
    if (len == 0) break;
    out += body.substr(eol + 2, len);
    pos = eol + 2 + len + 2;
  }
  return out;
}

struct RandomRunReport {
  std::atomic<int> answered{0}, refused{0}, left{0};
  std::mutex mu;
  std::vector<std::string> problems;
  void problem(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    problems.push_back(what);
  }
};

// What a reader of request `r` got wrong in `reply`; empty when it is fine.
inline std::string check_random_answer(const RandomRequest& r, const std::string& reply) {
  const std::string what = r.body.dump().substr(0, 300) + " -> " + reply.substr(0, 400);
  if (reply.rfind("HTTP/1.1 ", 0) != 0) return "no HTTP answer: " + what;
  const int status = std::atoi(reply.c_str() + 9);
  const std::string body = http_body(reply);
  if (status >= 500) return "a " + std::to_string(status) + ": " + what;
  if (status != 200) {
    const auto j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_object() || !j.contains("error")) return "an error without \"error\": " + what;
    return "";
  }
  if (r.stream) {
    bool done = false;
    for (const std::string& data : sse_payloads(body, &done)) {
      const auto j = nlohmann::json::parse(data, nullptr, false);
      if (!j.is_object()) return "an event that is not JSON: " + data.substr(0, 200);
      if (j.contains("error")) return "an error event: " + data.substr(0, 300) + " for " + what;
    }
    return done ? "" : "a stream without [DONE]: " + what;
  }
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("choices")) return "no choices: " + what;
  if (r.expected_choices != 0 && j["choices"].size() != r.expected_choices)
    return std::to_string(j["choices"].size()) + " choices, not " +
           std::to_string(r.expected_choices) + ": " + what;
  return "";
}

// Sends `count` random requests (seeds seed..seed+count-1) from `concurrency` clients.
inline void run_random_requests(int port, int count, int concurrency, uint32_t seed,
                                RandomRunReport* report) {
  std::atomic<int> next{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < concurrency; ++c) {
    clients.emplace_back([&] {
      for (int i; (i = next++) < count;) {
        const RandomRequest r = random_request(seed + uint32_t(i));
        RawConnection conn(port);
        if (!conn.connected() ||
            !conn.send(http_post(r.path, r.body.dump(), "Connection: close\r\n"))) {
          report->problem("could not send request " + std::to_string(i));
          continue;
        }
        if (r.leave != 0) {
          std::string some;
          if (r.leave == 2) conn.read_until("\r\n\r\n", 30000);
          conn.read_for(int(seed + uint32_t(i)) % 50, &some);
          conn.reset();
          ++report->left;
          continue;
        }
        const std::string reply = conn.read_until("", 120000);
        const std::string wrong = check_random_answer(r, reply);
        if (!wrong.empty()) report->problem("request " + std::to_string(i) + ": " + wrong);
        (reply.rfind("HTTP/1.1 200", 0) == 0 ? report->answered : report->refused)++;
      }
    });
  }
  for (auto& t : clients) t.join();
}

// Sends random_request_count() random requests from 8 clients and expects every answer to keep
// the rules above and more than half of them answered; prints the tally.
inline void expect_random_requests_answered_well(int port, uint32_t seed) {
  RandomRunReport report;
  run_random_requests(port, random_request_count(), 8, seed, &report);
  std::string problems;
  for (const std::string& p : report.problems) problems += "\n  " + p;
  EXPECT_TRUE(report.problems.empty()) << report.problems.size() << " problems:" << problems;
  EXPECT_GT(report.answered.load(), random_request_count() / 2);
  std::printf("    %d random requests: %d answered, %d refused (400), %d clients left\n",
              random_request_count(), report.answered.load(), report.refused.load(),
              report.left.load());
}

}  // namespace e2e
