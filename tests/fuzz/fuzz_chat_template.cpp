// Fuzz target: chat messages -> prompt text through the built-in DeepSeek-V3.1 template and
// its Jinja twin (the Jinja renderer runs a checkpoint's template on client data). Both must
// agree whenever both succeed, and neither may crash. Tools come from a message's "tools" key.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "api/json_fields.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<tokenizer::ChatTemplate> jinja = [] {
    auto t = tokenizer::ChatTemplate::create(tokenizer::deepseek_v31_template_text());
    if (!t.ok()) __builtin_trap();
    return std::move(t).value();
  }();
  nlohmann::json messages;
  if (api::parse_json_body(std::string(reinterpret_cast<const char*>(data), size), &messages))
    return 0;
  tokenizer::ChatRenderOptions options;
  options.add_generation_prompt = size % 2 == 0;
  if (size % 3 == 0) options.chat_template_kwargs = {{"thinking", true}};
  // A message carrying a "tools" key lends it to the request (the API server's `tools`).
  if (messages.is_array()) {
    for (const auto& m : messages)
      if (m.is_object() && m.contains("tools")) options.tools = m["tools"];
  }
  auto builtin = tokenizer::render_deepseek_v31(messages, options);
  auto rendered = jinja->render(messages, options);
  if (builtin.ok() && rendered.ok() && *builtin != *rendered) __builtin_trap();
  return 0;
}
