// The shapes of `prompt`.
#include "api/prompt_input.h"

#include <algorithm>
#include <climits>

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
  auto ids = [&](const json& a) -> bool {
    const bool ok =
        a.is_array() && !a.empty() && std::all_of(a.begin(), a.end(), [&](const json& x) {
          return x.is_number_integer() &&
                 !(x.is_number_unsigned() && x.get<uint64_t>() > INT32_MAX) &&
                 x.get<int64_t>() >= 0 && x.get<int64_t>() < vocab_size;
        });
    if (ok) prompts->push_back({false, {}, a.get<std::vector<int32_t>>()});
    return ok;
  };
  const char* kBadIds = "'prompt' token ids must be integers in [0, vocab size)";
  if (p.is_string()) {
    text(p);
  } else if (p.is_array() && !p.empty() && p[0].is_string()) {
    for (const json& s : p) {
      if (!s.is_string()) return bad_request("'prompt' list must hold only strings");
      text(s);
    }
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    if (!ids(p)) return bad_request(kBadIds);
  } else if (p.is_array() && !p.empty() && p[0].is_array()) {
    for (const json& a : p) {
      if (!ids(a)) return bad_request(kBadIds);
    }
  } else {
    return bad_request(
        "'prompt' must be a string, a list of strings, a list of token ids, or a list of token id "
        "lists");
  }
  return std::nullopt;
}

}  // namespace api
