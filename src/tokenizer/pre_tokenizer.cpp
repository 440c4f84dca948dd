// PCRE2 wrapper. PCRE2 is used rather than std::regex (no \p{..} classes) or RE2 (no
// lookahead, which the DeepSeek pattern `\s+(?!\S)` needs).
#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace tokenizer {

common::Result<std::unique_ptr<RegexSplit>> RegexSplit::create(const std::string& pattern,
                                                               bool is_literal,
                                                               SplitBehavior behavior) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP | (is_literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return common::invalid_argument("bad pre-tokenizer regex at offset " +
                                    std::to_string(error_offset) + ": " +
                                    reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
  std::unique_ptr<RegexSplit> s(new RegexSplit());
  s->code_ = code;
  s->behavior_ = behavior;
  return s;
}

RegexSplit::~RegexSplit() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void RegexSplit::split(std::string_view text, std::vector<std::string_view>* out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  // One match block per thread, freed when the thread exits.
  struct MatchData {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~MatchData() { pcre2_match_data_free(data); }
  };
  thread_local MatchData per_thread;
  pcre2_match_data* match = per_thread.data;
  size_t pos = 0, gap_begin = 0;
  while (pos <= text.size()) {
    int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                         PCRE2_NO_UTF_CHECK, match, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
    const size_t begin = ov[0], end = ov[1];
    if (begin > gap_begin) out->push_back(text.substr(gap_begin, begin - gap_begin));
    if (end > begin && behavior_ == SplitBehavior::kIsolated) {
      out->push_back(text.substr(begin, end - begin));
    }
    gap_begin = end;
    if (end == begin) {  // empty match: step over one UTF-8 character
      pos = end + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    } else {
      pos = end;
    }
  }
  if (gap_begin < text.size()) out->push_back(text.substr(gap_begin));
}

}  // namespace tokenizer
