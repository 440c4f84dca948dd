// Request field parsing. Unknown fields are ignored, as vLLM does (extra="allow").
#include "api/protocol.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "api/json_fields.h"
#include "sched/token_id_checks.h"

namespace api {
namespace {

using nlohmann::json;

template <typename T>
std::optional<ApiError> read(const json& body, const char* key, T* out, bool* present = nullptr) {
  return read_field(body, key, out, present);
}
// Fields vLLM declares without Optional: null is a type error.
template <typename T>
std::optional<ApiError> read_strict(const json& body, const char* key, T* out) {
  return read_field(body, key, out, nullptr, Nullable::kNo);
}

// A list with each element converted to an integer where pydantic's lax mode would; anything
// else as it is.
json lax_integers(const json& v) {
  if (!v.is_array()) return v;
  json out = json::array();
  for (const json& x : v) out.push_back(lax_convert(x, LaxType::kInteger).value_or(x));
  return out;
}

std::string fmt_float(double v) {
  json j = v;
  std::string s = j.dump();
  if (s.find('.') == std::string::npos && s.find('e') == std::string::npos) s += ".0";
  return s;
}

// OpenAI's logit_bias: {"token id": bias}, each bias clamped to [-100, 100] as vLLM does.
std::optional<ApiError> parse_logit_bias(const json& body, int64_t vocab_size,
                                         sched::SamplingParams* s) {
  if (!body.contains("logit_bias") || body["logit_bias"].is_null()) return std::nullopt;
  const json& lb = body["logit_bias"];
  if (!lb.is_object())
    return bad_request("'logit_bias' must be an object mapping token ids to numbers");
  for (const auto& [key, value] : lb.items()) {
    char* end = nullptr;
    errno = 0;
    const long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || errno != 0) {
      return bad_request("'logit_bias' keys must be token ids, got '" + key + "'");
    }
    if (id < 0 || id >= vocab_size) {
      return bad_request("token_id(s) [" + key +
                         "] in logit_bias contain out-of-vocab token ids. Vocabulary size: " +
                         std::to_string(vocab_size));
    }
    const json number = lax_convert(value, LaxType::kNumber).value_or(value);
    if (!number.is_number() || !std::isfinite(number.get<double>())) {
      return bad_request("'logit_bias' values must be numbers, got " + json_preview(value) +
                         " for token " + key);
    }
    const double bias = std::clamp(number.get<double>(), -100.0, 100.0);
    s->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  return std::nullopt;
}

// allowed_token_ids: every other token is masked. vLLM v1's checks and words.
std::optional<ApiError> parse_allowed_token_ids(const json& body, int64_t vocab_size,
                                                sched::SamplingParams* s) {
  if (!body.contains("allowed_token_ids") || body["allowed_token_ids"].is_null())
    return std::nullopt;
  const json a = lax_integers(body["allowed_token_ids"]);
  if (!a.is_array() ||
      !std::all_of(a.begin(), a.end(), [](const json& x) { return x.is_number_integer(); })) {
    return bad_request("'allowed_token_ids' must be a list of token ids");
  }
  if (a.empty()) return bad_request("allowed_token_ids is not None and empty!");
  for (const json& x : a) {
    const bool in_vocab = !(x.is_number_unsigned() &&
                            x.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) &&
                          x.get<int64_t>() >= 0 && x.get<int64_t>() < vocab_size;
    if (!in_vocab) {  // vLLM's words, then the id and the size
      return bad_request("allowed_token_ids contains out-of-vocab token id! (" + json_preview(x) +
                         "; vocabulary size " + std::to_string(vocab_size) + ")");
    }
    s->allowed_token_ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  std::sort(s->allowed_token_ids.begin(), s->allowed_token_ids.end());
  s->allowed_token_ids.erase(std::unique(s->allowed_token_ids.begin(), s->allowed_token_ids.end()),
                             s->allowed_token_ids.end());
  return std::nullopt;
}

// Fields vLLM honours that chunkpipe cannot: refused by name rather than silently ignored.
std::optional<ApiError> refuse_unsupported(const json& body) {
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                          "structural_tag", "structured_outputs"}) {
    if (body.contains(key) && !body[key].is_null()) {
      return bad_request(std::string("'") + key +
                         "' is not supported: chunkpipe has no constrained decoding yet");
    }
  }
  if (body.contains("prompt_embeds") && !body["prompt_embeds"].is_null()) {
    return bad_request(
        "'prompt_embeds' is not supported: chunkpipe has no --enable-prompt-embeds; send the "
        "prompt as text or token ids");
  }
  if (body.contains("logits_processors") && !body["logits_processors"].is_null()) {
    return bad_request(
        "'logits_processors' is not supported: chunkpipe runs no request-supplied code");
  }
  return std::nullopt;
}

}  // namespace

