// tools / tool_choice validation.
#include "api/tool_request.h"

#include <algorithm>

namespace api {

using nlohmann::json;

std::optional<ApiError> validate_tools(const json& tools) {
  const char* shape =
      "must be {\"type\": \"function\", \"function\": {\"name\": ..., \"description\": ..., "
      "\"parameters\": {...}}}";
  if (!tools.is_array()) return bad_request(std::string("'tools' ") + shape + " entries");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = "'tools[" + std::to_string(i) + "]";
    const json& t = tools[i];
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object())
      return bad_request(where + "' " + shape);
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string())
      return bad_request(where + ".function.name' must be a string");
    if (f.contains("description") && !f["description"].is_null() && !f["description"].is_string())
      return bad_request(where + ".function.description' must be a string");
    if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
      return bad_request(where + ".function.parameters' must be an object");
  }
  return std::nullopt;
}

const char* ToolChoice::text() const {
  switch (mode) {
    case Mode::kAuto:
      return "auto";
    case Mode::kRequired:
      return "required";
    case Mode::kNamed:
      return "named";
    case Mode::kNone:
      break;
  }
  return "none";
}

std::optional<ApiError> parse_tool_request(const json& body, ToolChoice* choice) {
  const bool has_tools = body.contains("tools") && !body["tools"].is_null();
  if (has_tools) {
    if (auto e = validate_tools(body["tools"])) return e;
  }
  choice->mode = has_tools ? ToolChoice::Mode::kAuto : ToolChoice::Mode::kNone;
  if (!body.contains("tool_choice") || body["tool_choice"].is_null()) return std::nullopt;
  const char* kShape =
      "'tool_choice' must be 'none', 'auto', 'required' or "
      "{\"type\": \"function\", \"function\": {\"name\": ...}}";
  const json& tc = body["tool_choice"];
  if (tc.is_string()) {
    const std::string v = tc.get<std::string>();
    if (v == "none") {
      choice->mode = ToolChoice::Mode::kNone;
    } else if (v == "auto") {
      choice->mode = ToolChoice::Mode::kAuto;
    } else if (v == "required") {
      choice->mode = ToolChoice::Mode::kRequired;
    } else {
      return bad_request(kShape);
    }
  } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
             tc["function"].contains("name") && tc["function"]["name"].is_string()) {
    choice->mode = ToolChoice::Mode::kNamed;
    choice->name = tc["function"]["name"].get<std::string>();
  } else {
    return bad_request(kShape);
  }
  if (choice->mode != ToolChoice::Mode::kNone && !has_tools)
    return bad_request("When using `tool_choice`, `tools` must be set.");
  if (choice->mode == ToolChoice::Mode::kNamed &&
      std::none_of(body["tools"].begin(), body["tools"].end(),
                   [&](const json& t) { return t["function"]["name"] == choice->name; })) {
    return bad_request("Tool choice function name '" + choice->name +
                       "' doesn't match any tool in 'tools'");
  }
  return std::nullopt;
}

}  // namespace api
