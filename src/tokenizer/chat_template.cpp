// Message normalization, the built-in V3.1 renderer and the Jinja-or-builtin dispatch.
#include "tokenizer/chat_template.h"

#include <algorithm>
#include <string_view>

#include "tokenizer/deepseek_v31_template_text.h"

namespace tokenizer {
namespace {

using common::Result;
using nlohmann::json;

const char* const kUser = "<｜User｜>";
const char* const kAssistant = "<｜Assistant｜>";
const char* const kEos = "<｜end▁of▁sentence｜>";

// The model card's description of the request's tools, as vLLM's DeepSeek-V3.1 tool template
// appends it to the system text. Entries were validated by the API server; anything else
// (the fuzzer's input) renders as empty fields rather than failing.
std::string tools_description(const json& tools) {
  std::string out = "\n\n## Tools\nYou have access to the following tools:\n";
  for (const json& t : tools) {
    const json* f = t.is_object() && t.contains("function") ? &t["function"] : nullptr;
    auto text = [&](const char* key) {
      return f && f->is_object() && f->contains(key) && (*f)[key].is_string()
                 ? (*f)[key].get<std::string>()
                 : std::string();
    };
    const json parameters =
        f && f->is_object() && f->contains("parameters") && (*f)["parameters"].is_object()
            ? (*f)["parameters"]
            : json::object();
    out += "\n### " + text("name") + "\nDescription: " + text("description") +
           "\n\nParameters: " + jinja::to_json_text(parameters) + "\n";
  }
  out +=
      "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments"
      "<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\nWhere:\n\n"
      "- `tool_call_name` must be an exact match to one of the available tools\n"
      "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters "
      "Schema\n"
      "- For multiple tool calls, chain them directly without separators or spaces\n";
  return out;
}

}  // namespace

Result<json> normalize_messages(const json& messages) {
  if (!messages.is_array()) return common::invalid_argument("'messages' must be a list");
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    json m = messages[i];
    if (!m.is_object()) return common::invalid_argument(where + " must be an object");
    if (!m.contains("role") || !m["role"].is_string()) {
      return common::invalid_argument(where + ".role must be a string");
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        role != "developer") {
      return common::invalid_argument(where + ".role '" + role +
                                      "' is not one of system, user, assistant, tool");
    }
    if (!m.contains("content")) m["content"] = nullptr;
    json& c = m["content"];
    if (c.is_array()) {
      std::string text;
      for (size_t p = 0; p < c.size(); ++p) {
        const json& part = c[p];
        const auto type = part.is_object() ? part.find("type") : part.end();
        if (!part.is_object() || type == part.end() || *type != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return common::invalid_argument(where + ".content[" + std::to_string(p) +
                                          "] must be a {\"type\": \"text\", \"text\": ...} part");
        }
        if (p) text += "\n";
        text += part["text"].get<std::string>();
      }
      c = text;
    } else if (!c.is_string() && !c.is_null()) {
      return common::invalid_argument(where +
                                      ".content must be a string, a list of text parts, or null");
    }
    if (c.is_null() && role != "assistant") {
      return common::invalid_argument(where + ".content is required for role '" + role + "'");
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array())
        return common::invalid_argument(where + ".tool_calls must be a list");
      for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
        json& call = m["tool_calls"][k];
        const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string()) {
          return common::invalid_argument(cw + ".function.name must be a string");
        }
        json& args = call["function"]["arguments"];
        if (args.is_null()) args = "{}";
        if (!args.is_string())
          args = args.dump(-1, ' ', false, json::error_handler_t::replace);  // a JSON string
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

Result<std::string> render_deepseek_v31(const json& raw_messages,
                                        const ChatRenderOptions& options) {
  CP_ASSIGN_OR_RETURN(json messages, normalize_messages(raw_messages));
  const json& kw = options.chat_template_kwargs;
  bool thinking = false;
  if (kw.contains("thinking")) {
    thinking = kw["thinking"].is_boolean() && kw["thinking"].get<bool>();
  } else if (kw.contains("enable_thinking")) {
    thinking = kw["enable_thinking"].is_boolean() && kw["enable_thinking"].get<bool>();
  }
  std::string out = options.bos_token;
  bool first_system = true;
  for (const json& m : messages) {
    if (m["role"] == "system") {
      if (!first_system) out += "\n\n";
      out += m["content"].is_string() ? m["content"].get<std::string>() : "";
      first_system = false;
    }
  }
  if (!options.tools.is_null())
    out += tools_description(options.tools.is_array() ? options.tools : json::array());
  bool after_user = false, after_tool = false;
  for (const json& m : messages) {
    const std::string role = m["role"].get<std::string>();
    const std::string content = m["content"].is_string() ? m["content"].get<std::string>() : "";
    if (role == "user") {
      out += kUser + content;
      after_user = true;
      after_tool = false;
    } else if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (after_user) out += std::string(kAssistant) + "</think>";
      bool first = true;
      for (const json& call : m["tool_calls"]) {
        if (first) out += content + "<｜tool▁calls▁begin｜>";
        first = false;
        out += "<｜tool▁call▁begin｜>" + call["function"]["name"].get<std::string>() +
               "<｜tool▁sep｜>" + call["function"]["arguments"].get<std::string>() +
               "<｜tool▁call▁end｜>";
      }
      out += std::string("<｜tool▁calls▁end｜>") + kEos;
      after_user = after_tool = false;
    } else if (role == "assistant") {
      if (after_user) {
        const bool prefix =
            m.contains("prefix") && m["prefix"].is_boolean() && m["prefix"].get<bool>();
        out += std::string(kAssistant) + (prefix && thinking ? "<think>" : "</think>");
      }
      const size_t close = content.find("</think>");
      if (after_tool || close == std::string::npos) {
        out += content + kEos;
      } else {
        out += content.substr(close + 8) + kEos;
      }
      after_user = after_tool = false;
    } else if (role == "tool") {
      out += "<｜tool▁output▁begin｜>" + content + "<｜tool▁output▁end｜>";
      after_user = false;
      after_tool = true;
    }
  }
  if (options.add_generation_prompt && after_user) {
    out += std::string(kAssistant) + (thinking ? "<think>" : "</think>");
  }
  return out;
}

