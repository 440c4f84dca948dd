// Benchmark datasets from files a user writes: a synthetic config or a ShareGPT list with a
// field of the wrong type is refused with an error naming it, never with an exception (a
// number for StringConfig.Input used to end `chunkpipe bench serve` with nlohmann's type_error).
#include "bench/dataset.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace {

// One token per character: enough for the datasets' length arithmetic.
class CharTokenizer : public bench::TokenizerAccess {
 public:
  common::Result<std::vector<int32_t>> encode(const std::string& text) override {
    return std::vector<int32_t>(text.begin(), text.end());
  }
  common::Result<std::string> decode(const std::vector<int32_t>& ids) override {
    std::string s;
    for (int32_t id : ids) s.push_back(static_cast<char>('a' + id % 26));
    return s;
  }
  int32_t vocab_size() const override { return 26; }
};

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

const char* kOutput = R"("Output": {"Method": "fixed", "Params": {"Value": 4}})";

TEST(SyntheticDatasetTest, BuildsTheConfiguredLengths) {
  CharTokenizer tok;
  const std::string path = write_file(
      "synthetic_ok.json",
      std::string(R"({"RequestCount": 3, "StringConfig": {"Input": )") +
          R"({"Method": "uniform", "Params": {"MinValue": 5, "MaxValue": 9}}, )" + kOutput + "}}");
  auto requests = bench::synthetic_dataset(path, 1, tok);
  ASSERT_TRUE(requests.ok()) << requests.status().message();
  ASSERT_EQ(requests->size(), 3u);
  for (const bench::SampleRequest& r : *requests) {
    EXPECT_GE(r.prompt_len, 5);
    EXPECT_LE(r.prompt_len, 9);
    EXPECT_EQ(r.expected_output_len, 4);
    EXPECT_EQ(static_cast<int64_t>(r.prompt.size()), r.prompt_len);
  }
}

TEST(SyntheticDatasetTest, FieldsOfTheWrongTypeAreNamed) {
  CharTokenizer tok;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("Input": 7)", "StringConfig.Input must be an object"},
      {R"("Input": {"Method": 5, "Params": {"Value": 10}})", "StringConfig.Input.Method must be"},
      {R"("Input": {"Method": "fixed", "Params": [10]})", "StringConfig.Input.Params must be"},
      {R"("Input": {"Method": "fixed", "Params": {"Value": "ten"}})",
       "StringConfig.Input.Params.Value must be a number"},
      {R"("Input": {"Method": "fixed", "Params": {"Value": 1e30}})",
       "StringConfig.Input.Params.Value must be in [1, 1e9]"},
      {R"("Input": {"Method": "fixed", "Params": {"Value": -3}})",
       "StringConfig.Input.Params.Value must be in [1, 1e9]"},
      {R"("Input": {"Method": "uniform", "Params": {"MinValue": 5, "MaxValue": 1e300}})",
       "need 1 <= MinValue <= MaxValue <= 1e9"},
      {R"("Input": {"Method": "zipf", "Params": {"MinValue": 5, "MaxValue": 9}})",
       "Method 'zipf' is not one of uniform, gaussian, fixed"},
  };
  for (const auto& [input, says] : cases) {
    const std::string path =
        write_file("synthetic_bad.json",
                   R"({"RequestCount": 2, "StringConfig": {)" + input + ", " + kOutput + "}}");
    auto requests = bench::synthetic_dataset(path, 1, tok);
    ASSERT_FALSE(requests.ok()) << input;
    EXPECT_NE(requests.status().message().find(says), std::string::npos)
        << input << ": " << requests.status().message();
  }
}

TEST(ShareGptDatasetTest, EntriesOfTheWrongShapeAreSkipped) {
  CharTokenizer tok;
  const std::string path = write_file("sharegpt.json", R"([
    {"conversations": 3},
    {"conversations": [{"value": 1}, {"value": "reply"}]},
    {"conversations": [{"value": "a usable prompt"}, {"value": "and its reply"}]}])");
  auto requests = bench::sharegpt_dataset(path, 10, 0, 1, tok);
  ASSERT_TRUE(requests.ok()) << requests.status().message();
  ASSERT_EQ(requests->size(), 1u);
  EXPECT_EQ((*requests)[0].prompt, "a usable prompt");
  EXPECT_FALSE(bench::sharegpt_dataset(write_file("sharegpt_bad.json", "{}"), 10, 0, 1, tok).ok());
}

}  // namespace
