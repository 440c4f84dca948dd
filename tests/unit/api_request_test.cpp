// The request and response pieces of api/: tool_choice and tools, the prompt's shapes, lax
// scalar conversion, and the logprobs layouts.
#include <gtest/gtest.h>

#include <limits>

#include "api/json_fields.h"
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

// pydantic's lax mode, case by case: what converts, and what stays an error.
TEST(LaxConversionTest, FollowsPydanticsConversionTable) {
  using api::LaxType;
  auto as = [](const json& v, LaxType t) { return api::lax_convert(v, t).value_or("refused"); };
  for (const json& v :
       {json(1), json(1.0), json("1"), json("on"), json("T"), json("yes"), json("True"), json("Y")})
    EXPECT_EQ(as(v, LaxType::kBool), true) << v;
  for (const json& v : {json(0), json(0.0), json("0"), json("OFF"), json("f"), json("false"),
                        json("n"), json("No")})
    EXPECT_EQ(as(v, LaxType::kBool), false) << v;
  for (const json& v : {json(2), json(0.5), json("maybe"), json(" true"), json(""), json::array()})
    EXPECT_EQ(as(v, LaxType::kBool), "refused") << v;

  EXPECT_EQ(as(true, LaxType::kInteger), 1);
  EXPECT_EQ(as(16.0, LaxType::kInteger), 16);
  EXPECT_EQ(as(-3.0, LaxType::kInteger), -3);
  EXPECT_EQ(as("16", LaxType::kInteger), 16);
  EXPECT_EQ(as(" +16 ", LaxType::kInteger), 16);
  EXPECT_EQ(as("-7", LaxType::kInteger), -7);
  EXPECT_EQ(as("16.00", LaxType::kInteger), 16);
  for (const json& v :
       {json(16.5), json(1e300), json("16.5"), json("1e3"), json("0x10"),
        json("99999999999999999999"), json(""), json("-"), json(".0"), json::object()})
    EXPECT_EQ(as(v, LaxType::kInteger), "refused") << v;

  EXPECT_EQ(as(false, LaxType::kNumber), 0.0);
  EXPECT_EQ(as("0.25", LaxType::kNumber), 0.25);
  EXPECT_EQ(as(" -1e-2 ", LaxType::kNumber), -0.01);
  for (const json& v : {json("nan"), json("inf"), json("1e999"), json("0x1p3"), json("1.5x"),
                        json(""), json::array()})
    EXPECT_EQ(as(v, LaxType::kNumber), "refused") << v;
}

// The readers convert as lax_convert does, range-check the result and name the field.
TEST(LaxConversionTest, FieldReadersConvertThenCheckTheRange) {
  int32_t n = 0;
  EXPECT_FALSE(api::read_field(json{{"n", "2"}}, "n", &n));
  EXPECT_EQ(n, 2);
  auto e = api::read_field(json{{"n", "4294967297"}}, "n", &n);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("'n' must be an integer in"), std::string::npos) << e->message;
  e = api::read_field(json{{"n", 2.5}}, "n", &n);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "'n' must be an integer, got number: 2.5");
  bool stream = false;
  EXPECT_FALSE(api::read_field(json{{"stream", "true"}}, "stream", &stream));
  EXPECT_TRUE(stream);
  std::string model;
  e = api::read_field(json{{"model", 5}}, "model", &model);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "'model' must be a string, got integer: 5");
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
  EXPECT_EQ(e->message, "'prompt' holds token id 100, outside the vocabulary [0, 100)");
  e = api::parse_completion_prompts({{"prompt", {{1, 2}, {3, -7}}}}, 100, &p);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "'prompt' holds token id -7, outside the vocabulary [0, 100)");
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
  EXPECT_EQ(chat["content"][0]["bytes"], json::parse("[116, 55]"));  // "t7" as UTF-8 bytes
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["bytes"], json::parse("[116, 56]"));
  const std::vector<sched::SampledToken> impossible = {
      {7, -std::numeric_limits<float>::infinity(), {}}};
  EXPECT_EQ(api::chat_logprobs_json(impossible, text)["content"][0]["logprob"], -9999.0);
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