const std::string& deepseek_v31_template_text() {
  static const std::string kText = kDeepseekV31TemplateText;
  return kText;
}

Result<std::unique_ptr<ChatTemplate>> ChatTemplate::create(const std::string& jinja_source) {
  auto t = std::make_unique<ChatTemplate>();
  if (!jinja_source.empty()) {
    CP_ASSIGN_OR_RETURN(t->jinja_, jinja::Template::parse(jinja_source));
  }
  return t;
}

namespace {

std::string_view strip(std::string_view s, bool left, bool right) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  if (left) s.remove_prefix(std::min(s.size(), s.find_first_not_of(kSpace)));
  if (right) {
    const size_t last = s.find_last_not_of(kSpace);
    s = last == std::string_view::npos ? std::string_view() : s.substr(0, last + 1);
  }
  return s;
}

// continue_final_message, by Hugging Face's rule: cut the rendering after the last occurrence
// of the final message's text. The whole text when the template kept its trailing whitespace,
// else the text up to it.
Result<std::string> open_final_message(const std::string& rendered, const json& messages) {
  CP_ASSIGN_OR_RETURN(json normalized, normalize_messages(messages));
  if (normalized.empty())
    return common::invalid_argument("continue_final_message needs a final message");
  const json& content = normalized.back()["content"];
  const std::string text = content.is_string() ? content.get<std::string>() : "";
  const std::string_view stripped = strip(text, true, true), lstripped = strip(text, true, false);
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos)
    return common::invalid_argument(
        "continue_final_message is set but the final message does not appear in the rendered "
        "chat: the chat template changes its text");
  const bool kept_whole = rendered.compare(at, lstripped.size(), lstripped) == 0;
  return rendered.substr(0, at + (kept_whole ? lstripped.size() : stripped.size()));
}

}  // namespace

Result<std::string> ChatTemplate::render(const json& messages,
                                         const ChatRenderOptions& options) const {
  CP_ASSIGN_OR_RETURN(std::string rendered, render_whole(messages, options));
  if (!options.continue_final_message) return rendered;
  return open_final_message(rendered, messages);
}

Result<std::string> ChatTemplate::render_whole(const json& messages,
                                               const ChatRenderOptions& options) const {
  if (jinja_ == nullptr) return render_deepseek_v31(messages, options);
  CP_ASSIGN_OR_RETURN(json normalized, normalize_messages(messages));
  json context =
      options.chat_template_kwargs.is_object() ? options.chat_template_kwargs : json::object();
  context["messages"] = std::move(normalized);
  context["add_generation_prompt"] = options.add_generation_prompt;
  context["bos_token"] = options.bos_token;
  context["eos_token"] = options.eos_token;
  if (!options.tools.is_null()) context["tools"] = options.tools;
  return jinja_->render(context);
}

}  // namespace tokenizer
