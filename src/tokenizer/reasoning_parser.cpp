// Reasoning split with a held-back tail: at most strlen("</think>") - 1 bytes wait for the
// next delta, so a tag split across deltas is still recognized.
#include "tokenizer/reasoning_parser.h"

#include "common/text.h"

namespace tokenizer {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

}  // namespace

ReasoningDelta ReasoningParser::push(std::string_view text) {
  held_ += text;
  ReasoningDelta d;
  if (at_start_) {
    if (held_.size() < kOpen.size() && kOpen.substr(0, held_.size()) == held_) return d;
    if (held_.compare(0, kOpen.size(), kOpen) == 0) {
      held_.erase(0, kOpen.size());
      in_reasoning_ = true;
    }
    at_start_ = false;
  }
  if (in_reasoning_) {
    const size_t close = held_.find(kClose);
    if (close == std::string::npos) {
      const size_t keep = common::partial_marker_suffix(held_, kClose);
      d.reasoning = held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return d;
    }
    d.reasoning = held_.substr(0, close);
    held_.erase(0, close + kClose.size());
    in_reasoning_ = false;
  }
  d.content = std::move(held_);
  held_.clear();
  return d;
}

ReasoningDelta ReasoningParser::flush() {
  ReasoningDelta d;
  (in_reasoning_ ? d.reasoning : d.content) = std::move(held_);
  held_.clear();
  return d;
}

ReasoningDelta ReasoningParser::split(std::string_view text, bool starts_in_reasoning) {
  ReasoningParser p(starts_in_reasoning);
  ReasoningDelta a = p.push(text), b = p.flush();
  return {a.reasoning + b.reasoning, a.content + b.content};
}

}  // namespace tokenizer
