// Bounded parsing. nlohmann's parser is iterative, and so is the destructor of what it builds;
// the recursive parts (dump, copies, comparisons) are safe once the depth is bounded here.
#include "api/json_fields.h"

namespace api {

using nlohmann::json;

std::optional<ApiError> parse_json_body(const std::string& text, json* out) {
  bool too_deep = false;
  json::parser_callback_t limit = [&too_deep](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      too_deep = true;
      return false;  // the subtree is parsed but not kept
    }
    return !too_deep;
  };
  try {
    *out = json::parse(text, limit);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e9999
    std::string what = e.what();
    const size_t cut = what.find("] ");  // drop nlohmann's "[json.exception.parse_error.N] "
    if (cut != std::string::npos) what = what.substr(cut + 2);
    return bad_request("Invalid JSON in request body: " + what);
  }
  if (too_deep) {
    return bad_request("The request body nests JSON deeper than " + std::to_string(kMaxJsonDepth) +
                       " levels");
  }
  return std::nullopt;
}

std::string json_type_name(const json& v) {
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_array()) return "list";
  if (v.is_object()) return "object";
  return "null";
}

std::string json_preview(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 100) s = s.substr(0, 100) + "...";
  return s;
}

}  // namespace api