// prompt_logprobs, echo's share of it, and echo with max_tokens 0 (lm-eval's loglikelihood).
TEST(PromptLogprobsRequestTest, FieldsAndErrors) {
  auto parse = [](const json& body, api::Endpoint e, api::CommonRequestFields* f) {
    return api::parse_common_fields(body, e, 20, 1000, f);
  };
  api::CommonRequestFields f;
  ASSERT_FALSE(parse({{"prompt_logprobs", 3}}, api::Endpoint::kChat, &f));
  EXPECT_EQ(f.sampling.prompt_logprobs, std::optional<int32_t>(3));
  f = {};
  ASSERT_FALSE(parse({{"echo", true}, {"logprobs", 2}}, api::Endpoint::kCompletions, &f));
  EXPECT_EQ(f.sampling.prompt_logprobs, std::optional<int32_t>(2)) << "echo scores the prompt";
  EXPECT_FALSE(f.echo_without_generation);
  f = {};
  ASSERT_FALSE(parse({{"echo", true}}, api::Endpoint::kCompletions, &f));
  EXPECT_FALSE(f.sampling.prompt_logprobs) << "echo without logprobs scores nothing";
  f = {};
  ASSERT_FALSE(
      parse({{"echo", true}, {"max_tokens", 0}, {"logprobs", 1}}, api::Endpoint::kCompletions, &f));
  EXPECT_TRUE(f.echo_without_generation);
  EXPECT_EQ(f.max_tokens, std::optional<int64_t>(1));
  f = {};
  auto e = parse({{"max_tokens", 0}}, api::Endpoint::kCompletions, &f);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "max_tokens must be at least 1, got 0.");
  e = parse({{"prompt_logprobs", 21}}, api::Endpoint::kCompletions, &f);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("greater than max allowed: 20"), std::string::npos);
  e = parse({{"prompt_logprobs", -1}}, api::Endpoint::kCompletions, &f);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("prompt_logprobs must be non-negative"), std::string::npos);
  e = parse({{"prompt_logprobs", "two"}}, api::Endpoint::kCompletions, &f);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("prompt_logprobs"), std::string::npos);
  e = parse({{"suffix", "x"}}, api::Endpoint::kCompletions, &f);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "suffix is not currently supported");
}

