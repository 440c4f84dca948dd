// The shapes of `prompt`.
#include "api/prompt_input.h"

#include <algorithm>
#include <climits>

#include "api/json_fields.h"

namespace api {

using nlohmann::json;

int64_t count_completion_prompts(const json& body) {
  if (body.contains("prompt") && body["prompt"].is_array() && !body["prompt"].empty() &&
      (body["prompt"][0].is_string() || body["prompt"][0].is_array())) {
    return static_cast<int64_t>(body["prompt"].size());
  }
  return 1;
}

std::optional<ApiError> parse_completion_prompts(const json& body, int64_t vocab_size,
                                                 std::vector<PromptInput>* prompts) {
  if (!body.contains("prompt")) return bad_request("'prompt' is required");
  const json& p = body["prompt"];
  auto text = [&](const json& s) { prompts->push_back({true, s.get<std::string>(), {}}); };
  // A list of ids: each an integer in [0, vocab_size); the error names the first that is not.
  auto ids = [&](const json& a) -> std::optional<ApiError> {
    if (!a.is_array() || a.empty())
      return bad_request("'prompt' token id lists must be non-empty lists of integers");
    for (const json& x : a) {
      if (!x.is_number_integer())
        return bad_request("'prompt' token ids must be integers, got " + json_preview(x));
      const bool in_vocab = !(x.is_number_unsigned() && x.get<uint64_t>() > INT32_MAX) &&
                            x.get<int64_t>() >= 0 && x.get<int64_t>() < vocab_size;
      if (!in_vocab) {
        return bad_request("'prompt' holds token id " + json_preview(x) +
                           ", outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
      }
    }
    prompts->push_back({false, {}, a.get<std::vector<int32_t>>()});
    return std::nullopt;
  };
  if (p.is_string()) {
    text(p);
  } else if (p.is_array() && !p.empty() && p[0].is_string()) {
    for (const json& s : p) {
      if (!s.is_string()) return bad_request("'prompt' list must hold only strings");
      text(s);
    }
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    if (auto e = ids(p)) return e;
  } else if (p.is_array() && !p.empty() && p[0].is_array()) {
    for (const json& a : p) {
      if (auto e = ids(a)) return e;
    }
  } else {
    return bad_request(
        "'prompt' must be a string, a list of strings, a list of token ids, or a list of token id "
        "lists");
  }
  return std::nullopt;
}

}  // namespace api
