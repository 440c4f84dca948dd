// Request JSON as untrusted input: a depth-bounded parse (so nothing recursive, dump or copy,
// can overflow the stack later) and typed readers of optional fields whose errors name the
// field, its expected type and the value. Scalars convert as pydantic's lax mode converts them
// for vLLM's request models ("16" for an integer); integers must fit: no wrapping.
// Pure functions; thread-safe.
#pragma once

#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "api/protocol.h"

namespace api {

// Nesting deeper than this is refused at parse time.
constexpr int kMaxJsonDepth = 64;

// Parses a request body. Errors: malformed JSON (with line and column), nesting too deep.
std::optional<ApiError> parse_json_body(const std::string& text, nlohmann::json* out);

// "string", "boolean", "integer", "number", "list", "object" or "null".
std::string json_type_name(const nlohmann::json& v);

// The value as an error message shows it: compact, cut after 100 bytes.
std::string json_preview(const nlohmann::json& v);

enum class Nullable { kYes, kNo };

// pydantic's lax conversions (its conversion table), as vLLM validates request fields:
// - a boolean from 0 or 1, 0.0 or 1.0, or a string that lower-cased is one of 0 off f false n no
//   1 on t true y yes;
// - an integer from a boolean, a number with no fractional part, or a string of one (spaces
//   around it allowed; "16.0" counts);
// - a number from a boolean, or a string of a finite number.
// The value converted (as an integer or a number), or nullopt where pydantic refuses it too.
// Strings stay strict: pydantic turns no number into a string.
enum class LaxType { kBool, kInteger, kNumber };
std::optional<nlohmann::json> lax_convert(const nlohmann::json& v, LaxType type);

// Reads body[key] into *out when present; *present says whether it was. A null counts as
// absent for Optional fields (vLLM's Optional[...]) and is an error for the others.
template <typename T>
std::optional<ApiError> read_field(const nlohmann::json& body, const char* key, T* out,
                                   bool* present = nullptr, Nullable nullable = Nullable::kYes) {
  if (present) *present = false;
  if (!body.is_object()) return std::nullopt;
  const auto it = body.find(key);
  if (it == body.end() || (it->is_null() && nullable == Nullable::kYes)) return std::nullopt;
  std::optional<nlohmann::json> converted;
  if constexpr (std::is_same_v<T, bool>) {
    converted = lax_convert(*it, LaxType::kBool);
  } else if constexpr (std::is_integral_v<T>) {
    converted = lax_convert(*it, LaxType::kInteger);
  } else if constexpr (std::is_floating_point_v<T>) {
    converted = lax_convert(*it, LaxType::kNumber);
  }
  const nlohmann::json& v = converted ? *converted : *it;
  bool ok;
  if constexpr (std::is_same_v<T, bool>) {
    ok = v.is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    ok = v.is_number_integer();
    if (ok && v.is_number_unsigned()) {
      ok = v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    } else if (ok) {
      const int64_t x = v.get<int64_t>();
      ok = x >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
           (std::is_unsigned_v<T> || x <= static_cast<int64_t>(std::numeric_limits<T>::max()));
    }
    if (!ok && v.is_number_integer()) {
      return bad_request("'" + std::string(key) + "' must be an integer in [" +
                         std::to_string(std::numeric_limits<T>::min()) + ", " +
                         std::to_string(std::numeric_limits<T>::max()) + "], got " + v.dump());
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    ok = v.is_number();
  } else {
    ok = v.is_string();
  }
  if (!ok) {
    const char* want = std::is_same_v<T, bool>       ? "a boolean"
                       : std::is_integral_v<T>       ? "an integer"
                       : std::is_floating_point_v<T> ? "a number"
                                                     : "a string";
    return bad_request("'" + std::string(key) + "' must be " + want + ", got " +
                       json_type_name(*it) + ": " + json_preview(*it));
  }
  *out = v.get<T>();
  if (present) *present = true;
  return std::nullopt;
}

}  // namespace api