// Fields vLLM honours that used to be ignored: streaming refusals, continuous usage,
// truncate_prompt_tokens, allowed_token_ids, bad words and the constrained-decoding fields.
TEST(SamplingFieldsRequestTest, ParsedOrRefusedByName) {
  auto parse = [](const json& body, api::CommonRequestFields* f) {
    return api::parse_common_fields(body, api::Endpoint::kCompletions, 20, 1000, f);
  };
  auto refusal = [&](const json& body) {
    api::CommonRequestFields f;
    auto e = parse(body, &f);
    return e ? e->message : std::string("accepted");
  };
  EXPECT_EQ(refusal({{"stream", true}, {"prompt_logprobs", 1}}),
            "`prompt_logprobs` are not available when `stream=True`.");
  EXPECT_EQ(refusal({{"stream", true}, {"prompt_logprobs", 0}}), "accepted");
  api::CommonRequestFields f;
  ASSERT_FALSE(
      parse({{"stream", true},
             {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}},
            &f));
  EXPECT_TRUE(f.continuous_usage_stats);
  EXPECT_TRUE(f.include_usage);
  // List elements and logit_bias values convert as pydantic's lax mode converts them.
  f = {};
  ASSERT_FALSE(parse(json::parse(R"({"stop_token_ids": ["5", 6.0], "allowed_token_ids": ["7"],
                                     "logit_bias": {"3": "2.5"}})"),
                     &f));
  EXPECT_EQ(f.sampling.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(f.sampling.allowed_token_ids, (std::vector<int32_t>{7}));
  ASSERT_EQ(f.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(f.sampling.logit_bias[0].second, 2.5f);
  EXPECT_NE(refusal({{"stop_token_ids", {"5.5"}}}), "accepted");
  EXPECT_NE(refusal({{"logit_bias", {{"3", "lots"}}}}), "accepted");

  EXPECT_EQ(refusal({{"truncate_prompt_tokens", 0}}),
            "truncate_prompt_tokens must be an integer >= 1 or -1, got 0");
  EXPECT_EQ(refusal({{"truncate_prompt_tokens", -2}}),
            "truncate_prompt_tokens must be an integer >= 1 or -1, got -2");
  f = {};
  ASSERT_FALSE(parse({{"truncate_prompt_tokens", -1}}, &f));
  ASSERT_FALSE(api::resolve_truncation(64, &f));
  EXPECT_EQ(f.truncate_prompt_tokens, std::optional<int64_t>(64)) << "-1 is max_model_len";
  f = {};
  ASSERT_FALSE(parse({{"truncate_prompt_tokens", 65}}, &f));
  auto e = api::resolve_truncation(64, &f);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message,
            "truncate_prompt_tokens value (65) is greater than max_model_len (64). Please, "
            "select a smaller truncation size.");

  f = {};
  ASSERT_FALSE(parse({{"allowed_token_ids", {9, 3, 9}}}, &f));
  EXPECT_EQ(f.sampling.allowed_token_ids, (std::vector<int32_t>{3, 9}));
  EXPECT_EQ(refusal({{"allowed_token_ids", json::array()}}),
            "allowed_token_ids is not None and empty!");
  EXPECT_EQ(refusal({{"allowed_token_ids", {1000}}}),
            "allowed_token_ids contains out-of-vocab token id! (1000; vocabulary size 1000)");
  EXPECT_EQ(refusal({{"allowed_token_ids", {-1}}}),
            "allowed_token_ids contains out-of-vocab token id! (-1; vocabulary size 1000)");
  EXPECT_EQ(refusal({{"stop_token_ids", {5, 1000}}}),
            "'stop_token_ids' holds token id 1000, outside the vocabulary [0, 1000)");
  EXPECT_EQ(refusal({{"stop_token_ids", {999}}}), "accepted");
  EXPECT_EQ(refusal({{"allowed_token_ids", "1"}}),
            "'allowed_token_ids' must be a list of token ids");
  f = {};
  ASSERT_FALSE(parse({{"bad_words", {"foo", " bar"}}}, &f));
  EXPECT_EQ(f.bad_words, (std::vector<std::string>{"foo", " bar"}));
  EXPECT_EQ(refusal({{"bad_words", {1}}}), "'bad_words' must be a list of strings");
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                          "structural_tag", "structured_outputs"}) {
    EXPECT_EQ(
        refusal({{key, {{"type", "object"}}}}),
        std::string("'") + key + "' is not supported: chunkpipe has no constrained decoding yet");
    EXPECT_EQ(refusal({{key, nullptr}}), "accepted") << key;
  }
  EXPECT_NE(refusal({{"logits_processors", {"x"}}}).find("logits_processors"), std::string::npos);
  EXPECT_NE(refusal({{"prompt_embeds", "AAAA"}}).find("'prompt_embeds' is not supported"),
            std::string::npos);
  EXPECT_EQ(refusal({{"prompt_embeds", nullptr}}), "accepted");
  f = {};
  ASSERT_FALSE(parse({{"cache_salt", "tenant-a"}}, &f));
  EXPECT_EQ(f.cache_salt, "tenant-a");
  EXPECT_EQ(refusal({{"cache_salt", nullptr}}), "accepted");
  for (const json& bad : {json(""), json(5), json::array()})
    EXPECT_EQ(refusal({{"cache_salt", bad}}),
              "Parameter 'cache_salt' must be a non-empty string if provided.");
  f = {};
  ASSERT_FALSE(parse({{"priority", -3}}, &f));
  EXPECT_EQ(f.priority, -3);
  EXPECT_EQ(refusal({{"priority", nullptr}}), "accepted");
  EXPECT_NE(refusal({{"priority", "high"}}).find("priority"), std::string::npos);
  EXPECT_NE(refusal({{"priority", 1.5}}).find("priority"), std::string::npos);
  EXPECT_FALSE(api::check_priority(0, /*priority_scheduling=*/false));
  EXPECT_FALSE(api::check_priority(-3, /*priority_scheduling=*/true));
  ASSERT_TRUE(api::check_priority(-3, /*priority_scheduling=*/false));
  EXPECT_EQ(api::check_priority(-3, false)->message,
            "Got priority -3 but Priority scheduling is not enabled.");
  EXPECT_EQ(refusal({{"best_of", 1}}), "accepted");
  EXPECT_EQ(refusal({{"best_of", nullptr}}), "accepted");
  EXPECT_EQ(refusal({{"best_of", 3}}),
            "best_of 3 is not supported: only best_of 1 (the default), as in vLLM V1");
  EXPECT_NE(refusal({{"best_of", "2"}}).find("best_of"), std::string::npos);
}

