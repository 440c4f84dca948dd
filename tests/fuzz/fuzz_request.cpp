// Fuzz target: a request body as the OpenAI routes read it: bounded JSON parse, then the
// fields both endpoints share, the context-length checks, and chat messages normalization.
// Any input must give OK or a 4xx ApiError: no crash, no exception, no sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/json_fields.h"
#include "api/protocol.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json body;
  if (auto e = api::parse_json_body(text, &body)) {
    if (e->status != 400) __builtin_trap();
    return 0;
  }
  for (auto endpoint : {api::Endpoint::kCompletions, api::Endpoint::kChat}) {
    api::CommonRequestFields f;
    if (auto e = api::parse_common_fields(body, endpoint, 20, 129280, &f)) {
      if (e->status != 400 ||
          e->body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).empty())
        __builtin_trap();
      continue;
    }
    api::resolve_max_tokens(static_cast<int64_t>(size % 4096), 4096, endpoint, &f);
  }
  if (body.is_object() && body.contains("messages")) {
    auto normalized = tokenizer::normalize_messages(body["messages"]);
    if (normalized.ok())
      (void)normalized->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return 0;
}
