// Splits generated text into reasoning_content and content at `</think>` (DeepSeek-V3.1 and
// R1 style), whole or incrementally for streams. One instance per stream; not thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace tokenizer {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  // starts_in_reasoning: the prompt ended with <think> (thinking mode), so generation begins
  // inside the reasoning. Otherwise text is content unless it opens with <think>.
  explicit ReasoningParser(bool starts_in_reasoning) : in_reasoning_(starts_in_reasoning) {}

  // The parts of `text` that are decided; a possible partial tag at the end is held back.
  ReasoningDelta push(std::string_view text);
  ReasoningDelta flush();

  static ReasoningDelta split(std::string_view text, bool starts_in_reasoning);

 private:
  bool in_reasoning_;
  bool at_start_ = true;  // nothing emitted yet: a leading <think> is dropped
  std::string held_;
};

}  // namespace tokenizer
