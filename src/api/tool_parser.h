// ToolCallParser: DeepSeek's tool-call markup in generated text -> OpenAI tool_calls, whole or
// streamed, as vLLM's deepseek_v3 and deepseek_v31 parsers read it:
//   v3:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   v31:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
// Text before the markup is content. push() never emits bytes that could still turn out to be
// part of a marker, so any split of the text gives the same result. Thread-compatible.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace api {

struct ToolCallDelta {
  int index = 0;
  bool first = false;  // carries the call's id and name
  std::string id;
  std::string name;
  std::string arguments;  // the next piece of the JSON arguments text
};

struct ToolParseDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

class ToolCallParser {
 public:
  enum class Format { kV3, kV31 };
  // "deepseek_v3" or "deepseek_v31"; null for another name. id_prefix starts each call's id.
  static std::unique_ptr<ToolCallParser> create(const std::string& parser_name,
                                                std::string id_prefix);

  ToolParseDelta push(std::string_view text);
  ToolParseDelta flush();  // the end of the output: whatever was held back
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  enum class State { kContent, kBetweenCalls, kHeader, kArguments, kDone };
  ToolCallParser(Format format, std::string id_prefix)
      : format_(format), id_prefix_(std::move(id_prefix)) {}
  // Moves what can be decided from pending_ into `out`; returns false when it must wait.
  bool step(ToolParseDelta* out);
  void emit_arguments(std::string_view piece, ToolParseDelta* out);

  const Format format_;
  const std::string id_prefix_;
  State state_ = State::kContent;
  std::string pending_;  // text not yet classified
  std::vector<ToolCall> calls_;
};

}  // namespace api
