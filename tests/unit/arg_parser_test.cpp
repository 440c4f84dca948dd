// ArgParser: argparse conventions used by every chunkpipe subcommand.
#include "cli/arg_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

common::Status parse(cli::ArgParser& p, std::vector<std::string> args) {
  std::vector<char*> argv;
  static std::string prog = "prog";
  argv.push_back(prog.data());
  for (auto& a : args) argv.push_back(a.data());
  return p.parse(static_cast<int>(argv.size()), argv.data(), 1);
}

cli::ArgParser make() {
  cli::ArgParser p("prog", "test");
  p.add_positional("MODEL", "model dir");
  p.add_option("max-num-seqs", "seqs", "256");
  p.add_option("max-model-len", "len");
  p.add_flag("enable-prefix-caching", "cache");
  return p;
}

TEST(ArgParserTest, ValuesPrefixesAndUnderscores) {
  auto p = make();
  ASSERT_TRUE(parse(p, {"m", "--max_model_len=4096", "--max-num-s", "8", "--enable-prefix"}).ok());
  EXPECT_EQ(p.positional("MODEL"), "m");
  EXPECT_EQ(p.option("max-model-len"), "4096");
  EXPECT_EQ(p.option("max-num-seqs"), "8");
  EXPECT_TRUE(p.flag("enable-prefix-caching"));
}

TEST(ArgParserTest, DefaultsAndNegation) {
  auto p = make();
  ASSERT_TRUE(parse(p, {"m", "--no-enable-prefix-caching"}).ok());
  EXPECT_EQ(p.option("max-num-seqs"), "256");
  EXPECT_FALSE(p.flag("enable-prefix-caching"));
  EXPECT_FALSE(p.option("max-model-len").has_value());
}

TEST(ArgParserTest, ErrorsNameTheFlag) {
  auto p = make();
  EXPECT_EQ(parse(p, {"m", "--bogus", "1"}).message(), "unrecognized argument: --bogus");
  auto q = make();
  EXPECT_NE(parse(q, {"m", "--max", "1"}).message().find("ambiguous option: --max"),
            std::string::npos);
  auto r = make();
  EXPECT_EQ(parse(r, {"m", "--max-model-len"}).message(),
            "argument --max-model-len: expected one argument");
  auto s = make();
  EXPECT_EQ(parse(s, {}).message(), "the following arguments are required: MODEL");
  // As argparse: a following option is not a value, a negative number or "-" is.
  auto t = make();
  EXPECT_EQ(parse(t, {"m", "--max-model-len", "--max-num-seqs", "3"}).message(),
            "argument --max-model-len: expected one argument");
  auto u = make();
  ASSERT_TRUE(parse(u, {"m", "--max-model-len", "-5"}).ok());
  EXPECT_EQ(u.option("max-model-len"), "-5");
  auto v = make();
  ASSERT_TRUE(parse(v, {"m", "--max-model-len", "-"}).ok());
  EXPECT_EQ(v.option("max-model-len"), "-");
}

TEST(ArgParserTest, ListsEndAtTheNextOption) {
  auto p = make();
  p.add_multi_option("served-model-name", "names");
  ASSERT_TRUE(parse(p, {"m", "--served-model-name", "a", "-1", "--max-num-seqs", "3"}).ok());
  EXPECT_EQ(p.option("served-model-name"), "a\n-1");
  EXPECT_EQ(p.option("max-num-seqs"), "3");
  auto q = make();
  q.add_multi_option("served-model-name", "names");
  EXPECT_EQ(parse(q, {"m", "--served-model-name", "--max-num-seqs", "3"}).message(),
            "argument --served-model-name: expected at least one argument");
}

}  // namespace
