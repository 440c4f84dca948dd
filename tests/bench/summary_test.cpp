// Benchmark arithmetic: numpy-style percentiles, vLLM's TPOT / ITL / goodput definitions, the
// summary layout, and SSE chunk parsing.
#include "bench/summary.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "bench/serve_run.h"
#include "httpclient/sse_client.h"

namespace {

bench::RequestResult result(double start, double ttft, double latency, int64_t out,
                            std::vector<double> chunks) {
  bench::RequestResult r;
  r.success = true;
  r.start_time = start;
  r.ttft = ttft;
  r.latency = latency;
  r.output_tokens = out;
  r.prompt_len = 10;
  r.chunk_times = chunks;
  for (size_t i = 1; i < chunks.size(); ++i) r.itl.push_back(chunks[i] - chunks[i - 1]);
  return r;
}

TEST(SummaryTest, PercentilesInterpolateLikeNumpy) {
  EXPECT_DOUBLE_EQ(bench::percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(bench::percentile({1, 2, 3, 4}, 99), 3.97);
  EXPECT_DOUBLE_EQ(bench::percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(bench::percentile({}, 50), 0);
}

TEST(SummaryTest, VllmDefinitions) {
  std::vector<bench::RequestResult> rs = {result(0.0, 0.1, 0.5, 5, {0.1, 0.2, 0.3, 0.4, 0.5}),
                                          result(0.2, 0.3, 0.3, 1, {0.3})};
  bench::RequestResult failed;
  failed.error = "HTTP 400: bad";
  rs.push_back(failed);
  bench::SummaryConfig c;
  c.num_prompts = 3;
  c.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  c.metric_percentiles = {50, 99};
  c.goodput_ms = {{"ttft", 200}};
  auto s = bench::summarize(rs, 2.0, c);
  EXPECT_EQ(s.result["completed"], 2);
  EXPECT_EQ(s.result["failed"], 1);
  EXPECT_EQ(s.result["total_output_tokens"], 6);
  EXPECT_DOUBLE_EQ(s.result["output_throughput"].get<double>(), 3.0);
  EXPECT_NEAR(s.result["mean_tpot_ms"].get<double>(), 100.0,
              1e-9);  // (0.5 - 0.1) / 4, only output > 1
  EXPECT_NEAR(s.result["mean_ttft_ms"].get<double>(), 200.0, 1e-9);
  EXPECT_NEAR(s.result["mean_itl_ms"].get<double>(), 100.0, 1e-9);
  EXPECT_NEAR(s.result["request_goodput"].get<double>(), 0.5,
              1e-12);  // only the first meets TTFT <= 200 ms
  EXPECT_EQ(s.result["max_concurrent_requests"], 2);
  EXPECT_EQ(s.result["output_lens"], nlohmann::json({5, 1, 0}));
  EXPECT_EQ(s.result["errors"][2], "HTTP 400: bad");
  for (const char* line : {"============ Serving Benchmark Result ============",
                           "Successful requests:                     2",
                           "Failed requests:                         1",
                           "Benchmark duration (s):                  2.00",
                           "Total input tokens:",
                           "Total generated tokens:",
                           "Request throughput (req/s):",
                           "Request goodput (req/s):",
                           "Output token throughput (tok/s):",
                           "Peak output token throughput (tok/s):",
                           "Peak concurrent requests:",
                           "Total token throughput (tok/s):",
                           "---------------Time to First Token----------------",
                           "-----Time per Output Token (excl. 1st token)------",
                           "---------------Inter-token Latency----------------",
                           "----------------End-to-end Latency----------------",
                           "Mean TTFT (ms):",
                           "Median TTFT (ms):",
                           "P99 TTFT (ms):",
                           "P50 E2EL (ms):",
                           "=================================================="}) {
    EXPECT_NE(s.text.find(line), std::string::npos) << line << "\n" << s.text;
  }
}

TEST(SseParseTest, ChoicesUsageErrorsAndDone) {
  bench::RequestResult r;
  bool done = false;
  httpclient::apply_sse_event(R"({"choices":[{"index":0,"text":"Hel"}],"usage":null})", 0.05, &r,
                              &done);
  httpclient::apply_sse_event(R"({"choices":[{"index":0,"delta":{"content":"lo"}}]})", 0.07, &r,
                              &done);
  httpclient::apply_sse_event(R"({"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}})",
                              0.08, &r, &done);
  httpclient::apply_sse_event("[DONE]", 0.09, &r, &done);
  EXPECT_TRUE(done);
  EXPECT_DOUBLE_EQ(r.ttft, 0.05);
  EXPECT_EQ(r.generated_text, "Hello");
  ASSERT_EQ(r.itl.size(), 1u);
  EXPECT_NEAR(r.itl[0], 0.02, 1e-12);
  EXPECT_EQ(r.output_tokens, 2);
  EXPECT_EQ(r.prompt_len, 4);
  httpclient::apply_sse_event(R"({"error":{"message":"boom","code":500}})", 0.1, &r, &done);
  EXPECT_EQ(r.error, "boom");
  // A server's odd shapes are read by type, never thrown on.
  httpclient::apply_sse_event(R"({"error":{"message":5}})", 0.1, &r, &done);
  EXPECT_EQ(r.error, R"({"message":5})");
  httpclient::apply_sse_event(R"({"choices":[7],"usage":{"completion_tokens":"2"}})", 0.2, &r,
                              &done);
  EXPECT_EQ(r.output_tokens, 2);
}

}  // namespace

