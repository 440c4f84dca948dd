// The OpenAI response pieces, in vLLM's field order and with its nulls: logprobs (chat and
// completions layouts), tool calls (whole and streamed deltas), stop_reason and the streamed
// chunk's envelope. Pure functions; token text comes from the caller.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/tool_parser.h"
#include "sched/scheduler_output.h"

namespace api {

// A token id's text as the response shows it.
using TokenText = std::function<std::string(int32_t)>;

// Chat: {"content": [{token, logprob, bytes, top_logprobs}]}. Completions: text_offset (in
// characters, from `initial_offset`), token_logprobs, tokens, and top_logprobs, which holds
// the chosen token besides the top ones (vLLM's). An entry whose logprob is NaN (an echoed
// prompt's first token) has null logprobs. Logprobs are clamped at -9999.0 (vLLM's, for JSON).
nlohmann::json chat_logprobs_json(const std::vector<sched::SampledToken>& lps,
                                  const TokenText& text);
nlohmann::json completion_logprobs_json(const std::vector<sched::SampledToken>& lps,
                                        const TokenText& text, size_t initial_offset = 0);

// vLLM's prompt_logprobs: null for the first prompt token, then per later token (entry p of
// `lps` scores prompt token p + 1) {"<id>": {"logprob", "rank", "decoded_token"}} for that
// token and the top alternatives; null where a position was not computed (NaN logprob).
nlohmann::json prompt_logprobs_json(const std::vector<sched::SampledToken>& lps,
                                    const TokenText& text);

// Characters (UTF-8 code points) in `text`: OpenAI's text_offset unit.
size_t utf8_length(const std::string& text);

nlohmann::json tool_call_json(const ToolCall& call);
nlohmann::json tool_delta_json(const ToolCallDelta& delta);

// A matched stop string or stop token id; null for none.
nlohmann::json stop_reason_json(const std::variant<std::monostate, std::string, int32_t>& v);

// {"id", "object", "created", "model", "choices"} (+ "usage": null for completions).
nlohmann::json chunk_envelope(const std::string& id, bool chat, int64_t created,
                              const std::string& model, nlohmann::json choices);

}  // namespace api
