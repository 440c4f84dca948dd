// Response JSON builders.
#include "api/response.h"

#include <algorithm>
#include <cmath>

namespace api {

using nlohmann::json;

namespace {

double clamped(float logprob) {
  return std::max(static_cast<double>(logprob), -9999.0);
}

// OpenAI's `bytes`: the token's text as UTF-8 byte values.
json utf8_bytes(const std::string& text) {
  json out = json::array();
  for (const char c : text) out.push_back(static_cast<uint8_t>(c));
  return out;
}

}  // namespace

json chat_logprobs_json(const std::vector<sched::SampledToken>& lps, const TokenText& text) {
  json content = json::array();
  for (const auto& lp : lps) {
    json top = json::array();
    for (const auto& [id, v] : lp.top_logprobs) {
      const std::string t = text(id);
      top.push_back({{"token", t}, {"logprob", clamped(v)}, {"bytes", utf8_bytes(t)}});
    }
    const std::string t = text(lp.token);
    content.push_back({{"token", t},
                       {"logprob", clamped(lp.logprob)},
                       {"bytes", utf8_bytes(t)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

size_t utf8_length(const std::string& text) {
  return static_cast<size_t>(std::count_if(
      text.begin(), text.end(), [](char c) { return (static_cast<uint8_t>(c) & 0xC0) != 0x80; }));
}

json completion_logprobs_json(const std::vector<sched::SampledToken>& lps, const TokenText& text,
                              size_t initial_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  size_t offset = initial_offset;
  for (const auto& lp : lps) {
    tokens.push_back(text(lp.token));
    if (std::isnan(lp.logprob)) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
    } else {
      token_logprobs.push_back(clamped(lp.logprob));
      json t = json::object();
      t[text(lp.token)] = clamped(lp.logprob);
      for (const auto& [id, v] : lp.top_logprobs) t[text(id)] = clamped(v);
      top.push_back(t);
    }
    offsets.push_back(offset);
    offset += utf8_length(tokens.back().get_ref<const std::string&>());
  }
  return {{"text_offset", offsets},
          {"token_logprobs", token_logprobs},
          {"tokens", tokens},
          {"top_logprobs", top}};
}

json prompt_logprobs_json(const std::vector<sched::SampledToken>& lps, const TokenText& text) {
  json out = json::array({nullptr});
  for (const auto& lp : lps) {
    if (std::isnan(lp.logprob)) {
      out.push_back(nullptr);
      continue;
    }
    json entry = json::object();
    auto add = [&](int32_t id, float logprob, int32_t rank) {
      const std::string key = std::to_string(id);
      if (entry.contains(key)) return;
      entry[key] = {{"logprob", clamped(logprob)}, {"rank", rank}, {"decoded_token", text(id)}};
    };
    add(lp.token, lp.logprob, lp.rank);
    for (size_t i = 0; i < lp.top_logprobs.size(); ++i)
      add(lp.top_logprobs[i].first, lp.top_logprobs[i].second, static_cast<int32_t>(i + 1));
    out.push_back(std::move(entry));
  }
  return out;
}

json tool_call_json(const ToolCall& c) {
  return {{"id", c.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

json tool_delta_json(const ToolCallDelta& d) {
  json j = {{"index", d.index}};
  if (d.first) {
    j["id"] = d.id;
    j["type"] = "function";
    j["function"] = {{"name", d.name}, {"arguments", d.arguments}};
  } else {
    j["function"] = {{"arguments", d.arguments}};
  }
  return j;
}

json stop_reason_json(const std::variant<std::monostate, std::string, int32_t>& v) {
  if (std::holds_alternative<std::string>(v)) return std::get<std::string>(v);
  if (std::holds_alternative<int32_t>(v)) return std::get<int32_t>(v);
  return nullptr;
}

json chunk_envelope(const std::string& id, bool chat, int64_t created, const std::string& model,
                    json choices) {
  json chunk = {{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", std::move(choices)}};
  if (!chat) chunk["usage"] = nullptr;
  return chunk;
}

}  // namespace api
