// serve_load: a minimal closed-loop load generator for `chunkpipe serve` until `chunkpipe bench
// serve` exists: at each concurrency it runs N completions (prompt of ~P words, max_tokens M,
// ignore_eos) and prints requests/s, output tokens/s and median latency.
//   serve_load HOST PORT [--concurrency 1,8,32] [--requests-per-worker 4] [--prompt-words 64]
//              [--max-tokens 32] [--api-key KEY]
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/timer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: serve_load HOST PORT [--concurrency 1,8,32] [--requests-per-worker N] "
                 "[--prompt-words N] [--max-tokens N] [--api-key KEY]\n");
    return 2;
  }
  const std::string host = argv[1];
  const int port = std::stoi(argv[2]);
  std::vector<int> concurrency = {1, 8, 32};
  int per_worker = 4, prompt_words = 64, max_tokens = 32;
  std::string api_key;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--concurrency") {
      concurrency.clear();
      std::stringstream ss(v);
      for (std::string t; std::getline(ss, t, ',');) concurrency.push_back(std::stoi(t));
    } else if (a == "--requests-per-worker") {
      per_worker = std::stoi(v);
    } else if (a == "--prompt-words") {
      prompt_words = std::stoi(v);
    } else if (a == "--max-tokens") {
      max_tokens = std::stoi(v);
    } else if (a == "--api-key") {
      api_key = v;
    } else {
      std::fprintf(stderr, "error: unrecognized argument: %s\n", a.c_str());
      return 2;
    }
  }
  std::printf("%-12s %10s %12s %18s %16s %8s\n", "concurrency", "requests", "requests/s",
              "output tokens/s", "median latency", "errors");
  for (int c : concurrency) {
    std::atomic<int64_t> tokens{0};
    std::atomic<int> errors{0};
    std::mutex mu;
    std::vector<double> latencies;
    const double t0 = common::now_seconds();
    std::vector<std::thread> workers;
    for (int w = 0; w < c; ++w) {
      workers.emplace_back([&, w] {
        httplib::Client client(host, port);
        client.set_read_timeout(600, 0);
        httplib::Headers h;
        if (!api_key.empty()) h.emplace("Authorization", "Bearer " + api_key);
        for (int r = 0; r < per_worker; ++r) {
          std::string prompt;
          for (int k = 0; k < prompt_words; ++k)
            prompt += "w" + std::to_string((w * 7919 + r * 104729 + k * 31) % 5000) + " ";
          nlohmann::json body = {{"prompt", prompt},
                                 {"max_tokens", max_tokens},
                                 {"ignore_eos", true},
                                 {"temperature", 0}};
          const double a = common::now_seconds();
          auto res = client.Post("/v1/completions", h, body.dump(), "application/json");
          const double dt = common::now_seconds() - a;
          if (!res || res->status != 200) {
            ++errors;
            continue;
          }
          tokens += nlohmann::json::parse(res->body)["usage"]["completion_tokens"].get<int64_t>();
          std::lock_guard<std::mutex> lock(mu);
          latencies.push_back(dt);
        }
      });
    }
    for (auto& t : workers) t.join();
    const double elapsed = common::now_seconds() - t0;
    std::sort(latencies.begin(), latencies.end());
    const double median = latencies.empty() ? 0 : latencies[latencies.size() / 2];
    std::printf("%-12d %10zu %12.2f %18.1f %14.3f s %8d\n", c, latencies.size(),
                latencies.size() / elapsed, tokens.load() / elapsed, median, errors.load());
    std::fflush(stdout);
  }
  return 0;
}
