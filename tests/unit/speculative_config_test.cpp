// --speculative-config parsing and the model checks, with vLLM's rules and messages that name
// the field.
#include "cli/speculative_config.h"

#include <gtest/gtest.h>

namespace {

model::ModelConfig deepseek(int mtp_layers) {
  model::ModelConfig c;
  c.model_type = "deepseek_v3";
  c.num_nextn_predict_layers = mtp_layers;
  return c;
}

TEST(SpeculativeConfigTest, SeedFormsParse) {
  auto c = cli::parse_speculative_config(R"({"num_speculative_tokens": 3, "method": "mtp"})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->method, "mtp");
  EXPECT_EQ(c->num_speculative_tokens, 3);
  auto alias = cli::parse_speculative_config(R"({"method": "deepseek_mtp"})");
  ASSERT_TRUE(alias.ok());
  EXPECT_EQ(alias->method, "mtp");
  auto warning = cli::check_speculative_model(&*alias, deepseek(1));
  ASSERT_TRUE(warning.ok());
  EXPECT_EQ(alias->num_speculative_tokens, 1);  // defaults to the model's MTP layers
  EXPECT_TRUE(warning->empty());
  auto reuse = cli::check_speculative_model(&*c, deepseek(1));
  ASSERT_TRUE(reuse.ok());
  EXPECT_NE(reuse->find("more than once"), std::string::npos);
}

TEST(SpeculativeConfigTest, BadConfigsNameTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"not json", "not valid JSON"},
      {"[1]", "JSON object"},
      {R"({"num_speculative_tokens": 1})", "method is required"},
      {R"({"method": "ngram", "num_speculative_tokens": 1})", "'ngram' is not supported"},
      {R"({"method": "mtp", "num_speculative_tokens": 0})", "greater than zero"},
      {R"({"method": "mtp", "num_speculative_tokens": -2})", "greater than zero"},
      {R"({"method": "mtp", "num_speculative_tokens": "3"})", "must be an integer"},
      {R"({"method": "mtp", "num_speculative_tokens": 99})", "above 16"},
      {R"({"method": 3})", "method must be a string"},
      {R"({"method": "mtp", "prompt_lookup_max": 4})", "unknown field 'prompt_lookup_max'"},
  };
  for (const auto& [json, why] : cases) {
    auto c = cli::parse_speculative_config(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_NE(c.status().message().find(why), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("--speculative-config"), std::string::npos);
  }
}

TEST(SpeculativeConfigTest, ModelsMtpCannotDraftForAreRefused) {
  auto c = cli::parse_speculative_config(R"({"method": "mtp", "num_speculative_tokens": 3})");
  ASSERT_TRUE(c.ok());
  auto none = cli::check_speculative_model(&*c, deepseek(0));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("num_nextn_predict_layers is 0"), std::string::npos);
  model::ModelConfig other = deepseek(1);
  other.model_type = "llama";
  auto llama = cli::check_speculative_model(&*c, other);
  ASSERT_FALSE(llama.ok());
  EXPECT_NE(llama.status().message().find("model_type is 'llama'"), std::string::npos);
  auto indivisible = cli::check_speculative_model(&*c, deepseek(2));
  ASSERT_FALSE(indivisible.ok());
  EXPECT_NE(indivisible.status().message().find("divisible"), std::string::npos);
}

}  // namespace
