// Benchmark figures from per-request results, computed and printed as `vllm bench serve` does
// (summary layout, result JSON keys, numpy-style linear percentiles). Pure functions.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/request_result.h"

namespace bench {

struct SummaryConfig {
  std::string backend = "openai";
  std::string endpoint_type = "openai";
  std::string label;
  std::string model_id;
  std::string tokenizer_id;
  int64_t num_prompts = 0;
  double request_rate = -1;  // < 0: inf
  double burstiness = 1.0;
  std::optional<int> max_concurrency;
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};
  std::vector<double> metric_percentiles = {99};
  std::map<std::string, double> goodput_ms;  // metric -> SLO in ms
};

// numpy.percentile with linear interpolation; 0 for an empty input.
double percentile(std::vector<double> values, double q);

struct Summary {
  nlohmann::ordered_json result;  // vLLM's result JSON keys
  std::string text;               // the printed summary
};

Summary summarize(const std::vector<RequestResult>& results, double duration_s,
                  const SummaryConfig& config);

}  // namespace bench
