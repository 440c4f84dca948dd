// EngineRequest, RequestOutput, metrics reports and the data-parallel link's messages survive
// the wire field for field, and truncated or trailing bytes are refused.
#include "engine/engine_wire.h"

#include "engine/dp_protocol.h"

#include <gtest/gtest.h>

#include <cmath>

namespace {

TEST(EngineWireTest, RequestAndOutputRoundTrip) {
  engine::EngineRequest q;
  q.request_id = "cmpl-1-0";
  q.prompt_token_ids = {1, 2, 3};
  q.sampling.temperature = 0.7;
  q.sampling.seed = 42;
  q.sampling.max_tokens = 9;
  q.sampling.stop = {"END", "\n\n"};
  q.sampling.ignore_eos = true;
  q.sampling.skip_special_tokens = false;
  q.sampling.logprobs = 2;
  q.sampling.logprobs_mode = sched::LogprobsMode::kProcessedLogits;
  q.sampling.prompt_logprobs = 0;
  q.sampling.logit_bias = {{5, -100.0f}};
  q.sampling.allowed_token_ids = {4, 9};
  q.sampling.bad_words_token_ids = {{7}, {1, 2, 3}};
  q.sampling_key = "cmpl-abc-0";
  q.cache_salt = "tenant-7";
  q.recomputable = false;
  q.priority = -3;
  const auto bytes = engine::encode_request(q);
  auto back = engine::decode_request(bytes);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->request_id, q.request_id);
  EXPECT_EQ(back->prompt_token_ids, q.prompt_token_ids);
  EXPECT_EQ(back->sampling.seed, std::optional<uint64_t>(42));
  EXPECT_EQ(back->sampling.stop, q.sampling.stop);
  EXPECT_TRUE(back->sampling.ignore_eos);
  EXPECT_FALSE(back->sampling.skip_special_tokens);
  EXPECT_EQ(back->sampling.logprobs, std::optional<int32_t>(2));
  EXPECT_EQ(back->sampling.logprobs_mode, sched::LogprobsMode::kProcessedLogits);
  EXPECT_EQ(back->sampling.prompt_logprobs, std::optional<int32_t>(0));
  EXPECT_EQ(back->sampling.logit_bias, q.sampling.logit_bias);
  EXPECT_EQ(back->sampling.allowed_token_ids, q.sampling.allowed_token_ids);
  EXPECT_EQ(back->sampling.bad_words_token_ids, q.sampling.bad_words_token_ids);
  EXPECT_EQ(back->sampling_key, "cmpl-abc-0");
  EXPECT_EQ(back->cache_salt, "tenant-7");
  EXPECT_FALSE(back->recomputable);
  EXPECT_EQ(back->priority, -3);
  for (size_t cut : {size_t{0}, bytes.size() / 2, bytes.size() - 1}) {
    EXPECT_FALSE(engine::decode_request({bytes.begin(), bytes.begin() + long(cut)}).ok()) << cut;
  }

  engine::RequestOutput o;
  o.request_id = "cmpl-1-0";
  o.new_token_ids = {7};
  o.new_logprobs = {{7, -0.25f, {{7, -0.25f}, {8, -2.0f}}}};
  o.new_text = "hé";
  o.prompt_logprobs = {{2, -3.5f, {{9, -0.5f}}, 4}, {3, std::nanf(""), {}, 0}};
  o.finished = true;
  o.finish_reason = sched::FinishReason::kStop;
  o.stop_reason = std::string("END");
  o.num_prompt_tokens = 3;
  o.num_output_tokens = 1;
  o.kv_transfer_params = R"({"do_remote_prefill": true})";
  o.error = "'prompt' holds token id 9";
  o.error_status = 400;
  const auto obytes = engine::encode_output(o);
  auto oback = engine::decode_output(obytes);
  ASSERT_TRUE(oback.ok()) << oback.status().message();
  EXPECT_EQ(oback->new_logprobs.size(), 1u);
  EXPECT_EQ(oback->new_logprobs[0].top_logprobs.size(), 2u);
  EXPECT_EQ(oback->new_text, "hé");
  ASSERT_EQ(oback->prompt_logprobs.size(), 2u);
  EXPECT_EQ(oback->prompt_logprobs[0].rank, 4);
  EXPECT_EQ(oback->prompt_logprobs[0].top_logprobs, o.prompt_logprobs[0].top_logprobs);
  EXPECT_TRUE(std::isnan(oback->prompt_logprobs[1].logprob));
  EXPECT_EQ(oback->finish_reason, sched::FinishReason::kStop);
  EXPECT_EQ(std::get<std::string>(oback->stop_reason), "END");
  EXPECT_EQ(oback->kv_transfer_params, o.kv_transfer_params);
  EXPECT_EQ(oback->error, o.error);
  EXPECT_EQ(oback->error_status, 400);
  auto bad = obytes;
  bad.push_back(0);
  EXPECT_FALSE(engine::decode_output(bad).ok());
}