json ApiError::body() const {
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}}}};
}

ApiError bad_request(const std::string& message) {
  return {400, message, "BadRequestError"};
}
ApiError not_found_error(const std::string& message) {
  return {404, message, "NotFoundError"};
}

std::optional<ApiError> parse_common_fields(const json& body, Endpoint endpoint, int max_logprobs,
                                            int64_t vocab_size, CommonRequestFields* out,
                                            const SamplingDefaults& defaults) {
  if (!body.is_object()) return bad_request("the request body must be a JSON object");
  if (auto e = read(body, "model", &out->model)) return e;
  if (auto e = read(body, "stream", &out->stream)) return e;
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object()) return bad_request("'stream_options' must be an object");
    if (!out->stream) return bad_request("Stream options can only be defined when `stream=True`.");
    if (auto e = read(so, "include_usage", &out->include_usage)) return e;
    if (auto e = read(so, "continuous_usage_stats", &out->continuous_usage_stats)) return e;
  }
  if (auto e = read(body, "n", &out->n)) return e;
  if (out->n < 1) return bad_request("n must be at least 1, got " + std::to_string(out->n) + ".");
  if (out->n > 16) return bad_request("n must be at most 16, got " + std::to_string(out->n) + ".");
  if (body.contains("cache_salt") && !body["cache_salt"].is_null()) {
    const json& salt = body["cache_salt"];
    if (!salt.is_string() || salt.get<std::string>().empty())
      return bad_request("Parameter 'cache_salt' must be a non-empty string if provided.");
    out->cache_salt = salt.get<std::string>();
  }
  if (auto e = read(body, "priority", &out->priority)) return e;
  // best_of: vLLM's V1 engine (the one 0.10 runs) accepts only 1 and refuses more; so does this.
  int64_t best_of = 1;
  if (auto e = read(body, "best_of", &best_of)) return e;
  if (best_of != 1)
    return bad_request("best_of " + std::to_string(best_of) +
                       " is not supported: only best_of 1 (the default), as in vLLM V1");
  sched::SamplingParams& s = out->sampling;
  bool present = false;
  // A field the request leaves out (or sends as null) takes the model's default, if any.
  if (auto e = read(body, "temperature", &s.temperature, &present)) return e;
  if (!present) s.temperature = defaults.temperature.value_or(1.0);
  if (s.temperature < 0)
    return bad_request("temperature must be non-negative, got " + fmt_float(s.temperature) + ".");
  if (auto e = read(body, "top_p", &s.top_p, &present)) return e;
  if (!present && defaults.top_p) s.top_p = *defaults.top_p;
  if (s.top_p <= 0 || s.top_p > 1)
    return bad_request("top_p must be in (0, 1], got " + fmt_float(s.top_p) + ".");
  if (auto e = read(body, "top_k", &s.top_k, &present)) return e;
  if (!present && defaults.top_k) s.top_k = *defaults.top_k;
  if (s.top_k < -1)
    return bad_request("top_k must be -1 (disable), or at least 1, got " + std::to_string(s.top_k) +
                       ".");
  if (s.top_k == -1) s.top_k = 0;
  if (auto e = read(body, "min_p", &s.min_p, &present)) return e;
  if (!present && defaults.min_p) s.min_p = *defaults.min_p;
  if (s.min_p < 0 || s.min_p > 1)
    return bad_request("min_p must be in [0, 1], got " + fmt_float(s.min_p) + ".");
  if (auto e = read(body, "repetition_penalty", &s.repetition_penalty, &present)) return e;
  if (!present && defaults.repetition_penalty) s.repetition_penalty = *defaults.repetition_penalty;
  if (s.repetition_penalty <= 0)
    return bad_request("repetition_penalty must be greater than zero, got " +
                       fmt_float(s.repetition_penalty) + ".");
  if (auto e = read(body, "presence_penalty", &s.presence_penalty)) return e;
  if (s.presence_penalty < -2 || s.presence_penalty > 2)
    return bad_request("presence_penalty must be in [-2, 2], got " + fmt_float(s.presence_penalty) +
                       ".");
  if (auto e = read(body, "frequency_penalty", &s.frequency_penalty)) return e;
  if (s.frequency_penalty < -2 || s.frequency_penalty > 2)
    return bad_request("frequency_penalty must be in [-2, 2], got " +
                       fmt_float(s.frequency_penalty) + ".");
  int64_t seed = 0;
  if (auto e = read(body, "seed", &seed, &present)) return e;
  if (present) s.seed = static_cast<uint64_t>(seed);
  if (auto e = read_strict(body, "ignore_eos", &s.ignore_eos)) return e;
  if (auto e = read(body, "min_tokens", &s.min_tokens)) return e;
  if (s.min_tokens < 0)
    return bad_request("min_tokens must be greater than or equal to 0, got " +
                       std::to_string(s.min_tokens) + ".");
  if (auto e = read_strict(body, "skip_special_tokens", &s.skip_special_tokens)) return e;
  if (auto e = read_strict(body, "include_stop_str_in_output", &s.include_stop_str_in_output))
    return e;
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& st = body["stop"];
    if (st.is_string()) {
      s.stop.push_back(st.get<std::string>());
    } else if (st.is_array() &&
               std::all_of(st.begin(), st.end(), [](const json& x) { return x.is_string(); })) {
      for (const json& x : st) s.stop.push_back(x.get<std::string>());
    } else {
      return bad_request("'stop' must be a string or a list of strings");
    }
  }
  if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null()) {
    const json st = lax_integers(body["stop_token_ids"]);
    if (!st.is_array() || !std::all_of(st.begin(), st.end(), [](const json& x) {
          return x.is_number_integer() && x.get<int64_t>() >= 0 &&
                 x.get<int64_t>() <= std::numeric_limits<int32_t>::max();
        })) {
      return bad_request("'stop_token_ids' must be a list of non-negative 32-bit integers");
    }
    s.stop_token_ids = st.get<std::vector<int32_t>>();
    // vLLM ignores a stop id the model can never sample; a 400 that names it is clearer.
    if (auto bad = sched::first_out_of_vocab(s.stop_token_ids, vocab_size))
      return bad_request(sched::out_of_vocab_message("stop_token_ids", *bad, vocab_size));
  }
  int64_t max_tokens = 0;
  if (endpoint == Endpoint::kChat) {
    if (auto e = read(body, "max_completion_tokens", &max_tokens, &present)) return e;
    if (!present) {
      if (auto e = read(body, "max_tokens", &max_tokens, &present)) return e;
    }
  } else {  // max_completion_tokens is an alias here; max_tokens wins when both are given
    if (auto e = read(body, "max_tokens", &max_tokens, &present)) return e;
    if (!present) {
      if (auto e = read(body, "max_completion_tokens", &max_tokens, &present)) return e;
    }
    if (!present) max_tokens = 16, present = true;
  }
  if (endpoint == Endpoint::kCompletions) {
    if (auto e = read_strict(body, "echo", &out->echo)) return e;
    if (out->echo && present && max_tokens == 0) {
      out->echo_without_generation = true;
      max_tokens = 1;
    }
  }
  if (present) {
    if (max_tokens < 1)
      return bad_request("max_tokens must be at least 1, got " + std::to_string(max_tokens) + ".");
    out->max_tokens = max_tokens;
    if (s.min_tokens > max_tokens) {
      return bad_request(
          "min_tokens must be less than or equal to max_tokens=" + std::to_string(max_tokens) +
          ", got " + std::to_string(s.min_tokens) + ".");
    }
  }
  out->generation_max_tokens = defaults.max_tokens;
  if (auto e = parse_logit_bias(body, vocab_size, &s)) return e;
  if (body.contains("response_format") && !body["response_format"].is_null()) {
    const json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
      return bad_request("'response_format' must be an object with a string 'type'");
    if (rf["type"] != "text") {
      return bad_request("response_format type '" + rf["type"].get<std::string>() +
                         "' is not supported: chunkpipe has no constrained decoding yet");
    }
  }
  if (endpoint == Endpoint::kCompletions) {
    if (body.contains("suffix") && !body["suffix"].is_null())
      return bad_request("suffix is not currently supported");
    if (auto e = read_strict(body, "add_special_tokens", &out->add_special_tokens)) return e;
    int logprobs = 0;
    if (auto e = read(body, "logprobs", &logprobs, &present)) return e;
    if (present) {
      if (logprobs < 0 || logprobs > max_logprobs) {
        return bad_request("logprobs must be between 0 and " + std::to_string(max_logprobs) +
                           ", got " + std::to_string(logprobs) + ".");
      }
      out->want_logprobs = true;
      s.logprobs = logprobs;
    }
  } else {
    out->add_special_tokens = false;
    if (auto e = read_strict(body, "add_special_tokens", &out->add_special_tokens)) return e;
    if (auto e = read(body, "logprobs", &out->want_logprobs)) return e;
    if (auto e = read(body, "top_logprobs", &out->top_logprobs)) return e;
    if (out->top_logprobs > 0 && !out->want_logprobs) {
      return bad_request("when using `top_logprobs`, `logprobs` must be set to true.");
    }
    if (out->top_logprobs < 0 || out->top_logprobs > max_logprobs) {
      return bad_request("top_logprobs must be between 0 and " + std::to_string(max_logprobs) +
                         ", got " + std::to_string(out->top_logprobs) + ".");
    }
    if (out->want_logprobs) s.logprobs = out->top_logprobs;
  }
  int prompt_logprobs = 0;
  if (auto e = read(body, "prompt_logprobs", &prompt_logprobs, &present)) return e;
  if (present) {
    if (out->stream && (prompt_logprobs > 0 || prompt_logprobs == -1))
      return bad_request("`prompt_logprobs` are not available when `stream=True`.");
    if (prompt_logprobs < 0) {
      return bad_request("prompt_logprobs must be non-negative, got " +
                         std::to_string(prompt_logprobs) +
                         " (-1, the whole vocabulary, is not supported)");
    }
    if (prompt_logprobs > max_logprobs) {
      return bad_request("Requested prompt logprobs of " + std::to_string(prompt_logprobs) +
                         ", which is greater than max allowed: " + std::to_string(max_logprobs));
    }
    s.prompt_logprobs = prompt_logprobs;
  } else if (out->echo && s.logprobs) {
    s.prompt_logprobs = s.logprobs;  // echo with logprobs scores the echoed prompt (vLLM)
  }
  int64_t truncate = 0;
  if (auto e = read(body, "truncate_prompt_tokens", &truncate, &present)) return e;
  if (present) {
    if (truncate == 0 || truncate < -1) {
      return bad_request("truncate_prompt_tokens must be an integer >= 1 or -1, got " +
                         std::to_string(truncate));
    }
    out->truncate_prompt_tokens = truncate;
  }
  if (auto e = parse_allowed_token_ids(body, vocab_size, &s)) return e;
  if (body.contains("bad_words") && !body["bad_words"].is_null()) {
    const json& bw = body["bad_words"];
    if (!bw.is_array() ||
        !std::all_of(bw.begin(), bw.end(), [](const json& x) { return x.is_string(); })) {
      return bad_request("'bad_words' must be a list of strings");
    }
    out->bad_words = bw.get<std::vector<std::string>>();
  }
  return refuse_unsupported(body);
}

