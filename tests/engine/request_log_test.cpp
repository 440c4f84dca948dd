// The request log lines of --enable-log-requests / --enable-log-outputs: text and id lists cut
// to --max-log-len (never inside a UTF-8 character), the parameters vLLM's line shows, and JSON
// quoting that keeps a prompt's quotes and newlines on one log line.
#include "engine/request_log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

TEST(RequestLogTest, ReceivedLineCutsThePromptAndItsIds) {
  sched::SamplingParams p;
  p.temperature = 0.5;
  p.max_tokens = 7;
  p.stop = {"\n\n"};
  const std::vector<int32_t> ids = {5, 6, 7, 8};
  EXPECT_EQ(engine::received_request_line("r1", "say \"hi\"\nnow", ids, p, -1),
            "Received request r1: prompt: \"say \\\"hi\\\"\\nnow\", params: "
            "SamplingParams(temperature=0.5, top_p=1, top_k=0, min_p=0, seed=None, max_tokens=7, "
            "min_tokens=0, ignore_eos=False, stop=[\"\\n\\n\"]), prompt_token_ids: [5, 6, 7, 8] "
            "(4 tokens)");
  // "é" is two bytes: a cut after 2 bytes keeps "a" only, never half of it.
  const std::string cut = engine::received_request_line("r2", "aé-tail", ids, p, 2);
  EXPECT_NE(cut.find("prompt: \"a\","), std::string::npos) << cut;
  EXPECT_NE(cut.find("prompt_token_ids: [5, 6, ...] (4 tokens)"), std::string::npos) << cut;
  const std::string none = engine::received_request_line("r3", "abc", ids, p, 0);
  EXPECT_NE(none.find("prompt: \"\","), std::string::npos) << none;
  EXPECT_NE(none.find("prompt_token_ids: [...] (4 tokens)"), std::string::npos) << none;
}

TEST(RequestLogTest, GeneratedLineNamesTheOutputAndHowItEnded) {
  const std::vector<int32_t> ids = {1, 2, 3};
  EXPECT_EQ(engine::generated_response_line("r1", "ok\tdone", ids, "stop", 10),
            "Generated response r1: output: \"ok\\tdone\", output_token_ids: [1, 2, 3], "
            "finish_reason: stop");
  EXPECT_EQ(engine::generated_response_line("r2", "abcdef", ids, nullptr, 2),
            "Generated response r2: output: \"ab\", output_token_ids: [1, 2, ...], "
            "finish_reason: None");
  // Bytes that are not UTF-8 (a cut token) are replaced, not thrown on.
  const std::string bad = engine::generated_response_line("r3", "x\xff", ids, "length", -1);
  EXPECT_NE(bad.find("output: \"x\xEF\xBF\xBD\""), std::string::npos) << bad;
}

}  // namespace
