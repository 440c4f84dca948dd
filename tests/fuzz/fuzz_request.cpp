// Fuzz target: a request body as the OpenAI routes read it: bounded JSON parse, then the
// fields both endpoints share, the context-length checks, and chat messages normalization.
// Any input must give OK or a 4xx ApiError: no crash, no exception, no sanitizer report. What
// parses OK holds no token id outside the 129280-row vocabulary, in any field.
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/json_fields.h"
#include "api/prompt_input.h"
#include "api/protocol.h"
#include "sched/token_id_checks.h"
#include "tokenizer/chat_template.h"

constexpr int64_t kVocab = 129280;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json body;
  if (auto e = api::parse_json_body(text, &body)) {
    if (e->status != 400) __builtin_trap();
    return 0;
  }
  for (auto endpoint : {api::Endpoint::kCompletions, api::Endpoint::kChat}) {
    api::CommonRequestFields f;
    if (auto e = api::parse_common_fields(body, endpoint, 20, kVocab, &f)) {
      if (e->status != 400 ||
          e->body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).empty())
        __builtin_trap();
      continue;
    }
    if (sched::out_of_vocab_sampling(f.sampling, kVocab)) __builtin_trap();
    api::resolve_max_tokens(static_cast<int64_t>(size % 4096), 4096, endpoint, &f);
  }
  std::vector<api::PromptInput> prompts;
  if (body.is_object() && !api::parse_completion_prompts(body, kVocab, &prompts)) {
    for (const api::PromptInput& p : prompts) {
      if (sched::first_out_of_vocab(p.token_ids, kVocab)) __builtin_trap();
    }
  }
  if (body.is_object() && body.contains("messages")) {
    auto normalized = tokenizer::normalize_messages(body["messages"]);
    if (normalized.ok())
      (void)normalized->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return 0;
}