std::optional<ApiError> resolve_truncation(int64_t max_model_len, CommonRequestFields* out) {
  if (!out->truncate_prompt_tokens) return std::nullopt;
  int64_t& k = *out->truncate_prompt_tokens;
  if (k == -1) k = max_model_len;
  if (k > max_model_len) {
    return bad_request("truncate_prompt_tokens value (" + std::to_string(k) +
                       ") is greater than max_model_len (" + std::to_string(max_model_len) +
                       "). Please, select a smaller truncation size.");
  }
  return std::nullopt;
}

void truncate_prompt(int64_t keep, bool had_bos, std::vector<int32_t>* ids) {
  const int64_t n = static_cast<int64_t>(ids->size());
  if (keep <= 0 || n <= keep) return;
  const int64_t first = had_bos ? 1 : 0;  // the BOS stays and counts toward keep
  ids->erase(ids->begin() + first, ids->begin() + first + (n - keep));
}

std::optional<ApiError> check_priority(int64_t priority, bool priority_scheduling) {
  if (priority == 0 || priority_scheduling) return std::nullopt;
  return bad_request("Got priority " + std::to_string(priority) +
                     " but Priority scheduling is not enabled.");
}

std::optional<ApiError> resolve_max_tokens(int64_t n_prompt, int64_t max_model_len,
                                           Endpoint endpoint, CommonRequestFields* out) {
  const std::string L = std::to_string(max_model_len), N = std::to_string(n_prompt);
  if (n_prompt >= max_model_len) {
    return bad_request("This model's maximum context length is " + L +
                       " tokens. However, your request has " + N +
                       " input tokens. Please reduce the length of the input messages.");
  }
  if (out->max_tokens && *out->max_tokens > max_model_len - n_prompt) {
    const std::string M = std::to_string(*out->max_tokens);
    return bad_request("'max_tokens' or 'max_completion_tokens' is too large: " + M +
                       ". This model's maximum context length is " + L +
                       " tokens and your request has " + N + " input tokens (" + M + " > " + L +
                       " - " + N + ").");
  }
  (void)endpoint;
  int64_t max_tokens = out->max_tokens.value_or(max_model_len - n_prompt);
  if (out->generation_max_tokens) max_tokens = std::min(max_tokens, *out->generation_max_tokens);
  out->sampling.max_tokens = static_cast<int32_t>(max_tokens);
  return std::nullopt;
}