// --override-generation-config: every sampling field it names wins, even at Hugging Face's
// default values (top_k 50, temperature 1.0); other keys are ignored; wrong types are named.
TEST(SamplingDefaultsTest, OverridesReplaceFieldsWhateverTheirValue) {
  api::SamplingDefaults d =
      api::sampling_defaults_from_generation_config({{"temperature", 0.6}, {"top_p", 0.95}});
  EXPECT_FALSE(api::apply_generation_overrides(
      {{"temperature", 1.0}, {"top_k", 50}, {"max_new_tokens", 9}, {"do_sample", false}}, &d));
  EXPECT_EQ(api::sampling_defaults_repr(d),
            "{'temperature': 1.0, 'top_k': 50, 'top_p': 0.95, 'max_tokens': 9}");
  for (const json& bad : {json{{"top_p", "x"}}, json{{"top_k", 1.5}}, json{{"top_k", -2}},
                          json{{"max_new_tokens", 0}}, json::array()}) {
    api::SamplingDefaults untouched;
    const auto e = api::apply_generation_overrides(bad, &untouched);
    ASSERT_TRUE(e.has_value()) << bad.dump();
    EXPECT_NE(e->find("--override-generation-config"), std::string::npos) << *e;
  }
}

// --generation-config auto: generation_config.json's sampling fields that differ from Hugging
// Face's defaults fill what a request leaves out (null included); the request's own win.
TEST(SamplingDefaultsTest, GenerationConfigFillsWhatTheRequestLeavesOut) {
  const json v31 = {{"bos_token_id", 0},  {"eos_token_id", 1}, {"do_sample", true},
                    {"temperature", 0.6}, {"top_p", 0.95},     {"top_k", 50}};
  const api::SamplingDefaults d = api::sampling_defaults_from_generation_config(v31);
  EXPECT_EQ(api::sampling_defaults_repr(d), "{'temperature': 0.6, 'top_p': 0.95}")
      << "top_k 50 is Hugging Face's default and is left out";
  EXPECT_TRUE(api::sampling_defaults_from_generation_config(json::object()).empty());
  const auto all = api::sampling_defaults_from_generation_config({{"repetition_penalty", 1.1},
                                                                  {"top_k", 20},
                                                                  {"min_p", 0.05},
                                                                  {"max_new_tokens", 64},
                                                                  {"temperature", "hot"}});
  EXPECT_EQ(api::sampling_defaults_repr(all),
            "{'repetition_penalty': 1.1, 'top_k': 20, 'min_p': 0.05, 'max_tokens': 64}");

  auto parse = [&](const json& body, api::Endpoint e, const api::SamplingDefaults& defaults) {
    api::CommonRequestFields f;
    EXPECT_FALSE(api::parse_common_fields(body, e, 20, 1000, &f, defaults)) << body.dump();
    return f;
  };
  api::CommonRequestFields f = parse(json::object(), api::Endpoint::kChat, d);
  EXPECT_EQ(f.sampling.temperature, 0.6);
  EXPECT_EQ(f.sampling.top_p, 0.95);
  f = parse({{"temperature", nullptr}, {"top_p", 0.5}}, api::Endpoint::kCompletions, d);
  EXPECT_EQ(f.sampling.temperature, 0.6) << "null means 'not given'";
  EXPECT_EQ(f.sampling.top_p, 0.5);
  f = parse({{"temperature", 0}}, api::Endpoint::kChat, d);
  EXPECT_EQ(f.sampling.temperature, 0.0);
  f = parse(json::object(), api::Endpoint::kChat, {});
  EXPECT_EQ(f.sampling.temperature, 1.0) << "--generation-config vllm: vLLM's own defaults";
  EXPECT_EQ(f.sampling.top_p, 1.0);
  f = parse(json::object(), api::Endpoint::kChat, all);
  EXPECT_EQ(f.sampling.top_k, 20);
  EXPECT_EQ(f.sampling.min_p, 0.05);
  EXPECT_EQ(f.sampling.repetition_penalty, 1.1);
  ASSERT_FALSE(api::resolve_max_tokens(10, 512, api::Endpoint::kChat, &f));
  EXPECT_EQ(f.sampling.max_tokens, 64) << "max_new_tokens caps the context fill";
  f = parse({{"max_completion_tokens", 100}}, api::Endpoint::kChat, all);
  ASSERT_FALSE(api::resolve_max_tokens(10, 512, api::Endpoint::kChat, &f));
  EXPECT_EQ(f.sampling.max_tokens, 64) << "and a request's larger max_tokens";
}

