// Fuzz target: a chat template's source (a request's chat_template under
// --trust-request-chat-template, or an unknown checkpoint's) parsed and rendered over a small
// conversation. Either may fail with a Status; neither may crash, overflow or run away (the
// parser's nesting bound and the renderer's bounds on values, loops and arithmetic).
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::json context = {
      {"messages",
       {{{"role", "system"}, {"content", "be brief"}},
        {{"role", "user"}, {"content", "hi"}},
        {{"role", "assistant"}, {"content", "yo"}, {"tool_calls", nlohmann::json::array()}}}},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"x", {{"k", 1}, {"list", {1, 2.5, "s", nullptr, true}}}}};
  auto t =
      tokenizer::jinja::Template::parse(std::string(reinterpret_cast<const char*>(data), size));
  if (t.ok()) (void)(*t)->render(context);
  return 0;
}
