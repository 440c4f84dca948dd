// Bounded parsing. nlohmann's parser is iterative, and so is the destructor of what it builds;
// the recursive parts (dump, copies, comparisons) are safe once the depth is bounded here.
#include "api/json_fields.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>

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

namespace {

std::string_view trim_spaces(std::string_view s) {
  const size_t first = s.find_first_not_of(" \t\n\r\f\v");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\n\r\f\v") - first + 1);
}

// "[+-]digits" with an optional "." and zeros after it, as an int64; nullopt otherwise.
std::optional<int64_t> integer_text(std::string_view s) {
  s = trim_spaces(s);
  if (const size_t dot = s.find('.'); dot != std::string_view::npos) {
    if (s.find_first_not_of('0', dot + 1) != std::string_view::npos) return std::nullopt;
    s = s.substr(0, dot);
  }
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  int64_t x = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return x;
}

}  // namespace

std::optional<json> lax_convert(const json& v, LaxType type) {
  switch (type) {
    case LaxType::kBool:
      if (v.is_number_integer() || v.is_number_float()) {
        const double x = v.get<double>();
        if (x == 0 || x == 1) return json(x == 1);
      } else if (v.is_string()) {
        std::string s = v.get<std::string>();
        std::transform(s.begin(), s.end(), s.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        for (const char* t : {"1", "on", "t", "true", "y", "yes"})
          if (s == t) return json(true);
        for (const char* f : {"0", "off", "f", "false", "n", "no"})
          if (s == f) return json(false);
      }
      return std::nullopt;
    case LaxType::kInteger:
      if (v.is_boolean()) return json(v.get<bool>() ? 1 : 0);
      if (v.is_number_float()) {
        const double x = v.get<double>();
        // Below 2^63: the cast is exact and cannot overflow.
        if (std::isfinite(x) && std::trunc(x) == x && std::fabs(x) < 9223372036854775808.0)
          return json(static_cast<int64_t>(x));
      } else if (v.is_string()) {
        if (auto x = integer_text(v.get_ref<const std::string&>())) return json(*x);
      }
      return std::nullopt;
    case LaxType::kNumber:
      if (v.is_boolean()) return json(v.get<bool>() ? 1.0 : 0.0);
      if (v.is_string()) {
        const std::string s(trim_spaces(v.get_ref<const std::string&>()));
        if (s.empty() || s.find_first_not_of("0123456789+-.eE") != std::string::npos)
          return std::nullopt;  // strtod would also take hex, "inf" and "nan"
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (std::isfinite(x) && end == s.c_str() + s.size()) return json(x);
      }
      return std::nullopt;
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