#include "bench/report.h"

namespace {

TEST(ReportTest, SelfContainedWithFourPlots) {
  std::vector<bench::RequestResult> rs;
  for (int i = 0; i < 6; ++i) rs.push_back(result(0.1 * i, 0.05, 0.4, 4, {0.05, 0.15, 0.25, 0.4}));
  bench::RequestResult failed;
  failed.error = "HTTP 400";
  rs.push_back(failed);
  auto s = bench::summarize(rs, 1.0, {});
  const std::string html = bench::render_html_report(rs, s, "run <1>");
  size_t svgs = 0;
  for (size_t pos = 0; (pos = html.find("<svg", pos)) != std::string::npos; ++pos) ++svgs;
  EXPECT_EQ(svgs, 4u);
  EXPECT_NE(html.find("run &lt;1&gt;"), std::string::npos);
  EXPECT_NE(html.find("class=\"decode\""), std::string::npos);
  EXPECT_NE(html.find("class=\"fail\""), std::string::npos);
  EXPECT_NE(html.find("<polyline"), std::string::npos);
  // No script and no resource from the network (the SVG namespace URI is not a fetch).
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
}

}  // namespace

namespace {

// The bodies `bench serve` sends, and its arrival times.
TEST(ServeRunTest, BodiesAndArrivals) {
  bench::SampleRequest s{"hello", 1, 8};
  bench::ServeRunOptions o;
  o.model = "m";
  o.temperature = 0.5;
  o.extra_body = {{"seed", 3}};
  const auto body = nlohmann::json::parse(bench::request_body(s, o));
  EXPECT_EQ(body["prompt"], "hello");
  EXPECT_EQ(body["max_tokens"], 8);
  EXPECT_EQ(body["temperature"], 0.5);
  EXPECT_EQ(body["seed"], 3);
  EXPECT_TRUE(body["stream"].get<bool>());
  o.chat = true;
  const auto chat = nlohmann::json::parse(bench::request_body(s, o));
  EXPECT_EQ(chat["max_completion_tokens"], 8);
  EXPECT_EQ(chat["messages"][0]["content"][0]["text"], "hello");
  EXPECT_EQ(bench::arrival_times(3, -1, 1.0, 0), (std::vector<double>{0, 0, 0}));
  const auto at = bench::arrival_times(2000, 100.0, 1.0, 7);
  EXPECT_EQ(at[0], 0.0);
  EXPECT_TRUE(std::is_sorted(at.begin(), at.end()));
  EXPECT_NEAR(at.back() / 2000, 0.01, 0.001);  // mean gap 1 / rate
}

}  // namespace
