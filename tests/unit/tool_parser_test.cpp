// The DeepSeek tool-call parsers on recorded model text: whole, split at every byte, and one
// byte at a time. Streamed deltas must add up to the whole result.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api/tool_parser.h"

namespace {

const std::string kBegin = "<｜tool▁calls▁begin｜>", kEnd = "<｜tool▁calls▁end｜>",
                  kCall = "<｜tool▁call▁begin｜>", kCallEnd = "<｜tool▁call▁end｜>",
                  kSep = "<｜tool▁sep｜>";

struct Parsed {
  std::string content;
  std::vector<api::ToolCall> calls;
  std::vector<std::string> streamed_args;  // per call, from the deltas
  std::vector<std::string> streamed_names;
};

Parsed run(const std::string& parser, const std::vector<std::string>& pieces) {
  auto p = api::ToolCallParser::create(parser, "call-");
  EXPECT_NE(p, nullptr);
  Parsed out;
  auto take = [&](const api::ToolParseDelta& d) {
    out.content += d.content;
    for (const auto& c : d.calls) {
      if (c.first) {
        EXPECT_EQ(c.index, static_cast<int>(out.streamed_names.size()));
        out.streamed_names.push_back(c.name);
        out.streamed_args.emplace_back();
      }
      ASSERT_LT(c.index, static_cast<int>(out.streamed_args.size()));
      out.streamed_args[c.index] += c.arguments;
    }
  };
  for (const auto& piece : pieces) take(p->push(piece));
  take(p->flush());
  out.calls = p->calls();
  return out;
}

void expect_same_at_every_split(const std::string& parser, const std::string& text,
                                const std::string& content,
                                const std::vector<std::pair<std::string, std::string>>& calls) {
  std::vector<std::vector<std::string>> splits = {{text}};
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    splits.push_back({text.substr(0, cut), text.substr(cut)});
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  splits.push_back(bytes);
  for (const auto& pieces : splits) {
    const Parsed r = run(parser, pieces);
    ASSERT_EQ(r.content, content) << "pieces: " << pieces.size();
    ASSERT_EQ(r.calls.size(), calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].name, calls[i].first);
      EXPECT_EQ(r.calls[i].arguments, calls[i].second);
      EXPECT_EQ(r.calls[i].id, "call-" + std::to_string(i));
      EXPECT_EQ(r.streamed_names[i], calls[i].first);
      EXPECT_EQ(r.streamed_args[i], calls[i].second) << "deltas add up to the arguments";
    }
  }
}

TEST(ToolParserTest, DeepSeekV31TwoCallsAfterContent) {
  const std::string text = "Let me check both." + kBegin + kCall + "get_weather" + kSep +
                           R"({"city": "Tokyo", "unit": "celsius"})" + kCallEnd + kCall +
                           "get_time" + kSep + R"({"tz": "Asia/Tokyo"})" + kCallEnd + kEnd;
  expect_same_at_every_split("deepseek_v31", text, "Let me check both.",
                             {{"get_weather", R"({"city": "Tokyo", "unit": "celsius"})"},
                              {"get_time", R"({"tz": "Asia/Tokyo"})"}});
}

TEST(ToolParserTest, DeepSeekV3FencedArguments) {
  const std::string text = kBegin + kCall + "function" + kSep + "get_weather\n```json\n" +
                           R"({"city": "Paris"})" + "\n```" + kCallEnd + kEnd;
  expect_same_at_every_split("deepseek_v3", text, "", {{"get_weather", R"({"city": "Paris"})"}});
}

TEST(ToolParserTest, TextWithoutCallsIsAllContent) {
  // Includes a lone '<' and a marker prefix that never completes.
  const std::string text = "1 < 2, and <｜tool is not a marker";
  expect_same_at_every_split("deepseek_v31", text, text, {});
  expect_same_at_every_split("deepseek_v3", text, text, {});
}

TEST(ToolParserTest, OutputCutInsideACallKeepsWhatArrived) {
  const std::string text = kBegin + kCall + "search" + kSep + R"({"q": "chunk)";
  expect_same_at_every_split("deepseek_v31", text, "", {{"search", R"({"q": "chunk)"}});
}

TEST(ToolParserTest, UnknownParserIsNull) {
  EXPECT_EQ(api::ToolCallParser::create("hermes", "x"), nullptr);
}

}  // namespace
