// What the parallel-serving e2e tests (TP, DP) share: the small server flags, the 8 numbered
// prompts of growing length, and a greedy completion read whole or assembled from its stream.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server_process.h"

namespace e2e {

inline std::vector<std::string> parallel_flags(std::vector<std::string> extra) {
  std::vector<std::string> f = {"--served-model-name", "m",  "--max-model-len",          "1024",
                                "--block-size",        "16", "--kv-cache-memory",        "16000000",
                                "--threads",           "1",  "--max-num-batched-tokens", "256"};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

inline std::string numbered_prompt(int i) {
  std::string p = "prompt " + std::to_string(i) + ":";
  for (int w = 0; w < 5 + i * 9; ++w) p += " w" + std::to_string((w * 7 + i) % 31);
  return p;
}

// The text of a completions stream's chunks, in order.
inline std::string stream_text(const std::string& body) {
  std::string text;
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]") continue;
    const nlohmann::json chunk = nlohmann::json::parse(line.substr(6), nullptr, false);
    if (chunk.is_object() && chunk.contains("choices") && !chunk["choices"].empty())
      text += chunk["choices"][0].value("text", "");
  }
  return text;
}

// The completion of `body` (a /v1/completions request), whole or streamed; "<error: ...>" when
// the server does not answer 200.
inline std::string complete(const ServerProcess& s, nlohmann::json body, bool stream,
                            const std::string& request_id = "") {
  auto c = s.client();
  body["stream"] = stream;
  httplib::Headers headers;
  if (!request_id.empty()) headers.emplace("X-Request-Id", request_id);
  auto r = c.Post("/v1/completions", headers, body.dump(), "application/json");
  if (!r || r->status != 200) return "<error: " + (r ? r->body : std::string("no answer")) + ">";
  if (stream) return stream_text(r->body);
  return nlohmann::json::parse(r->body)["choices"][0]["text"].get<std::string>();
}

// Greedy completion of numbered prompt i.
inline nlohmann::json greedy(int i, int max_tokens = 12) {
  return {{"prompt", numbered_prompt(i)},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

}  // namespace e2e
