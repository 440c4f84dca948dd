// Request bodies, arrivals, and the timed run.
#include "bench/serve_run.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "common/timer.h"
#include "httpclient/sse_client.h"

namespace bench {

using nlohmann::json;

std::string request_body(const SampleRequest& s, const ServeRunOptions& o) {
  json body = o.extra_body;
  body["model"] = o.model;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (o.chat) {
    body["messages"] = json::array(
        {{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", s.prompt}}})}}});
    body["max_completion_tokens"] = s.expected_output_len;
  } else {
    body["prompt"] = s.prompt;
    body["max_tokens"] = s.expected_output_len;
    body["repetition_penalty"] = 1.0;
    body["logprobs"] = o.logprobs ? json(*o.logprobs) : json(nullptr);
  }
  if (o.ignore_eos) body["ignore_eos"] = true;
  if (o.temperature) body["temperature"] = *o.temperature;
  if (o.top_p) body["top_p"] = *o.top_p;
  if (o.top_k) body["top_k"] = *o.top_k;
  if (o.min_p) body["min_p"] = *o.min_p;
  return body.dump();
}

std::vector<double> arrival_times(size_t n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> at(n, 0.0);
  if (rate <= 0) return at;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double t = 0;
  for (size_t i = 0; i < n; ++i) {
    at[i] = t;
    t += gap(rng);
  }
  return at;
}

ServeRunResult run_serve_benchmark(const std::vector<SampleRequest>& samples,
                                   const ServeRunOptions& o) {
  const std::vector<double> at =
      arrival_times(samples.size(), o.request_rate, o.burstiness, o.seed);
  std::vector<httpclient::HttpRequestSpec> specs;
  for (size_t i = 0; i < samples.size(); ++i) {
    httpclient::HttpRequestSpec spec{o.url, request_body(samples[i], o), o.headers, at[i]};
    spec.headers.push_back("x-request-id: " + o.request_id_prefix + "-" + std::to_string(i));
    specs.push_back(std::move(spec));
  }
  httpclient::SseClient client;
  ServeRunResult out;
  if (o.ready_check_timeout_s > 0 && !specs.empty()) {
    std::printf("Starting initial single prompt test run...\n");
    std::fflush(stdout);
    httpclient::HttpRequestSpec first = specs.front();
    first.send_at = 0;
    const double deadline = common::now_seconds() + o.ready_check_timeout_s;
    for (;;) {
      const RequestResult r = client.run({first}, 1, {}).front();
      if (r.success) break;
      if (common::now_seconds() + 1 > deadline) {
        char seconds[32];
        std::snprintf(seconds, sizeof(seconds), "%g", o.ready_check_timeout_s);
        out.ready_check_error =
            std::string("the endpoint did not answer the first request within ") + seconds +
            " s (last error: " + r.error + ")";
        return out;
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    std::printf("Initial test run completed.\n");
  } else {
    std::printf("Skipping endpoint ready check.\n");
  }
  if (o.num_warmups > 0) {
    std::printf("Warming up with %lld requests...\n", static_cast<long long>(o.num_warmups));
    std::vector<httpclient::HttpRequestSpec> warm(
        specs.begin(), specs.begin() + std::min<size_t>(size_t(o.num_warmups), specs.size()));
    for (auto& w : warm) w.send_at = 0;
    client.run(warm, o.max_concurrency.value_or(0), {});
    std::printf("Warmup run completed.\n");
  }
  // Python's float repr, as vLLM prints it (20.0, 0.5).
  const std::string rate = o.request_rate < 0 ? "inf" : json(o.request_rate).dump();
  std::printf("Traffic request rate: %s\n", rate.c_str());
  std::printf("Burstiness factor: %.1f (%s)\n", o.burstiness,
              o.burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
  std::printf("Maximum request concurrency: %s\n",
              o.max_concurrency ? std::to_string(*o.max_concurrency).c_str() : "None");
  std::fflush(stdout);
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  const size_t total = specs.size();
  const double start = common::now_seconds();
  out.results = client.run(specs, o.max_concurrency.value_or(0), [&](size_t done) {
    if (!o.progress) return;
    const int width = 40, filled = static_cast<int>(width * done / total);
    std::fprintf(stderr, "\r%3d%%|%s%s| %zu/%zu [%.1fs]", static_cast<int>(100 * done / total),
                 std::string(filled, '#').c_str(), std::string(width - filled, ' ').c_str(), done,
                 total, common::now_seconds() - start);
    if (done == total) std::fprintf(stderr, "\n");
  });
  out.duration_s = common::now_seconds() - start;
  for (size_t i = 0; i < out.results.size(); ++i) {
    if (out.results[i].success && out.results[i].prompt_len == 0)
      out.results[i].prompt_len = samples[i].prompt_len;
  }
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  auto cpu_seconds = [](const rusage& u) {
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  out.client_cpu_ms_per_request = (cpu_seconds(after) - cpu_seconds(before)) * 1000 /
                                  double(std::max<size_t>(out.results.size(), 1));
  return out;
}

}  // namespace bench
