// Streaming detokenization: IncrementalDetokenizer turns token ids into text pieces that never
// end inside a UTF-8 character; concatenated, they equal sanitize_utf8(full decode).
// One instance per stream; not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace tokenizer {

// Replaces each byte that does not start a valid UTF-8 sequence with U+FFFD (as Python's
// errors="replace" does per byte). A truncated sequence at the end is replaced too.
std::string sanitize_utf8(std::string_view bytes);

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // Carries over a character the prompt's last tokens began and did not finish (a prompt of
  // token ids that continues an earlier output, as a PD proxy's recompute round sends it), so
  // that the first output token completes it instead of turning into U+FFFD.
  void seed(std::span<const int32_t> prompt_ids);
  // Text completed by this token (may be empty while a character is still incomplete).
  std::string push(int32_t id);
  // End of stream: whatever is still held, sanitized.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace tokenizer
