// Dataset construction. The random prompt of request i is the token ids
// (offset_i + i + [0, len)) % vocab decoded to text; since decode/encode is not a bijection, the
// text is re-encoded and trimmed (then decoded again) until it has exactly `len` tokens.
#include "bench/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "httpclient/http_json.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace bench {
namespace {

using common::Result;
using nlohmann::json;

class LocalTokenizer : public TokenizerAccess {
 public:
  explicit LocalTokenizer(std::unique_ptr<tokenizer::Tokenizer> t) : t_(std::move(t)) {}
  Result<std::vector<int32_t>> encode(const std::string& text) override { return t_->encode(text); }
  Result<std::string> decode(const std::vector<int32_t>& ids) override {
    return tokenizer::sanitize_utf8(t_->decode(ids));
  }
  int32_t vocab_size() const override { return std::min<int32_t>(t_->vocab_size(), 128000); }

 private:
  std::unique_ptr<tokenizer::Tokenizer> t_;
};

class ServerTokenizer : public TokenizerAccess {
 public:
  ServerTokenizer(std::string base, std::vector<std::string> headers)
      : base_(std::move(base)), headers_(std::move(headers)) {}
  Result<std::vector<int32_t>> encode(const std::string& text) override {
    CP_ASSIGN_OR_RETURN(
        json r, httpclient::http_json(
                    base_ + "/tokenize",
                    json({{"prompt", text}, {"add_special_tokens", false}}).dump(), headers_));
    return r["tokens"].get<std::vector<int32_t>>();
  }
  Result<std::string> decode(const std::vector<int32_t>& ids) override {
    CP_ASSIGN_OR_RETURN(json r, httpclient::http_json(base_ + "/detokenize",
                                                      json({{"tokens", ids}}).dump(), headers_));
    return r["prompt"].get<std::string>();
  }
  int32_t vocab_size() const override { return 128000; }

 private:
  std::string base_;
  std::vector<std::string> headers_;
};

int64_t uniform_len(std::mt19937_64& rng, int64_t len, double ratio) {
  const int64_t lo = static_cast<int64_t>(std::floor(len * (1 - ratio)));
  const int64_t hi = static_cast<int64_t>(std::ceil(len * (1 + ratio)));
  return std::uniform_int_distribution<int64_t>(std::max<int64_t>(lo, 1),
                                                std::max<int64_t>(hi, 1))(rng);
}

// Text of exactly `len` tokens (when the tokenizer allows) starting from `ids`.
Result<std::string> aligned_prompt(std::vector<int32_t> ids, int64_t len, TokenizerAccess& tok) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    CP_ASSIGN_OR_RETURN(std::string text, tok.decode(ids));
    CP_ASSIGN_OR_RETURN(std::vector<int32_t> again, tok.encode(text));
    if (static_cast<int64_t>(again.size()) == len) return text;
    if (static_cast<int64_t>(again.size()) > len) {
      again.resize(len);
    } else {
      while (static_cast<int64_t>(again.size()) < len)
        again.push_back(ids[again.size() % ids.size()]);
    }
    ids = std::move(again);
  }
  return tok.decode(ids);
}

Result<int64_t> sample_length(const json& spec, std::mt19937_64& rng, const std::string& where) {
  // Lengths are token counts: at least 1, and far below what an int64 holds, so that every
  // cast below is defined.
  constexpr double kMaxLength = 1e9;
  if (!spec.is_object()) return common::invalid_argument(where + " must be an object");
  if (spec.contains("Method") && !spec["Method"].is_string())
    return common::invalid_argument(where + ".Method must be a string");
  if (spec.contains("Params") && !spec["Params"].is_object())
    return common::invalid_argument(where + ".Params must be an object");
  const std::string method = spec.value("Method", "");
  const json params = spec.value("Params", json::object());
  auto num = [&](const char* k) -> Result<double> {
    if (!params.contains(k) || !params[k].is_number()) {
      return common::invalid_argument(where + ".Params." + k + " must be a number");
    }
    return params[k].get<double>();
  };
  if (method == "fixed") {
    CP_ASSIGN_OR_RETURN(double v, num("Value"));
    if (!(v >= 1 && v <= kMaxLength))
      return common::invalid_argument(where + ".Params.Value must be in [1, 1e9]");
    return static_cast<int64_t>(v);
  }
  CP_ASSIGN_OR_RETURN(double lo, num("MinValue"));
  CP_ASSIGN_OR_RETURN(double hi, num("MaxValue"));
  if (!(lo >= 1 && hi >= lo && hi <= kMaxLength))
    return common::invalid_argument(where + ": need 1 <= MinValue <= MaxValue <= 1e9");
  if (method == "uniform") {
    return std::uniform_int_distribution<int64_t>(static_cast<int64_t>(lo),
                                                  static_cast<int64_t>(hi))(rng);
  }
  if (method == "gaussian") {
    CP_ASSIGN_OR_RETURN(double mean, num("Mean"));
    CP_ASSIGN_OR_RETURN(double var, num("Var"));
    const double v = std::normal_distribution<double>(mean, std::sqrt(std::max(var, 0.0)))(rng);
    return static_cast<int64_t>(std::clamp(std::round(v), lo, hi));
  }
  return common::invalid_argument(where + ".Method '" + method +
                                  "' is not one of uniform, gaussian, fixed");
}

}  // namespace

