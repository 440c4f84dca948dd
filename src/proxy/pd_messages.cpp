// The proxy's leg bodies and its reading and rewriting of the backends' answers.
#include "proxy/pd_messages.h"

#include <algorithm>

#include "api/json_fields.h"
#include "proxy/sse_splitter.h"

namespace proxy {
namespace {

using nlohmann::json;

// Token ids from a backend's list; empty when it is not a list of 32-bit ids.
std::vector<int32_t> token_ids(const json& list) {
  std::vector<int32_t> ids;
  if (!list.is_array()) return ids;
  for (const json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      return {};
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

// A decoder's usage as the client's: P's prompt count, and the tokens of earlier rounds added
// to the completion count. Counts that are not integers are left as the decoder sent them.
void rebase_usage(json* usage, const EarlierRounds& earlier) {
  json& u = *usage;
  const auto generated = static_cast<int64_t>(earlier.token_ids.size());
  if (earlier.prompt_tokens >= 0) u["prompt_tokens"] = earlier.prompt_tokens;
  const auto completion = integer(u, "completion_tokens", /*lax=*/false);
  if (!completion) return;
  u["completion_tokens"] = *completion + generated;
  if (const auto prompt = integer(u, "prompt_tokens", /*lax=*/false))
    u["total_tokens"] = *prompt + *completion + generated;
}

// Removes what the proxy asked for but the client did not (return_token_ids): in a whole
// response the fields stay, null, as the server writes them; stream chunks lose them.
void strip_token_ids(json* j, bool stream) {
  auto strip = [stream](json& o, const char* key) {
    if (!o.is_object() || !o.contains(key)) return;
    if (stream) {
      o.erase(key);
    } else {
      o[key] = nullptr;
    }
  };
  strip(*j, "prompt_token_ids");
  if (!j->contains("choices") || !(*j)["choices"].is_array()) return;
  for (json& c : (*j)["choices"]) {
    strip(c, "token_ids");
    strip(c, "prompt_token_ids");
  }
}

// A stream chunk that carried only token ids (the text is still held back): without them it
// says nothing, and the server would not have sent it.
bool empty_delta(const json& chunk, bool chat) {
  if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].size() != 1 ||
      (chunk.contains("usage") && !chunk["usage"].is_null()))
    return false;
  const json& c = chunk["choices"][0];
  if (!c.is_object()) return false;
  if (c.contains("finish_reason") && !c["finish_reason"].is_null()) return false;
  if (c.contains("logprobs") && !c["logprobs"].is_null()) return false;
  // (json::empty() is false for every string: the text itself is looked at.)
  if (!chat)
    return !c.contains("text") ||
           (c["text"].is_string() && c["text"].get_ref<const std::string&>().empty());
  if (!c.contains("delta") || !c["delta"].is_object()) return false;
  for (const auto& [key, value] : c["delta"].items()) {
    if (key == "content" && value.is_string() && value.get<std::string>().empty()) continue;
    if (!value.is_null()) return false;
  }
  return true;
}

}  // namespace

// Untrusted JSON: copies and dumps recurse, and a body nested 300,000 deep overflowed the stack.
json parse_bounded(const std::string& text) {
  json j;
  if (api::parse_json_body(text, &j)) return json(json::value_t::discarded);
  return j;
}

bool flag(const json& body, const char* key) {
  if (!body.is_object()) return false;
  const auto it = body.find(key);
  if (it == body.end()) return false;
  const json v = api::lax_convert(*it, api::LaxType::kBool).value_or(*it);
  return v.is_boolean() && v.get<bool>();
}

std::optional<int64_t> integer(const json& obj, const char* key, bool lax) {
  if (!obj.is_object()) return std::nullopt;
  const auto it = obj.find(key);
  if (it == obj.end()) return std::nullopt;
  const json v = lax ? api::lax_convert(*it, api::LaxType::kInteger).value_or(*it) : *it;
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX))
    return std::nullopt;
  return v.get<int64_t>();
}

json prefill_body(const json& request) {
  json p = request;
  p["stream"] = false;
  p["max_tokens"] = 1;
  p["min_tokens"] = 1;
  if (p.contains("max_completion_tokens")) p["max_completion_tokens"] = 1;
  p.erase("stream_options");
  p["kv_transfer_params"] = {{"do_remote_decode", true},    {"do_remote_prefill", false},
                             {"remote_engine_id", nullptr}, {"remote_block_ids", nullptr},
                             {"remote_host", nullptr},      {"remote_port", nullptr}};
  return p;
}

