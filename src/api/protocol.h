// OpenAI protocol as vLLM serves it: request fields -> SamplingParams with vLLM's validation
// messages, error bodies, usage objects. JSON in, structs out; no engine logic.
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/generation_defaults.h"
#include "common/status.h"
#include "sched/sampling_params.h"

namespace api {

// HTTP status + vLLM's nested error body.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "BadRequestError";
  nlohmann::json body() const;
};

ApiError bad_request(const std::string& message);
ApiError not_found_error(const std::string& message);

struct CommonRequestFields {
  std::string model;  // empty: the served model
  bool stream = false;
  bool include_usage = false;
  // stream_options.continuous_usage_stats: every chunk carries usage once usage is included
  // (include_usage, or the server's --enable-force-include-usage).
  bool continuous_usage_stats = false;
  int n = 1;
  sched::SamplingParams sampling;
  std::optional<int64_t> max_tokens;  // null: fill to max_model_len (chat) or 16 (completions)
  bool echo = false;
  // Completions with echo and max_tokens 0: the response is the prompt alone (its logprobs with
  // logprobs set); one token is generated and dropped, as vLLM does.
  bool echo_without_generation = false;
  bool add_special_tokens = true;
  int top_logprobs = 0;  // chat: with logprobs=true
  bool want_logprobs = false;
  // vLLM's truncate_prompt_tokens: keep the prompt's last k ids; -1 means max_model_len.
  std::optional<int64_t> truncate_prompt_tokens;
  // vLLM's bad_words as sent; the caller tokenizes them into sampling.bad_words_token_ids.
  std::vector<std::string> bad_words;
  // generation_config's max_new_tokens: caps max_tokens (vLLM's get_max_tokens).
  std::optional<int64_t> generation_max_tokens;
  // vLLM's cache_salt: only requests with the same salt share prefix-cache blocks (empty: none).
  std::string cache_salt;
  int64_t priority = 0;  // vLLM's: the smaller is served first under the priority policy
};

enum class Endpoint { kCompletions, kChat };

// Parses and validates the fields both endpoints share. Errors carry vLLM's wording.
// vocab_size bounds the token ids of logit_bias; `defaults` fills the sampling fields a request
// leaves out (the model's generation_config, as vLLM).
std::optional<ApiError> parse_common_fields(const nlohmann::json& body, Endpoint endpoint,
                                            int max_logprobs, int64_t vocab_size,
                                            CommonRequestFields* out,
                                            const SamplingDefaults& defaults = {});

// A non-zero priority needs --scheduling-policy priority (vLLM's refusal otherwise).
std::optional<ApiError> check_priority(int64_t priority, bool priority_scheduling);

// The context-length checks of vLLM 0.10/0.11 (prompt alone, then prompt + max_tokens);
// sets out->sampling.max_tokens. chat: a missing max_tokens fills the context.
std::optional<ApiError> resolve_max_tokens(int64_t num_prompt_tokens, int64_t max_model_len,
                                           Endpoint endpoint, CommonRequestFields* out);

// Before tokenizing: a prompt text of text_bytes bytes encodes to at least
// text_bytes / max_token_bytes ids, so one at or past max_model_len by that bound is refused at
// once (a long hostile prompt costs no tokenizer time; vLLM's message, with "at least").
std::optional<ApiError> check_prompt_bytes(size_t text_bytes, size_t max_token_bytes,
                                           int64_t max_model_len);

// truncate_prompt_tokens against the context (vLLM's message past it); -1 becomes max_model_len.
std::optional<ApiError> resolve_truncation(int64_t max_model_len, CommonRequestFields* out);

// Keeps a tokenized prompt's last `keep` ids. A BOS the tokenizer added stays first and counts
// toward `keep`, as Hugging Face's left truncation leaves special tokens (`had_bos`).
void truncate_prompt(int64_t keep, bool had_bos, std::vector<int32_t>* ids);

// A 400 naming the field and the id when a token-id field of `sampling` (stop_token_ids,
// logit_bias, allowed_token_ids, bad words as tokenized) reaches past the model's vocab_size rows.
std::optional<ApiError> check_sampling_token_ids(const sched::SamplingParams& sampling,
                                                 int64_t vocab_size);
// The same for a tokenized prompt ('prompt').
std::optional<ApiError> check_prompt_token_ids(const std::vector<int32_t>& ids, int64_t vocab_size);

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace api
