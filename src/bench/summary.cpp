// vLLM's metric definitions: TPOT = (latency - TTFT) / (output - 1) for outputs > 1, ITL over
// all successive chunk gaps, goodput = requests meeting every SLO, peak output tokens/s over
// one-second bins.
#include "bench/summary.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <numeric>

namespace bench {
namespace {

std::string line_int(const std::string& name, int64_t v) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%-40s %-10lld\n", name.c_str(), static_cast<long long>(v));
  return buf;
}

std::string line_float(const std::string& name, double v) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%-40s %-10.2f\n", name.c_str(), v);
  return buf;
}

std::string header(const std::string& title, char fill) {
  const int n = 50, len = static_cast<int>(title.size());
  const int left = (n - len) / 2, right = n - len - left;
  return std::string(std::max(left, 0), fill) + title + std::string(std::max(right, 0), fill) +
         "\n";
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double stddev(const std::vector<double>& v) {
  if (v.empty()) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

std::string pct_name(double p) {
  char buf[32];
  if (p == std::floor(p)) {
    std::snprintf(buf, sizeof(buf), "%d", static_cast<int>(p));
  } else {
    std::snprintf(buf, sizeof(buf), "%g", p);
  }
  return buf;
}

}  // namespace

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

Summary summarize(const std::vector<RequestResult>& results, double duration,
                  const SummaryConfig& c) {
  int64_t completed = 0, failed = 0, total_input = 0, total_output = 0, good = 0;
  std::vector<double> ttfts, tpots, itls, e2els;
  std::vector<std::pair<double, int>> events;  // (+1 at start, -1 at end) for concurrency
  std::map<int64_t, double> tokens_per_second;
  for (const RequestResult& r : results) {
    if (!r.success) {
      ++failed;
      continue;
    }
    ++completed;
    total_input += r.prompt_len;
    total_output += r.output_tokens;
    ttfts.push_back(r.ttft * 1000);
    e2els.push_back(r.latency * 1000);
    double tpot = 0;
    if (r.output_tokens > 1) {
      tpot = (r.latency - r.ttft) / static_cast<double>(r.output_tokens - 1) * 1000;
      tpots.push_back(tpot);
    }
    for (double g : r.itl) itls.push_back(g * 1000);
    events.emplace_back(r.start_time, +1);
    events.emplace_back(r.start_time + r.latency, -1);
    // Tokens by arrival second; the usage count is spread over the chunks that carried them.
    const double per_chunk =
        r.chunk_times.empty() ? 0 : double(r.output_tokens) / double(r.chunk_times.size());
    for (double t : r.chunk_times)
      tokens_per_second[static_cast<int64_t>(std::floor(r.start_time + t))] += per_chunk;
    bool meets = true;
    for (const auto& [metric, slo] : c.goodput_ms) {
      const double v = metric == "ttft"   ? r.ttft * 1000
                       : metric == "tpot" ? tpot
                                          : r.latency * 1000;
      meets = meets && v <= slo;
    }
    good += meets ? 1 : 0;
  }
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.first < b.first || (a.first == b.first && a.second < b.second);
  });
  int cur = 0, peak_concurrency = 0;
  for (const auto& [t, d] : events) peak_concurrency = std::max(peak_concurrency, cur += d);
  double peak_tokens = 0;
  for (const auto& [sec, n] : tokens_per_second) peak_tokens = std::max(peak_tokens, n);

  Summary s;
  auto& j = s.result;
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y%m%d-%H%M%S", std::localtime(&now));
  j["date"] = date;
  j["endpoint_type"] = c.endpoint_type;
  j["backend"] = c.backend;
  j["label"] = c.label.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(c.label);
  j["model_id"] = c.model_id;
  j["tokenizer_id"] = c.tokenizer_id;
  j["num_prompts"] = c.num_prompts;
  j["request_rate"] =
      c.request_rate < 0 ? nlohmann::ordered_json("inf") : nlohmann::ordered_json(c.request_rate);
  j["burstiness"] = c.burstiness;
  j["max_concurrency"] =
      c.max_concurrency ? nlohmann::ordered_json(*c.max_concurrency) : nlohmann::ordered_json();
  j["duration"] = duration;
  j["completed"] = completed;
  j["failed"] = failed;
  j["total_input_tokens"] = total_input;
  j["total_output_tokens"] = total_output;
  j["request_throughput"] = completed / duration;
  j["request_goodput"] =
      c.goodput_ms.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(good / duration);
  j["output_throughput"] = total_output / duration;
  j["total_token_throughput"] = (total_input + total_output) / duration;
  j["max_output_tokens_per_s"] = peak_tokens;
  j["max_concurrent_requests"] = peak_concurrency;

  std::string& t = s.text;
  t += header(" Serving Benchmark Result ", '=');
  t += line_int("Successful requests:", completed);
  t += line_int("Failed requests:", failed);
  if (c.max_concurrency) t += line_int("Maximum request concurrency:", *c.max_concurrency);
  if (c.request_rate >= 0) t += line_float("Request rate configured (RPS):", c.request_rate);
  t += line_float("Benchmark duration (s):", duration);
  t += line_int("Total input tokens:", total_input);
  t += line_int("Total generated tokens:", total_output);
  t += line_float("Request throughput (req/s):", completed / duration);
  if (!c.goodput_ms.empty()) t += line_float("Request goodput (req/s):", good / duration);
  t += line_float("Output token throughput (tok/s):", total_output / duration);
  t += line_float("Peak output token throughput (tok/s):", peak_tokens);
  t += line_float("Peak concurrent requests:", peak_concurrency);
  t += line_float("Total token throughput (tok/s):", (total_input + total_output) / duration);

  struct Metric {
    const char* key;
    const char* title;
    const char* short_name;
    const std::vector<double>* values;
  };
  const Metric metrics[] = {{"ttft", "Time to First Token", "TTFT", &ttfts},
                            {"tpot", "Time per Output Token (excl. 1st token)", "TPOT", &tpots},
                            {"itl", "Inter-token Latency", "ITL", &itls},
                            {"e2el", "End-to-end Latency", "E2EL", &e2els}};
  for (const Metric& m : metrics) {
    const bool selected = std::find(c.percentile_metrics.begin(), c.percentile_metrics.end(),
                                    m.key) != c.percentile_metrics.end();
    const std::string k = m.key;
    j["mean_" + k + "_ms"] = mean(*m.values);
    j["median_" + k + "_ms"] = percentile(*m.values, 50);
    j["std_" + k + "_ms"] = stddev(*m.values);
    for (double p : c.metric_percentiles)
      j["p" + pct_name(p) + "_" + k + "_ms"] = percentile(*m.values, p);
    if (!selected) continue;
    t += header(std::string(m.title), '-');
    t += line_float(std::string("Mean ") + m.short_name + " (ms):", mean(*m.values));
    t += line_float(std::string("Median ") + m.short_name + " (ms):", percentile(*m.values, 50));
    for (double p : c.metric_percentiles) {
      t += line_float("P" + pct_name(p) + " " + m.short_name + " (ms):", percentile(*m.values, p));
    }
  }
  t += std::string(50, '=') + "\n";

  // Per-request arrays.
  auto& input_lens = j["input_lens"] = nlohmann::ordered_json::array();
  auto& output_lens = j["output_lens"] = nlohmann::ordered_json::array();
  auto& ttft_arr = j["ttfts"] = nlohmann::ordered_json::array();
  auto& itl_arr = j["itls"] = nlohmann::ordered_json::array();
  auto& starts = j["start_times"] = nlohmann::ordered_json::array();
  auto& texts = j["generated_texts"] = nlohmann::ordered_json::array();
  auto& errors = j["errors"] = nlohmann::ordered_json::array();
  for (const RequestResult& r : results) {
    input_lens.push_back(r.prompt_len);
    output_lens.push_back(r.success ? r.output_tokens : 0);
    ttft_arr.push_back(r.success ? r.ttft : 0.0);
    itl_arr.push_back(r.itl);
    starts.push_back(r.start_time);
    texts.push_back(r.generated_text);
    errors.push_back(r.error);
  }
  return s;
}

}  // namespace bench
