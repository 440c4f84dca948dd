// Fuzz target: the tool-call parsers. Streaming the text in pieces (split points from the
// input) must give exactly what parsing it whole gives: content and calls.
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/tool_parser.h"

namespace {

struct Result {
  std::string content;
  std::vector<api::ToolCall> calls;
};

Result parse(const std::string& parser, const std::string& text, const std::string& cuts) {
  auto p = api::ToolCallParser::create(parser, "id-");
  Result r;
  size_t pos = 0;
  for (unsigned char c : cuts) {
    const size_t n = std::min<size_t>(c % 16, text.size() - pos);
    r.content += p->push(std::string_view(text).substr(pos, n)).content;
    pos += n;
  }
  r.content += p->push(std::string_view(text).substr(pos)).content;
  r.content += p->flush().content;
  r.calls = p->calls();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t cut_bytes = std::min<size_t>(data[0], size - 1);
  const std::string cuts(reinterpret_cast<const char*>(data + 1), cut_bytes);
  const std::string text(reinterpret_cast<const char*>(data + 1 + cut_bytes), size - 1 - cut_bytes);
  for (const char* name : {"deepseek_v3", "deepseek_v31"}) {
    const Result whole = parse(name, text, "");
    const Result pieces = parse(name, text, cuts);
    if (whole.content != pieces.content || whole.calls.size() != pieces.calls.size())
      __builtin_trap();
    for (size_t i = 0; i < whole.calls.size(); ++i) {
      if (whole.calls[i].name != pieces.calls[i].name ||
          whole.calls[i].arguments != pieces.calls[i].arguments)
        __builtin_trap();
    }
  }
  return 0;
}
