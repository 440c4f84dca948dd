// A Jinja subset for chat templates: the constructs Hugging Face chat templates use (output,
// if/elif/else, for with loop.*, set including namespace attributes, filters such as tojson,
// tests such as `is defined`, string methods such as split, whitespace control), with
// trim_blocks and lstrip_blocks on, as transformers and @huggingface/jinja render them.
// A parsed template is immutable; render() is thread-safe.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace tokenizer::jinja {

struct Node;

// `value` as the tojson filter prints it: Python's json.dumps separators (", " and ": "),
// non-ASCII kept, invalid UTF-8 replaced.
std::string to_json_text(const nlohmann::json& value);

// The source as the lexer sees it, as @huggingface/jinja prepares it: one trailing newline
// dropped, lstrip_blocks (spaces and tabs from a line's start to a `{%`, `{#` or `{-` go) and
// trim_blocks (the newline right after `%}`, `#}` or `-}` goes). Linear in the source.
std::string strip_block_whitespace(std::string source);

class Template {
 public:
  // Syntax errors name the line and what was expected.
  static common::Result<std::unique_ptr<Template>> parse(const std::string& source);
  ~Template();

  // Renders with the top-level variables of `context` (a JSON object). Runtime errors
  // (raise_exception, type errors) come back as InvalidArgument.
  common::Result<std::string> render(const nlohmann::json& context) const;

 private:
  Template() = default;
  std::unique_ptr<Node> root_;
};

}  // namespace tokenizer::jinja