json next_round_request(const json& original, const json& current, bool chat,
                        const std::vector<int32_t>& prompt_ids,
                        const std::vector<int32_t>& generated_ids, int64_t max_tokens) {
  std::vector<int32_t> ids = prompt_ids;
  ids.insert(ids.end(), generated_ids.begin(), generated_ids.end());
  json next = current;
  if (chat) {
    // The chat prompt is rendered text: continue it as a completion of the exact ids, with
    // every field that means the same to a completion.
    next = {{"model", original.value("model", json(nullptr))}};
    for (const char* key : {"temperature",
                            "top_p",
                            "top_k",
                            "min_p",
                            "seed",
                            "stop",
                            "stop_token_ids",
                            "ignore_eos",
                            "presence_penalty",
                            "frequency_penalty",
                            "repetition_penalty",
                            "logit_bias",
                            "allowed_token_ids",
                            "bad_words",
                            "min_tokens",
                            "skip_special_tokens",
                            "include_stop_str_in_output",
                            "spaces_between_special_tokens",
                            "cache_salt",
                            "priority",
                            "stream"})
      if (original.contains(key)) next[key] = original[key];
    next["return_token_ids"] = true;
  }
  next["prompt"] = ids;
  const auto generated = static_cast<int64_t>(generated_ids.size());
  next.erase("max_completion_tokens");
  if (max_tokens >= 0) next["max_tokens"] = std::max<int64_t>(1, max_tokens - generated);
  if (const auto min_tokens = integer(original, "min_tokens"))
    next["min_tokens"] = std::max<int64_t>(0, *min_tokens - generated);
  return next;
}

ChoiceDelta read_choice(const json& j, bool chat, bool stream) {
  ChoiceDelta d;
  if (!j.is_object()) return d;
  if (j.contains("prompt_token_ids")) d.prompt_token_ids = token_ids(j["prompt_token_ids"]);
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return d;
  const json& c = j["choices"][0];
  if (!c.is_object()) return d;
  if (c.contains("stop_reason") && c["stop_reason"] == "recomputed") d.recomputed = true;
  if (c.contains("token_ids")) d.token_ids = token_ids(c["token_ids"]);
  if (c.contains("prompt_token_ids")) d.prompt_token_ids = token_ids(c["prompt_token_ids"]);
  const json* text = nullptr;
  if (!chat) {
    if (c.contains("text")) text = &c["text"];
  } else {
    const char* where = stream ? "delta" : "message";
    if (c.contains(where) && c[where].is_object() && c[where].contains("content"))
      text = &c[where]["content"];
  }
  if (text != nullptr && text->is_string()) d.text = text->get<std::string>();
  return d;
}

RelayedEvent relay_stream_event(const std::string& event, bool chat, bool wants_ids,
                                const EarlierRounds& earlier) {
  RelayedEvent out;
  const std::string data = sse_data(event);
  if (data == "[DONE]") {
    out.kind = RelayedEvent::Kind::kDone;
    return out;
  }
  json chunk = parse_bounded(data);
  if (!chunk.is_object() || chunk.contains("error")) return out;  // not ours to judge: kAsIs
  out.choice = read_choice(chunk, chat, /*stream=*/true);
  if (out.choice.recomputed) {
    out.kind = RelayedEvent::Kind::kRecomputed;
    return out;
  }
  if (chunk.contains("usage") && chunk["usage"].is_object()) rebase_usage(&chunk["usage"], earlier);
  if (!wants_ids) {
    strip_token_ids(&chunk, /*stream=*/true);
    if (empty_delta(chunk, chat)) {
      out.kind = RelayedEvent::Kind::kEmpty;
      return out;
    }
  }
  out.kind = RelayedEvent::Kind::kChunk;
  out.data = "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  return out;
}

void finish_whole_answer(json* answer, bool chat, bool wants_ids, const EarlierRounds& earlier) {
  json& a = *answer;
  if (!a.is_object()) return;
  json no_choice = json::object();  // stands in for a missing choice: writes go nowhere
  const auto choices = a.find("choices");
  json& c =
      choices != a.end() && choices->is_array() && !choices->empty() && (*choices)[0].is_object()
          ? (*choices)[0]
          : no_choice;
  const bool has_text = !chat || (c.contains("message") && c["message"].is_object());
  if (!earlier.text.empty() && has_text) {  // earlier rounds' text comes first
    json& text = chat ? c["message"]["content"] : c["text"];
    text = earlier.text + (text.is_string() ? text.get<std::string>() : "");
  }
  if (wants_ids && c.contains("token_ids") && c["token_ids"].is_array()) {
    std::vector<int32_t> all = earlier.token_ids;
    for (int32_t id : token_ids(c["token_ids"])) all.push_back(id);
    c["token_ids"] = all;
  }
  if (a.contains("usage") && a["usage"].is_object()) rebase_usage(&a["usage"], earlier);
  if (!wants_ids) strip_token_ids(answer, /*stream=*/false);
}

}  // namespace proxy
