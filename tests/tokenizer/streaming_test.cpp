// Streaming pieces of text: the incremental detokenizer (never half a UTF-8 character; the
// stream concatenates to the full decode) and the reasoning parser (same split streamed or not).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/detokenizer.h"
#include "tokenizer/reasoning_parser.h"

namespace {

std::unique_ptr<tokenizer::Tokenizer> load_v31() {
  std::ifstream in(CHUNKPIPE_TOKENIZER_JSON);
  std::stringstream ss;
  ss << in.rdbuf();
  auto patched = tokenizer::deepseek_v31_tokenizer_json(ss.str());
  EXPECT_TRUE(patched.ok());
  auto t = tokenizer::Tokenizer::from_json(*patched, "tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

TEST(SanitizeUtf8Test, ReplacesInvalidBytes) {
  EXPECT_EQ(tokenizer::sanitize_utf8("abc"), "abc");
  EXPECT_EQ(tokenizer::sanitize_utf8("\xE4\xBD\xA0"), "你");
  EXPECT_EQ(tokenizer::sanitize_utf8("a\xFF"
                                     "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(tokenizer::sanitize_utf8("\xE4\xBD"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // truncated at end
  EXPECT_EQ(tokenizer::sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(tokenizer::sanitize_utf8("\xED\xA0\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

TEST(IncrementalDetokenizerTest, StreamEqualsFullDecodeAndNeverSplitsCharacters) {
  auto tok = load_v31();
  std::ifstream in(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tokenizer/deepseek_v31_corpus.jsonl");
  std::string line;
  int lines = 0, held_pieces = 0;
  while (std::getline(in, line)) {
    const auto ids = nlohmann::json::parse(line)["ids"].get<std::vector<int32_t>>();
    tokenizer::IncrementalDetokenizer detok(*tok, false);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = detok.push(id);
      EXPECT_EQ(tokenizer::sanitize_utf8(piece), piece) << "piece is not valid UTF-8";
      if (piece.empty() && !tok->token_bytes(id).empty()) ++held_pieces;
      streamed += piece;
    }
    streamed += detok.flush();
    EXPECT_EQ(streamed, tokenizer::sanitize_utf8(tok->decode(ids))) << "line " << lines;
    ++lines;
  }
  EXPECT_GT(lines, 300);
  EXPECT_GT(held_pieces, 0) << "the corpus should contain characters split across tokens";
}

// A PD recompute round: the output so far goes back as the prompt of a second request. Cut
// wherever a character is split across tokens, the first round (not flushed) and the second
// (seeded with its prompt) must still join into the full decode.
TEST(IncrementalDetokenizerTest, ARoundThatEndsInsideACharacterIsFinishedByTheNext) {
  auto tok = load_v31();
  std::ifstream in(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tokenizer/deepseek_v31_corpus.jsonl");
  std::string line;
  int cuts = 0;
  while (std::getline(in, line) && cuts < 200) {
    const auto ids = nlohmann::json::parse(line)["ids"].get<std::vector<int32_t>>();
    tokenizer::IncrementalDetokenizer probe(*tok, false);
    for (size_t cut = 0; cut + 1 < ids.size(); ++cut) {
      if (!probe.push(ids[cut]).empty() || tok->token_bytes(ids[cut]).empty()) continue;
      // ids[cut] left bytes pending: end round one after it.
      tokenizer::IncrementalDetokenizer first(*tok, false), second(*tok, false);
      std::string text;
      for (size_t i = 0; i <= cut; ++i) text += first.push(ids[i]);
      second.seed(std::span<const int32_t>(ids.data(), cut + 1));
      for (size_t i = cut + 1; i < ids.size(); ++i) text += second.push(ids[i]);
      text += second.flush();
      ASSERT_EQ(text, tokenizer::sanitize_utf8(tok->decode(ids))) << "cut after token " << cut;
      ++cuts;
    }
  }
  EXPECT_GT(cuts, 10) << "the corpus should contain characters split across tokens";
}

TEST(IncrementalDetokenizerTest, SkipsSpecialTokens) {
  auto tok = load_v31();
  std::vector<int32_t> ids = {0};
  for (int32_t id : tok->encode("héllo <think>x")) ids.push_back(id);
  ids.push_back(1);
  tokenizer::IncrementalDetokenizer detok(*tok, true);
  std::string s;
  for (int32_t id : ids) s += detok.push(id);
  s += detok.flush();
  EXPECT_EQ(s, "héllo <think>x");  // <think> is not special in V3.1
}

TEST(ReasoningParserTest, SplitsAtThinkClose) {
  auto d = tokenizer::ReasoningParser::split("let me think</think>The answer is 4.", true);
  EXPECT_EQ(d.reasoning, "let me think");
  EXPECT_EQ(d.content, "The answer is 4.");
  d = tokenizer::ReasoningParser::split("<think>r</think>c", false);
  EXPECT_EQ(d.reasoning, "r");
  EXPECT_EQ(d.content, "c");
  d = tokenizer::ReasoningParser::split("plain answer </thin", false);
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "plain answer </thin");
  d = tokenizer::ReasoningParser::split("unfinished reasoning </thi", true);
  EXPECT_EQ(d.reasoning, "unfinished reasoning </thi");
  EXPECT_EQ(d.content, "");
}

TEST(ReasoningParserTest, StreamingMatchesWholeForEverySplitPoint) {
  const std::string text = "<think>a</think>b</think>c";
  for (bool start : {true, false}) {
    const auto whole = tokenizer::ReasoningParser::split(text, start);
    for (size_t step = 1; step <= 4; ++step) {
      tokenizer::ReasoningParser p(start);
      std::string r, c;
      for (size_t i = 0; i < text.size(); i += step) {
        auto d = p.push(std::string_view(text).substr(i, step));
        r += d.reasoning;
        c += d.content;
      }
      auto d = p.flush();
      EXPECT_EQ(r + d.reasoning, whole.reasoning) << "step " << step;
      EXPECT_EQ(c + d.content, whole.content) << "step " << step;
    }
  }
  EXPECT_EQ(tokenizer::ReasoningParser::split(text, true).reasoning, "a");
  EXPECT_EQ(tokenizer::ReasoningParser::split(text, true).content, "b</think>c");
}

}  // namespace
