// The request side of tool calling, as vLLM's request model types it: `tools` entries and
// `tool_choice` (none, auto, required, or one named function). Errors name the field. Pure.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "api/protocol.h"

namespace api {

// `tools`: a list of {"type": "function", "function": {"name": str, "description": str?,
// "parameters": object?}}.
std::optional<ApiError> validate_tools(const nlohmann::json& tools);

struct ToolChoice {
  enum class Mode { kNone, kAuto, kRequired, kNamed };
  Mode mode = Mode::kNone;
  std::string name;          // kNamed
  const char* text() const;  // "none", "auto", "required", "named"
};

// The body's tools and tool_choice (chat requests): tools are validated, the default choice is
// auto with tools and none without, and a named function must be one of the tools.
std::optional<ApiError> parse_tool_request(const nlohmann::json& body, ToolChoice* choice);

}  // namespace api
