// Pre-tokenization: the `Split` regex steps of tokenizer.json (PCRE2 with UTF, UCP and JIT)
// that cut text into pieces before BPE. Compiled once; split() is thread-safe (per-call match
// data).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tokenizer {

enum class SplitBehavior { kIsolated, kRemoved };

class RegexSplit {
 public:
  // `pattern` is a PCRE2 regex, or a literal string when is_literal.
  static common::Result<std::unique_ptr<RegexSplit>> create(const std::string& pattern,
                                                            bool is_literal,
                                                            SplitBehavior behavior);
  ~RegexSplit();
  RegexSplit(const RegexSplit&) = delete;
  RegexSplit& operator=(const RegexSplit&) = delete;

  // Appends to `out` the pieces of `text` (views into it): matches and the gaps between them
  // (kIsolated), or only the gaps (kRemoved). Empty pieces are dropped.
  void split(std::string_view text, std::vector<std::string_view>* out) const;

 private:
  RegexSplit() = default;
  void* code_ = nullptr;  // pcre2_code_8
  SplitBehavior behavior_ = SplitBehavior::kIsolated;
};

}  // namespace tokenizer
