// The request and response pieces of api/: tool_choice and tools, the prompt's shapes, and the
// logprobs layouts.
#include <gtest/gtest.h>

#include "api/prompt_input.h"
#include "api/protocol.h"
#include "api/response.h"
#include "api/tool_request.h"

namespace {

using nlohmann::json;

std::string tool_error(const json& body) {
  api::ToolChoice c;
  auto e = api::parse_tool_request(body, &c);
  return e ? e->message : "";
}

TEST(ToolRequestTest, ChoiceDefaultsAndErrors) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"f"}}])");
  api::ToolChoice c;
  EXPECT_FALSE(api::parse_tool_request({{"tools", tools}}, &c));
  EXPECT_EQ(c.mode, api::ToolChoice::Mode::kAuto);
  EXPECT_FALSE(api::parse_tool_request(json::object(), &c));
  EXPECT_EQ(c.mode, api::ToolChoice::Mode::kNone);
  EXPECT_FALSE(api::parse_tool_request(
      {{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}},
      &c));
  EXPECT_EQ(c.mode, api::ToolChoice::Mode::kNamed);
  EXPECT_EQ(c.name, "f");
  EXPECT_EQ(tool_error({{"tool_choice", "required"}}),
            "When using `tool_choice`, `tools` must be set.");
  EXPECT_NE(tool_error({{"tools", tools}, {"tool_choice", "sometimes"}}).find("'tool_choice'"),
            std::string::npos);
  EXPECT_NE(tool_error({{"tools", tools},
                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}})
                .find("'g' doesn't match"),
            std::string::npos);
  EXPECT_NE(tool_error({{"tools", json::parse(R"([{"function":{"name":1}}])")}})
                .find("tools[0].function.name"),
            std::string::npos);
}

TEST(PromptInputTest, EveryShapeAndTheErrors) {
  std::vector<api::PromptInput> p;
  EXPECT_FALSE(api::parse_completion_prompts({{"prompt", "hi"}}, 100, &p));
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[0].is_text);
  p.clear();
  EXPECT_FALSE(api::parse_completion_prompts({{"prompt", {{1, 2}, {3}}}}, 100, &p));
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].token_ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(api::count_completion_prompts({{"prompt", {"a", "b", "c"}}}), 3);
  EXPECT_EQ(api::count_completion_prompts({{"prompt", {1, 2, 3}}}), 1);
  p.clear();
  auto e = api::parse_completion_prompts({{"prompt", {1, 100}}}, 100, &p);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("[0, vocab size)"), std::string::npos);
  EXPECT_TRUE(api::parse_completion_prompts({{"prompt", {"a", 1}}}, 100, &p));
  EXPECT_TRUE(api::parse_completion_prompts({{"prompt", 5}}, 100, &p));
  EXPECT_TRUE(api::parse_completion_prompts(json::object(), 100, &p));
}

TEST(ResponseTest, LogprobLayouts) {
  const std::vector<sched::SampledToken> lps = {{7, -0.5f, {{7, -0.5f}, {8, -1.0f}}},
                                                {8, -1.5f, {}}};
  const api::TokenText text = [](int32_t id) { return "t" + std::to_string(id); };
  const json chat = api::chat_logprobs_json(lps, text);
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["token"], "t8");
  const json completion = api::completion_logprobs_json(lps, text);
  EXPECT_EQ(completion["text_offset"], json::parse("[0, 2]"));
  EXPECT_EQ(completion["tokens"], json::parse(R"(["t7", "t8"])"));
  EXPECT_EQ(completion["top_logprobs"][0]["t8"], -1.0);
  EXPECT_EQ(api::stop_reason_json(std::string("END")), "END");
  EXPECT_TRUE(api::stop_reason_json({}).is_null());
  EXPECT_TRUE(api::chunk_envelope("x", false, 1, "m", json::array())["usage"].is_null());
}

}  // namespace

namespace {

TEST(PromptBytesTest, RefusesOnlyWhatMustExceedTheContext) {
  EXPECT_FALSE(api::check_prompt_bytes(1000, 2, 512));  // at least 500 tokens: tokenize it
  auto e = api::check_prompt_bytes(1024, 2, 512);       // at least 512: refused unread
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_NE(e->message.find("maximum context length is 512 tokens. However, your request has at "
                            "least 512 input tokens (1024 bytes)"),
            std::string::npos);
}

}  // namespace