std::optional<ApiError> check_prompt_bytes(size_t text_bytes, size_t max_token_bytes,
                                           int64_t max_model_len) {
  const int64_t at_least = static_cast<int64_t>(text_bytes / std::max<size_t>(max_token_bytes, 1));
  if (at_least < max_model_len) return std::nullopt;
  return bad_request("This model's maximum context length is " + std::to_string(max_model_len) +
                     " tokens. However, your request has at least " + std::to_string(at_least) +
                     " input tokens (" + std::to_string(text_bytes) +
                     " bytes). Please reduce the length of the input messages.");
}

std::optional<ApiError> check_sampling_token_ids(const sched::SamplingParams& sampling,
                                                 int64_t vocab_size) {
  if (auto why = sched::out_of_vocab_sampling(sampling, vocab_size)) return bad_request(*why);
  return std::nullopt;
}

std::optional<ApiError> check_prompt_token_ids(const std::vector<int32_t>& ids,
                                               int64_t vocab_size) {
  if (auto bad = sched::first_out_of_vocab(ids, vocab_size))
    return bad_request(sched::out_of_vocab_message("prompt", *bad, vocab_size));
  return std::nullopt;
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"completion_tokens", completion_tokens},
          {"prompt_tokens_details", nullptr}};
}

}  // namespace api
