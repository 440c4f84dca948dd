// Benchmark datasets as `vllm bench serve` builds them: random (token-id prompts decoded to
// text and re-aligned to the exact length), ShareGPT JSON files, and AISBench-style synthetic
// configs. Prompts are tokenized with a local tokenizer.json or the server's /tokenize.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/request_result.h"
#include "common/status.h"

namespace bench {

class TokenizerAccess {
 public:
  virtual ~TokenizerAccess() = default;
  virtual common::Result<std::vector<int32_t>> encode(const std::string& text) = 0;
  virtual common::Result<std::string> decode(const std::vector<int32_t>& ids) = 0;
  virtual int32_t vocab_size() const = 0;  // ids below it are ordinary tokens
};

// A tokenizer.json directory, or the server's /tokenize and /detokenize at base_url.
common::Result<std::unique_ptr<TokenizerAccess>> local_tokenizer(const std::string& dir);
std::unique_ptr<TokenizerAccess> server_tokenizer(const std::string& base_url,
                                                  const std::vector<std::string>& headers);

struct RandomDatasetConfig {
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;
  int64_t prefix_len = 0;
  uint64_t seed = 0;
};

common::Result<std::vector<SampleRequest>> random_dataset(const RandomDatasetConfig& config,
                                                          TokenizerAccess& tokenizer);

// ShareGPT-style: a JSON list of {"conversations": [{"from": "human", "value": ...},
// {"from": "gpt", "value": ...}]}; output length from the reply unless output_len > 0.
common::Result<std::vector<SampleRequest>> sharegpt_dataset(const std::string& path,
                                                            int64_t num_prompts, int64_t output_len,
                                                            uint64_t seed,
                                                            TokenizerAccess& tokenizer);

// AISBench synthetic_config (JSON): RequestCount and StringConfig.Input / .Output with Method
// "uniform" (MinValue, MaxValue), "gaussian" (Mean, Var, MinValue, MaxValue) or "fixed" (Value).
common::Result<std::vector<SampleRequest>> synthetic_dataset(const std::string& path, uint64_t seed,
                                                             TokenizerAccess& tokenizer);

}  // namespace bench
