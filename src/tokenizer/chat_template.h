// Chat prompt rendering: OpenAI-style messages -> prompt text. Uses the Jinja chat template a
// checkpoint ships (or --chat-template FILE) and falls back to the built-in C++ DeepSeek-V3.1
// template. Immutable after construction; render() is thread-safe.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "tokenizer/jinja.h"

namespace tokenizer {

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Leave the final message open for the model to continue: the rendering stops right after
  // its text (no end of turn, no EOS), as Hugging Face's apply_chat_template does.
  bool continue_final_message = false;
  nlohmann::json chat_template_kwargs = nlohmann::json::object();  // e.g. {"thinking": true}
  std::string bos_token = "<｜begin▁of▁sentence｜>";
  std::string eos_token = "<｜end▁of▁sentence｜>";
  nlohmann::json tools = nullptr;  // the request's `tools`, for templates that render them
};

// Messages with `content` given as a list of text parts become plain strings (parts joined
// with "\n", as vLLM does); a missing content becomes null. Errors name the message index.
common::Result<nlohmann::json> normalize_messages(const nlohmann::json& messages);

// The built-in DeepSeek-V3.1 template in C++ (same output as templates/deepseek_v31.jinja).
common::Result<std::string> render_deepseek_v31(const nlohmann::json& messages,
                                                const ChatRenderOptions& options);
// The Jinja text of that template, for checkpoints made by chunkpipe.
const std::string& deepseek_v31_template_text();

class ChatTemplate {
 public:
  // Empty `jinja_source` selects the built-in template.
  static common::Result<std::unique_ptr<ChatTemplate>> create(const std::string& jinja_source);
  common::Result<std::string> render(const nlohmann::json& messages,
                                     const ChatRenderOptions& options) const;
  bool is_builtin() const { return jinja_ == nullptr; }

 private:
  common::Result<std::string> render_whole(const nlohmann::json& messages,
                                           const ChatRenderOptions& options) const;
  std::unique_ptr<jinja::Template> jinja_;
};

}  // namespace tokenizer
