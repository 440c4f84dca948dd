// Response JSON builders.
#include "api/response.h"

namespace api {

using nlohmann::json;

json chat_logprobs_json(const std::vector<sched::SampledToken>& lps, const TokenText& text) {
  json content = json::array();
  for (const auto& lp : lps) {
    json top = json::array();
    for (const auto& [id, v] : lp.top_logprobs)
      top.push_back({{"token", text(id)}, {"logprob", v}, {"bytes", nullptr}});
    content.push_back({{"token", text(lp.token)},
                       {"logprob", lp.logprob},
                       {"bytes", nullptr},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json completion_logprobs_json(const std::vector<sched::SampledToken>& lps, const TokenText& text) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  size_t offset = 0;  // bytes into the generated text
  for (const auto& lp : lps) {
    tokens.push_back(text(lp.token));
    token_logprobs.push_back(lp.logprob);
    json t = json::object();
    for (const auto& [id, v] : lp.top_logprobs) t[text(id)] = v;
    top.push_back(t);
    offsets.push_back(offset);
    offset += tokens.back().get_ref<const std::string&>().size();
  }
  return {{"text_offset", offsets},
          {"token_logprobs", token_logprobs},
          {"tokens", tokens},
          {"top_logprobs", top}};
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