TEST(EngineWireTest, MetricsReportRoundTrips) {
  engine::MetricsSnapshot m;
  m.totals.prompt_tokens = 11;
  m.totals.generation_tokens = 22;
  m.totals.dummy_batches = 5;
  m.totals.kv_transfer.bytes_pulled = 4096;
  m.totals.request_success["length"] = 3;
  m.totals.ttft.observe(0.03);
  m.totals.iteration_tokens.observe(64);
  m.totals.request_prefill_time.observe(0.7);
  m.totals.request_prompt_tokens = engine::Histogram(engine::one_two_five_buckets(4096));
  m.totals.request_prompt_tokens.observe(300);  // bounds from the sender's max_model_len
  m.num_running = 2;
  m.recent_prefix_cache_queries = 300;
  m.recent_prefix_cache_hits = 120;
  m.num_waiting = 7;
  m.kv_cache_usage = 0.25;
  m.num_kv_blocks = 100;
  m.block_size = 16;
  m.stage_busy_seconds = {1.5, 2.5};
  m.cpp_ready = true;
  m.cpp_target_ms = 350;
  const auto bytes = engine::encode_metrics(m);
  auto back = engine::decode_metrics(bytes);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->totals.prompt_tokens, 11);
  EXPECT_EQ(back->totals.generation_tokens, 22);
  EXPECT_EQ(back->totals.dummy_batches, 5);
  EXPECT_EQ(back->totals.kv_transfer.bytes_pulled, 4096);
  EXPECT_EQ(back->totals.request_success.at("length"), 3);
  EXPECT_EQ(back->totals.ttft.count, 1u);
  EXPECT_EQ(back->totals.ttft.counts, m.totals.ttft.counts);
  EXPECT_EQ(back->totals.iteration_tokens.counts, m.totals.iteration_tokens.counts);
  EXPECT_EQ(back->totals.request_prefill_time.counts, m.totals.request_prefill_time.counts);
  EXPECT_EQ(back->totals.request_prefill_time.sum, 0.7);
  EXPECT_EQ(back->totals.request_prompt_tokens.bounds, m.totals.request_prompt_tokens.bounds);
  EXPECT_EQ(back->totals.request_prompt_tokens.counts, m.totals.request_prompt_tokens.counts);
  EXPECT_EQ(back->num_running, 2);
  EXPECT_EQ(back->recent_prefix_cache_queries, 300);
  EXPECT_EQ(back->recent_prefix_cache_hits, 120);
  EXPECT_EQ(back->num_waiting, 7);
  EXPECT_EQ(back->kv_cache_usage, 0.25);
  EXPECT_EQ(back->stage_busy_seconds, m.stage_busy_seconds);
  EXPECT_TRUE(back->cpp_ready);
  EXPECT_EQ(back->cpp_target_ms, 350);
  for (size_t cut = 0; cut < bytes.size(); cut += 7)
    EXPECT_FALSE(engine::decode_metrics({bytes.begin(), bytes.begin() + long(cut)}).ok()) << cut;
  auto bad = bytes;
  bad.push_back(1);
  EXPECT_FALSE(engine::decode_metrics(bad).ok());
}

// vLLM's build_1_2_5_buckets, and the sum of two engines' histograms.
TEST(MetricsTest, TokenBucketsAndMerging) {
  EXPECT_EQ(engine::one_two_five_buckets(0), std::vector<double>{});
  EXPECT_EQ(engine::one_two_five_buckets(1), std::vector<double>{1});
  EXPECT_EQ(engine::one_two_five_buckets(163840),
            (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000,
                                 50000, 100000}));
  engine::Histogram a(engine::one_two_five_buckets(100)), b(engine::one_two_five_buckets(100));
  a.observe(3);
  b.observe(3);
  b.observe(1000);
  engine::Histogram sum;  // no bounds yet: takes the first one's
  ASSERT_TRUE(sum.merge(a));
  ASSERT_TRUE(sum.merge(b));
  EXPECT_EQ(sum.bounds, a.bounds);
  EXPECT_EQ(sum.count, 3u);
  EXPECT_EQ(sum.sum, 1006);
  EXPECT_EQ(sum.counts[2], 2u);      // 3 <= 5
  EXPECT_EQ(sum.counts.back(), 1u);  // 1000 > 100: +Inf
  EXPECT_FALSE(sum.merge(engine::Histogram(engine::one_two_five_buckets(10))));
  EXPECT_EQ(sum.count, 3u);
}

TEST(DataParallelProtocolTest, MessagesParseAndBadOnesAreRefused) {
  namespace dp = engine::dp;
  dp::Kind kind;
  std::vector<uint8_t> payload;
  ASSERT_TRUE(dp::parse(dp::message(dp::Kind::kAbort, std::string("req-1")), &kind, &payload));
  EXPECT_EQ(kind, dp::Kind::kAbort);
  EXPECT_EQ(std::string(payload.begin(), payload.end()), "req-1");
  EXPECT_FALSE(dp::parse({}, &kind, &payload)) << "empty";
  EXPECT_FALSE(dp::parse({0}, &kind, &payload)) << "kind 0";
  EXPECT_FALSE(dp::parse({200, 1}, &kind, &payload)) << "unknown kind";
  auto rank = dp::decode_rank(dp::encode_rank(7));
  ASSERT_TRUE(rank.ok());
  EXPECT_EQ(*rank, 7);
  EXPECT_FALSE(dp::decode_rank({1, 2}).ok()) << "truncated";
  EXPECT_FALSE(dp::decode_rank(dp::encode_rank(-1)).ok()) << "negative";
  const dp::Welcome w{4, "10.0.0.1", 29600};
  const auto wb = dp::encode_welcome(w);
  auto wback = dp::decode_welcome(wb);
  ASSERT_TRUE(wback.ok());
  EXPECT_EQ(wback->dp_size, 4);
  EXPECT_EQ(wback->store_host, "10.0.0.1");
  EXPECT_EQ(wback->store_port, 29600);
  for (size_t cut = 0; cut < wb.size(); ++cut)
    EXPECT_FALSE(dp::decode_welcome({wb.begin(), wb.begin() + long(cut)}).ok()) << cut;
}

}  // namespace
