// `chunkpipe tokenize DIR`: one JSON id array per stdin line (raw text, or a JSON string with
// --json-lines); with --decode, id arrays in and JSON strings out. Bad lines get an error on
// stderr naming the line and the run continues; the exit code is 1 if any line failed.
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/arg_parser.h"
#include "cli/commands.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace cli {

int run_tokenize_command(int argc, char** argv) {
  using nlohmann::json;
  ArgParser p("chunkpipe tokenize",
              "Encodes stdin lines to token ids (or decodes ids) with DIR/tokenizer.json.");
  p.add_positional("DIR",
                   "directory holding tokenizer.json (and optionally tokenizer_config.json)");
  p.add_flag("json-lines", "each input line is a JSON string");
  p.add_flag("bos", "prepend the BOS token id");
  p.add_flag("decode", "read JSON id arrays and print JSON strings");
  p.add_flag("skip-special-tokens", "with --decode: drop special tokens");
  if (auto st = p.parse(argc, argv, 2); !st.ok()) {
    std::fprintf(stderr, "%s\nchunkpipe tokenize: error: %s\n", p.usage().c_str(),
                 st.message().c_str());
    return 2;
  }
  if (p.help_requested()) {
    std::printf("%s", p.usage().c_str());
    return 0;
  }
  auto tok = tokenizer::Tokenizer::load(p.positional("DIR"));
  if (!tok.ok()) {
    std::fprintf(stderr, "chunkpipe tokenize: error: %s\n", tok.status().message().c_str());
    return 1;
  }
  if (p.flag("bos") && !(*tok)->bos_token_id()) {
    std::fprintf(stderr,
                 "chunkpipe tokenize: error: --bos needs a bos_token in tokenizer_config.json\n");
    return 2;
  }
  std::string line;
  int line_no = 0, failures = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (p.flag("decode")) {
      json ids = json::parse(line, nullptr, false);
      if (ids.is_discarded() || !ids.is_array() ||
          !std::all_of(ids.begin(), ids.end(),
                       [](const json& v) { return v.is_number_integer(); })) {
        std::fprintf(stderr,
                     "chunkpipe tokenize: error: line %d is not a JSON array of token ids\n",
                     line_no);
        ++failures;
        continue;
      }
      const auto v = ids.get<std::vector<int32_t>>();
      const std::string text =
          tokenizer::sanitize_utf8((*tok)->decode(v, p.flag("skip-special-tokens")));
      std::printf("%s\n", json(text).dump().c_str());
      continue;
    }
    std::string text = line;
    if (p.flag("json-lines")) {
      json s = json::parse(line, nullptr, false);
      if (s.is_discarded() || !s.is_string()) {
        std::fprintf(stderr, "chunkpipe tokenize: error: line %d is not a JSON string\n", line_no);
        ++failures;
        continue;
      }
      text = s.get<std::string>();
    }
    std::printf("%s\n", json((*tok)->encode(text, p.flag("bos"))).dump().c_str());
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace cli
