// Small text helpers shared by the streaming parsers (reasoning split, tool calls), which must
// hold back bytes that could still become a marker. Pure functions; thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace common {

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
inline size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  if (marker.empty()) return 0;
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace common
