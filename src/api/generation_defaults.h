// The model's sampling defaults, as vLLM's `--generation-config auto` takes them from the
// checkpoint's generation_config.json: the sampling fields whose values differ from Hugging
// Face's GenerationConfig defaults. A request's own value always wins. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace api {

struct SamplingDefaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int32_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<int64_t> max_tokens;  // max_new_tokens: an upper bound on every request's

  bool empty() const {
    return !temperature && !top_p && !top_k && !min_p && !repetition_penalty && !max_tokens;
  }
};

// From generation_config.json's object. Fields equal to Hugging Face's defaults (temperature
// 1.0, top_p 1.0, top_k 50, repetition_penalty 1.0) and fields of the wrong type are left out.
SamplingDefaults sampling_defaults_from_generation_config(const nlohmann::json& config);

// --override-generation-config: each sampling field it names replaces the default, whatever its
// value (vLLM merges the overrides after dropping Hugging Face's defaults from the file); keys
// that are not sampling fields are ignored, as vLLM ignores them. An error names a field of the
// wrong type.
std::optional<std::string> apply_generation_overrides(const nlohmann::json& overrides,
                                                      SamplingDefaults* defaults);

// vLLM's log form, a Python dict: {'temperature': 0.6, 'top_p': 0.95}.
std::string sampling_defaults_repr(const SamplingDefaults& defaults);

}  // namespace api