Result<std::unique_ptr<TokenizerAccess>> local_tokenizer(const std::string& dir) {
  CP_ASSIGN_OR_RETURN(auto t, tokenizer::Tokenizer::load(dir));
  return std::unique_ptr<TokenizerAccess>(new LocalTokenizer(std::move(t)));
}

std::unique_ptr<TokenizerAccess> server_tokenizer(const std::string& base_url,
                                                  const std::vector<std::string>& headers) {
  return std::make_unique<ServerTokenizer>(base_url, headers);
}

Result<std::vector<SampleRequest>> random_dataset(const RandomDatasetConfig& c,
                                                  TokenizerAccess& tok) {
  if (c.range_ratio < 0 || c.range_ratio >= 1) {
    return common::invalid_argument("--random-range-ratio must be in [0, 1), got " +
                                    std::to_string(c.range_ratio));
  }
  std::mt19937_64 rng(c.seed);
  const int32_t vocab = tok.vocab_size();
  std::vector<int32_t> prefix(c.prefix_len);
  for (auto& id : prefix) id = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
  std::vector<SampleRequest> out;
  for (int64_t i = 0; i < c.num_prompts; ++i) {
    const int64_t in_len = uniform_len(rng, c.input_len, c.range_ratio);
    const int64_t out_len = uniform_len(rng, c.output_len, c.range_ratio);
    const int64_t offset = std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng);
    std::vector<int32_t> ids = prefix;
    for (int64_t k = 0; k < in_len; ++k)
      ids.push_back(static_cast<int32_t>((offset + i + k) % vocab));
    CP_ASSIGN_OR_RETURN(std::string prompt, aligned_prompt(ids, c.prefix_len + in_len, tok));
    out.push_back({prompt, c.prefix_len + in_len, out_len});
  }
  return out;
}

Result<std::vector<SampleRequest>> sharegpt_dataset(const std::string& path, int64_t num_prompts,
                                                    int64_t output_len, uint64_t seed,
                                                    TokenizerAccess& tok) {
  std::ifstream in(path);
  if (!in) return common::not_found(path + ": cannot open the dataset");
  json data = json::parse(in, nullptr, false);
  if (data.is_discarded() || !data.is_array())
    return common::invalid_argument(path + ": not a JSON list");
  std::vector<size_t> order(data.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  std::vector<SampleRequest> out;
  for (size_t idx : order) {
    if (static_cast<int64_t>(out.size()) >= num_prompts) break;
    const json& e = data[idx];
    if (!e.is_object() || !e.contains("conversations") || !e["conversations"].is_array() ||
        e["conversations"].size() < 2)
      continue;
    const json& conv = e["conversations"];
    if (!conv[0].contains("value") || !conv[1].contains("value") || !conv[0]["value"].is_string() ||
        !conv[1]["value"].is_string())
      continue;
    const std::string prompt = conv[0]["value"], reply = conv[1]["value"];
    CP_ASSIGN_OR_RETURN(auto prompt_ids, tok.encode(prompt));
    int64_t out_len = output_len;
    if (out_len <= 0) {
      CP_ASSIGN_OR_RETURN(auto reply_ids, tok.encode(reply));
      out_len = static_cast<int64_t>(reply_ids.size());
    }
    const int64_t p = static_cast<int64_t>(prompt_ids.size());
    // vLLM's filter: drop very short and overly long pairs.
    if (p < 4 || (output_len <= 0 && out_len < 4) || p > 1024 || p + out_len > 2048) continue;
    out.push_back({prompt, p, out_len});
  }
  if (out.empty()) return common::invalid_argument(path + ": no usable conversations");
  return out;
}

Result<std::vector<SampleRequest>> synthetic_dataset(const std::string& path, uint64_t seed,
                                                     TokenizerAccess& tok) {
  std::ifstream in(path);
  if (!in) return common::not_found(path + ": cannot open the synthetic config");
  json c = json::parse(in, nullptr, false);
  if (c.is_discarded() || !c.is_object())
    return common::invalid_argument(path + ": not a JSON object");
  if (c.contains("synthetic_config")) c = c["synthetic_config"];
  if (!c.contains("RequestCount") || !c["RequestCount"].is_number_integer() ||
      c["RequestCount"].get<int64_t>() < 1) {
    return common::invalid_argument(path + ": RequestCount must be a positive integer");
  }
  if (!c.contains("StringConfig") || !c["StringConfig"].is_object()) {
    return common::invalid_argument(path + ": StringConfig with Input and Output is required");
  }
  const json& sc = c["StringConfig"];
  std::mt19937_64 rng(seed);
  const int32_t vocab = tok.vocab_size();
  std::vector<SampleRequest> out;
  for (int64_t i = 0; i < c["RequestCount"].get<int64_t>(); ++i) {
    CP_ASSIGN_OR_RETURN(int64_t in_len, sample_length(sc.value("Input", json::object()), rng,
                                                      path + ": StringConfig.Input"));
    CP_ASSIGN_OR_RETURN(int64_t out_len, sample_length(sc.value("Output", json::object()), rng,
                                                       path + ": StringConfig.Output"));
    const int64_t offset = std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng);
    std::vector<int32_t> ids;
    for (int64_t k = 0; k < in_len; ++k)
      ids.push_back(static_cast<int32_t>((offset + i + k) % vocab));
    CP_ASSIGN_OR_RETURN(std::string prompt, aligned_prompt(ids, in_len, tok));
    out.push_back({prompt, in_len, out_len});
  }
  return out;
}

}  // namespace bench
