// UTF-8 scanning shared by sanitize_utf8 and the incremental detokenizer, so both cut the byte
// stream at the same character boundaries.
#include "tokenizer/detokenizer.h"

namespace tokenizer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the valid UTF-8 sequence at s[i]: > 0 valid, 0 invalid lead or continuation,
// -1 a valid prefix cut off by the end of s.
int sequence_length(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  int len;
  uint32_t min_cp;
  if (b0 < 0x80) return 1;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    min_cp = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    min_cp = 0x800;
  } else if ((b0 & 0xF8) == 0xF0 && b0 <= 0xF4) {
    len = 4;
    min_cp = 0x10000;
  } else {
    return 0;
  }
  uint32_t cp = b0 & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return -1;
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
    // Reject overlong forms and surrogates as early as the second byte allows.
    if (k == 1 && ((len == 3 && b0 == 0xE0 && b < 0xA0) || (len == 3 && b0 == 0xED && b >= 0xA0) ||
                   (len == 4 && b0 == 0xF0 && b < 0x90) || (len == 4 && b0 == 0xF4 && b >= 0x90))) {
      return 0;
    }
  }
  return cp < min_cp ? 0 : len;
}

// Appends the sanitized bytes of s[0, end) to out, where end is the start of a trailing
// truncated sequence (or s.size() when `final`). Returns end.
size_t append_sanitized(std::string_view s, bool final, std::string* out) {
  size_t i = 0;
  while (i < s.size()) {
    const int len = sequence_length(s, i);
    if (len > 0) {
      out->append(s.substr(i, len));
      i += len;
    } else if (len == -1 && !final) {
      return i;
    } else {
      out->append(kReplacement);
      ++i;
    }
  }
  return i;
}

}  // namespace

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  append_sanitized(bytes, true, &out);
  return out;
}

void IncrementalDetokenizer::seed(std::span<const int32_t> prompt_ids) {
  // A UTF-8 character is at most 4 bytes: the last 3 tokens hold any unfinished one.
  std::string tail;
  const size_t from = prompt_ids.size() > 3 ? prompt_ids.size() - 3 : 0;
  for (size_t i = from; i < prompt_ids.size(); ++i) {
    if (prompt_ids[i] < 0 || prompt_ids[i] >= tokenizer_.vocab_size()) return;
    if (skip_special_tokens_ && tokenizer_.is_special(prompt_ids[i])) continue;
    tail += tokenizer_.token_bytes(prompt_ids[i]);
  }
  std::string ignored;
  pending_ = tail.substr(append_sanitized(tail, false, &ignored));
}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_tokens_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id);
  std::string out;
  const size_t used = append_sanitized(pending_, false, &out);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace tokenizer
