// generation_config.json -> the sampling defaults vLLM applies to requests.
#include "api/generation_defaults.h"

#include <cmath>

namespace api {
namespace {

using nlohmann::json;

std::optional<double> number_unless(const json& c, const char* key, double hf_default) {
  if (!c.contains(key) || !c[key].is_number()) return std::nullopt;
  const double v = c[key].get<double>();
  if (!std::isfinite(v) || v == hf_default) return std::nullopt;
  return v;
}

std::string repr(double v) {
  json j = v;
  std::string s = j.dump();
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

SamplingDefaults sampling_defaults_from_generation_config(const json& c) {
  SamplingDefaults d;
  if (!c.is_object()) return d;
  d.repetition_penalty = number_unless(c, "repetition_penalty", 1.0);
  d.temperature = number_unless(c, "temperature", 1.0);
  d.top_p = number_unless(c, "top_p", 1.0);
  d.min_p = number_unless(c, "min_p", std::nan(""));  // no HF default: any number counts
  if (c.contains("top_k") && c["top_k"].is_number_integer() && c["top_k"].get<int64_t>() != 50 &&
      c["top_k"].get<int64_t>() >= -1 && c["top_k"].get<int64_t>() <= INT32_MAX) {
    d.top_k = static_cast<int32_t>(c["top_k"].get<int64_t>());
  }
  if (c.contains("max_new_tokens") && c["max_new_tokens"].is_number_integer() &&
      c["max_new_tokens"].get<int64_t>() > 0) {
    d.max_tokens = c["max_new_tokens"].get<int64_t>();
  }
  return d;
}

std::optional<std::string> apply_generation_overrides(const json& overrides, SamplingDefaults* d) {
  if (!overrides.is_object()) return "--override-generation-config must be a JSON object";
  auto bad = [](const char* key, const char* what) {
    return std::string("--override-generation-config: '") + key + "' must be " + what;
  };
  auto number = [&](const char* key, std::optional<double>* out) -> std::optional<std::string> {
    if (!overrides.contains(key) || overrides[key].is_null()) return std::nullopt;
    if (!overrides[key].is_number() || !std::isfinite(overrides[key].get<double>()))
      return bad(key, "a number");
    *out = overrides[key].get<double>();
    return std::nullopt;
  };
  for (auto [key, out] :
       {std::pair{"temperature", &d->temperature}, std::pair{"top_p", &d->top_p},
        std::pair{"min_p", &d->min_p}, std::pair{"repetition_penalty", &d->repetition_penalty}}) {
    if (auto e = number(key, out)) return e;
  }
  if (overrides.contains("top_k") && !overrides["top_k"].is_null()) {
    const json& k = overrides["top_k"];
    if (!k.is_number_integer() || k.get<int64_t>() < -1 || k.get<int64_t>() > INT32_MAX)
      return bad("top_k", "an integer of at least -1");
    d->top_k = static_cast<int32_t>(k.get<int64_t>());
  }
  if (overrides.contains("max_new_tokens") && !overrides["max_new_tokens"].is_null()) {
    const json& n = overrides["max_new_tokens"];
    if (!n.is_number_integer() || n.get<int64_t>() < 1)
      return bad("max_new_tokens", "a positive integer");
    d->max_tokens = n.get<int64_t>();
  }
  return std::nullopt;
}

std::string sampling_defaults_repr(const SamplingDefaults& d) {
  std::string out;
  auto add = [&](const char* key, const std::string& value) {
    out += (out.empty() ? "" : ", ") + std::string("'") + key + "': " + value;
  };
  if (d.repetition_penalty) add("repetition_penalty", repr(*d.repetition_penalty));
  if (d.temperature) add("temperature", repr(*d.temperature));
  if (d.top_k) add("top_k", std::to_string(*d.top_k));
  if (d.top_p) add("top_p", repr(*d.top_p));
  if (d.min_p) add("min_p", repr(*d.min_p));
  if (d.max_tokens) add("max_tokens", std::to_string(*d.max_tokens));
  return "{" + out + "}";
}

}  // namespace api