TEST(SamplingFieldsRequestTest, TruncationKeepsTheLastIdsAndTheBos) {
  std::vector<int32_t> ids = {0, 10, 11, 12, 13};
  api::truncate_prompt(3, /*had_bos=*/true, &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 12, 13}));
  ids = {10, 11, 12, 13};
  api::truncate_prompt(3, /*had_bos=*/false, &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{11, 12, 13}));
  ids = {10, 11};
  api::truncate_prompt(3, false, &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{10, 11})) << "shorter prompts are left alone";
}

TEST(ResponseTest, EchoedAndPromptLogprobLayouts) {
  const api::TokenText text = [](int32_t id) { return id == 5 ? std::string("é!") : "t"; };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<sched::SampledToken> lps = {
      {5, nan, {}}, {6, -2.0f, {{9, -0.5f}}}, {7, -std::numeric_limits<float>::infinity(), {}}};
  const json c = api::completion_logprobs_json(lps, text, 10);
  EXPECT_EQ(c["text_offset"], json::parse("[10, 12, 13]")) << "offsets count characters";
  EXPECT_TRUE(c["token_logprobs"][0].is_null());
  EXPECT_TRUE(c["top_logprobs"][0].is_null());
  EXPECT_EQ(c["token_logprobs"][2], -9999.0) << "-inf is clamped as vLLM does";
  const json p = api::prompt_logprobs_json({{6, -2.0f, {{9, -0.5f}, {6, -2.0f}}, 2}, {7, nan, {}}},
                                           [](int32_t id) { return "t" + std::to_string(id); });
  ASSERT_EQ(p.size(), 3u);
  EXPECT_TRUE(p[0].is_null());
  EXPECT_EQ(p[1]["6"], json::parse(R"({"logprob": -2.0, "rank": 2, "decoded_token": "t6"})"));
  EXPECT_EQ(p[1]["9"]["rank"], 1);
  EXPECT_EQ(p[1].size(), 2u) << "the token appears once";
  EXPECT_TRUE(p[2].is_null()) << "a position not computed";
  EXPECT_EQ(api::utf8_length("héé"), 3u);
}

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
