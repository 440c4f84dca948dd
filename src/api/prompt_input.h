// A completions request's `prompt`, as vLLM accepts it: a string, a list of strings, a list of
// token ids, or a list of token id lists. Parsing checks the shape and that ids lie in the
// vocabulary; tokenizing is the caller's. Pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/protocol.h"

namespace api {

struct PromptInput {
  bool is_text = true;
  std::string text;                // is_text
  std::vector<int32_t> token_ids;  // !is_text
};

// How many prompts the body asks for, before anything is parsed or tokenized.
int64_t count_completion_prompts(const nlohmann::json& body);

std::optional<ApiError> parse_completion_prompts(const nlohmann::json& body, int64_t vocab_size,
                                                 std::vector<PromptInput>* prompts);

}  // namespace api
