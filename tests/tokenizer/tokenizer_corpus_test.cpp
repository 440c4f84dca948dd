// The real DeepSeek tokenizer.json (V3.1 added tokens) against the expected ids of the corpus
// made with the reference implementation, plus round trips and the reference BPE loop.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

namespace {

const tokenizer::Tokenizer& v31() {
  static std::unique_ptr<tokenizer::Tokenizer> t = [] {
    std::ifstream in(CHUNKPIPE_TOKENIZER_JSON);
    EXPECT_TRUE(in.good()) << CHUNKPIPE_TOKENIZER_JSON << " is missing: run scripts/setup.sh";
    std::stringstream ss;
    ss << in.rdbuf();
    auto patched = tokenizer::deepseek_v31_tokenizer_json(ss.str());
    EXPECT_TRUE(patched.ok()) << patched.status().message();
    auto tok = tokenizer::Tokenizer::from_json(*patched, "tokenizer.json");
    EXPECT_TRUE(tok.ok()) << tok.status().message();
    return std::move(tok).value();
  }();
  return *t;
}

TEST(TokenizerCorpusTest, IdsIdenticalToReferenceAndRoundTrip) {
  std::ifstream in(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tokenizer/deepseek_v31_corpus.jsonl");
  ASSERT_TRUE(in.good());
  std::string line;
  int lines = 0, identical = 0, round_trips = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string text = j["text"].get<std::string>();
    const auto expected = j["ids"].get<std::vector<int32_t>>();
    const auto ids = v31().encode(text);
    ++lines;
    if (ids == expected) {
      ++identical;
    } else {
      ADD_FAILURE() << "line " << lines
                    << " differs: " << nlohmann::json(text).dump().substr(0, 200) << "\n got      "
                    << nlohmann::json(ids).dump().substr(0, 300) << "\n expected "
                    << nlohmann::json(expected).dump().substr(0, 300);
    }
    if (v31().decode(ids) == text) ++round_trips;
    EXPECT_EQ(v31().encode_reference(text), ids)
        << "heap BPE differs from reference on line " << lines;
  }
  std::printf("    corpus: %d lines, %d identical ids, %d exact round trips\n", lines, identical,
              round_trips);
  EXPECT_GT(lines, 0);
  EXPECT_EQ(identical, lines);
  EXPECT_EQ(round_trips, lines);
}

TEST(TokenizerCorpusTest, AddedAndSpecialTokens) {
  const auto& t = v31();
  EXPECT_EQ(t.token_to_id("<think>"), 128798);
  EXPECT_EQ(t.token_to_id("</think>"), 128799);
  EXPECT_EQ(t.token_to_id("<｜begin▁of▁sentence｜>"), 0);
  auto ids = t.encode("<｜User｜>hi<｜Assistant｜></think>");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 128803);
  EXPECT_EQ(ids[ids.size() - 2], 128804);
  EXPECT_EQ(ids.back(), 128799);
  EXPECT_TRUE(t.is_special(0));
  EXPECT_FALSE(t.is_special(128798));
  const std::vector<int32_t> with_special = {0, ids[1], 1};
  EXPECT_EQ(t.decode(with_special, /*skip_special_tokens=*/true), t.decode({ids.data() + 1, 1}));
}

// token_string spells each id as the vocabulary does (what /tokenize's token_strs returns), so
// that looking the spelling up gives the id back, for every id.
TEST(TokenizerCorpusTest, TokenStringsSpellTheVocabulary) {
  const auto& t = v31();
  const auto ids = t.encode(" hello<think>");
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(t.token_string(ids[0]), "\u0120hello");  // the byte-level form of " hello"
  EXPECT_EQ(t.token_string(ids[1]), "<think>");
  EXPECT_EQ(t.token_string(-1), "");
  EXPECT_EQ(t.token_string(t.vocab_size()), "");
  int spelled = 0;
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    const std::string s = t.token_string(id);
    if (s.empty()) continue;  // ids the vocabulary skips
    ++spelled;
    ASSERT_EQ(t.token_to_id(s), id) << s;
  }
  EXPECT_GT(spelled, 128000);
}

TEST(TokenizerErrorsTest, MalformedFilesNameTheProblem) {
  auto err = [](const std::string& text) {
    auto t = tokenizer::Tokenizer::from_json(text, "tokenizer.json");
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string() : t.status().message();
  };
  EXPECT_EQ(err("{\"added_tokens\": []}"), "tokenizer.json: missing 'model'");
  EXPECT_EQ(err("[1, 2"), "tokenizer.json: not a JSON object");
  const std::string model = R"("model": {"type": "BPE", "vocab": {}, "merges": []})";
  EXPECT_EQ(err("{" + model + R"(, "pre_tokenizer": {"type": "Whitespace"}})"),
            "tokenizer.json: pre-tokenizer type 'Whitespace' is not supported");
  EXPECT_NE(
      err("{" + model +
          R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated"}})")
          .find("tokenizer.json: bad pre-tokenizer regex at offset"),
      std::string::npos);
  EXPECT_EQ(err("{" + model + R"(, "normalizer": {"type": "NFKC"}})"),
            "tokenizer.json: normalizer type 'NFKC' is not supported");
  // Found by fuzz_tokenizer_json: a negative (or huge) id indexed the token tables.
  for (const char* id : {"-1", "4294967295", "99999999999"}) {
    EXPECT_EQ(err("{" + model + R"(, "added_tokens": [{"id": )" + id + R"(, "content": "x"}]})"),
              "tokenizer.json: added_tokens holds an entry without a valid integer 'id' and "
              "string 'content'");
  }
  // Wrong-typed fields are a bad file, not an exception.
  EXPECT_NE(
      err(R"({"model": {"type": ["BPE"], "vocab": {}, "merges": []}})").find("tokenizer.json: "),
      std::string::npos);
}

}  // namespace

// Distinct long words (what a client can send to /tokenize without a key) must not grow the
// word cache without bound: long words are not cached, and the cache is capped in bytes.
TEST(TokenizerCacheTest, WordCacheIsBoundedInBytes) {
  const auto& t = v31();
  std::mt19937 rng(3);
  auto word = [&](size_t len) {
    std::string w(len, 'a');
    for (char& c : w) c = static_cast<char>('a' + rng() % 26);
    return w;
  };
  const size_t before = t.word_cache_bytes();
  for (int i = 0; i < 100; ++i) t.encode(" " + word(4000));  // never cached
  EXPECT_EQ(t.word_cache_bytes(), before);
  constexpr size_t kLimit = 256 << 10;
  t.set_word_cache_limit_bytes(kLimit);
  std::string text;
  for (int i = 0; i < 4000; ++i) text += " " + word(200);  // ~800 KB of distinct words
  const auto ids = t.encode(text);
  t.set_word_cache_limit_bytes(tokenizer::BpeModel::kDefaultCacheLimitBytes);
  EXPECT_GT(ids.size(), 4000u);
  EXPECT_GT(t.word_cache_bytes(), 0u);
  EXPECT_LE(t.word_cache_bytes(), kLimit);
  EXPECT_EQ(t.decode(ids), text) << "cached and uncached words encode alike";
}
