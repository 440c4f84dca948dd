// One `bench serve` run: the request bodies vLLM's benchmark sends, gamma-distributed arrival
// times (shape = burstiness; Poisson at 1), an optional ready check and warm-up, then every request
// streamed through httpclient::SseClient with vLLM's preamble lines and an optional progress bar.
// Single-threaded.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/request_result.h"

namespace bench {

struct ServeRunOptions {
  bool chat = false;  // /v1/chat/completions bodies (else completions)
  std::string url;    // the endpoint's full URL
  std::vector<std::string> headers;
  std::string model;  // the "model" field
  nlohmann::json extra_body = nlohmann::json::object();
  bool ignore_eos = false;
  std::optional<double> temperature, top_p, min_p;
  std::optional<int> top_k;
  std::optional<int> logprobs;  // completions: logprobs per token (else null, as vLLM sends)
  std::string request_id_prefix = "benchmark-serving";
  double request_rate = -1;  // requests per second; < 0: all at once
  double burstiness = 1.0;
  std::optional<int> max_concurrency;
  int64_t num_warmups = 0;
  // > 0: before anything else, send the first request until one succeeds, for at most this
  // many seconds (vLLM's endpoint ready check); 0 skips it.
  double ready_check_timeout_s = 0;
  uint64_t seed = 0;
  bool progress = false;  // a progress bar on stderr
};

struct ServeRunResult {
  // Set when the ready check ran out of time; nothing was measured then.
  std::optional<std::string> ready_check_error;
  std::vector<RequestResult> results;  // one per sample, in order
  double duration_s = 0;
  double client_cpu_ms_per_request = 0;
};

std::string request_body(const SampleRequest& sample, const ServeRunOptions& options);
// Seconds after the start at which each of n requests is sent.
std::vector<double> arrival_times(size_t n, double request_rate, double burstiness, uint64_t seed);
ServeRunResult run_serve_benchmark(const std::vector<SampleRequest>& samples,
                                   const ServeRunOptions& options);

}  // namespace bench
