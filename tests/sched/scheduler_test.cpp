// Scheduler: token budget, chunked prefill, decode, sequence limit and preemption, step by step.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>
#include <tuple>

namespace {

std::unique_ptr<sched::Request> make_request(const std::string& id, int prompt_len) {
  auto r = std::make_unique<sched::Request>();
  r->request_id = id;
  r->prompt_token_ids.resize(prompt_len);
  std::iota(r->prompt_token_ids.begin(), r->prompt_token_ids.end(), 1);
  return r;
}

std::vector<std::pair<std::string, int64_t>> run_step(sched::Scheduler& s, int32_t next_token = 7) {
  auto out = s.schedule();
  std::vector<std::pair<std::string, int64_t>> got;
  std::vector<int32_t> sampled;
  for (const auto& r : out.scheduled) {
    got.emplace_back(r.req_id, r.num_scheduled_tokens);
    sampled.push_back(r.samples ? next_token : -1);
  }
  s.update(out, sampled);
  return got;
}

using Sched = std::vector<std::pair<std::string, int64_t>>;

// A scheduled request as (id, num_computed_tokens, num_scheduled_tokens).
using Entry = std::tuple<std::string, int64_t, int64_t>;
Entry entry(const sched::ScheduledRequest& s) {
  return {s.req_id, s.num_computed_tokens, s.num_scheduled_tokens};
}

TEST(SchedulerTest, ChunkedPrefillThenDecodeWithinBudget) {
  kv::KvCacheManager kv(64, 4, false);
  sched::Scheduler s({/*max_num_batched_tokens=*/8, /*max_num_seqs=*/4, /*max_model_len=*/64}, &kv);
  s.add_request(make_request("a", 10));
  s.add_request(make_request("b", 3));
  EXPECT_EQ(run_step(s), (Sched{{"a", 8}}));
  EXPECT_EQ(run_step(s), (Sched{{"a", 2}, {"b", 3}}));  // a finishes its prompt, b fits entirely
  EXPECT_EQ(run_step(s), (Sched{{"a", 1}, {"b", 1}}));  // both decode
  EXPECT_EQ(s.stats().num_running, 2);
}

// --long-prefill-token-threshold caps each request's tokens in a step, so a long prompt leaves
// budget for the requests behind it.
TEST(SchedulerTest, LongPrefillTokenThresholdCapsEachRequest) {
  kv::KvCacheManager kv(64, 4, false);
  sched::SchedulerConfig config{/*max_num_batched_tokens=*/100, /*max_num_seqs=*/4,
                                /*max_model_len=*/64};
  config.long_prefill_token_threshold = 4;
  sched::Scheduler s(config, &kv);
  s.add_request(make_request("long", 10));
  s.add_request(make_request("short", 3));
  EXPECT_EQ(run_step(s), (Sched{{"long", 4}, {"short", 3}}));
  EXPECT_EQ(run_step(s), (Sched{{"long", 4}, {"short", 1}}));
  EXPECT_EQ(run_step(s), (Sched{{"long", 2}, {"short", 1}}));
  EXPECT_EQ(run_step(s), (Sched{{"long", 1}, {"short", 1}}));
}

TEST(SchedulerTest, MaxNumSeqsLimitsRunning) {
  kv::KvCacheManager kv(64, 4, false);
  sched::Scheduler s({100, 2, 64}, &kv);
  for (const char* id : {"a", "b", "c"}) s.add_request(make_request(id, 2));
  EXPECT_EQ(run_step(s), (Sched{{"a", 2}, {"b", 2}}));
  EXPECT_EQ(s.stats().num_waiting, 1);
  s.finish_request("a", sched::FinishReason::kStop);
  EXPECT_EQ(run_step(s), (Sched{{"b", 1}, {"c", 2}}));
}

// Balance scheduling's gate: a step that may not admit waiting requests runs only the running
// ones; the next open step admits them.
TEST(SchedulerTest, AStepWithoutAdmissionRunsOnlyTheRunningRequests) {
  kv::KvCacheManager kv(64, 4, false);
  sched::Scheduler s({100, 4, 64}, &kv);
  s.add_request(make_request("a", 2));
  EXPECT_EQ(run_step(s), (Sched{{"a", 2}}));
  s.add_request(make_request("b", 3));
  const sched::SchedulerOutput held = s.schedule(/*allow_poll=*/true, /*admit_waiting=*/false);
  ASSERT_EQ(held.scheduled.size(), 1u);
  EXPECT_EQ(entry(held.scheduled[0]), (Entry{"a", 2, 1}));
  s.update(held, {7});
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.stats().num_waiting, 1);
  EXPECT_EQ(run_step(s), (Sched{{"a", 1}, {"b", 3}}));
}

TEST(SchedulerTest, PreemptsNewestWhenBlocksRunOut) {
  kv::KvCacheManager kv(4, 4, false);  // 16 tokens of cache
  sched::Scheduler s({100, 4, 64}, &kv);
  s.add_request(make_request("a", 8));
  s.add_request(make_request("b", 8));
  EXPECT_EQ(run_step(s), (Sched{{"a", 8}, {"b", 8}}));  // cache full: 4 blocks
  // a needs a 3rd block to decode: b (newest) is preempted and goes back to waiting.
  EXPECT_EQ(run_step(s), (Sched{{"a", 1}}));
  EXPECT_EQ(s.stats().num_preemptions, 1);
  EXPECT_EQ(s.stats().num_waiting, 1);
  s.finish_request("a", sched::FinishReason::kLength);
  // b is recomputed from scratch: its 8 prompt tokens plus the 1 token it had generated.
  EXPECT_EQ(run_step(s), (Sched{{"b", 9}}));
}

TEST(SchedulerTest, AbortFreesBlocks) {
  kv::KvCacheManager kv(8, 4, false);
  sched::Scheduler s({100, 4, 64}, &kv);
  s.add_request(make_request("a", 8));
  run_step(s);
  EXPECT_EQ(kv.num_free_blocks(), 6);
  auto r = s.abort_request("a");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->finish_reason, sched::FinishReason::kAbort);
  EXPECT_EQ(kv.num_free_blocks(), 8);
  EXPECT_FALSE(s.has_unfinished_requests());
}

// A waiting request whose prefix hits are found but whose other blocks are not free yet gives
// the hits back and finds them again later: it must not start from token 0 over shared blocks.
TEST(SchedulerTest, WaitingForBlocksKeepsThePrefixHitsItFindsLater) {
  kv::KvCacheManager kv(6, 4, /*enable_prefix_caching=*/true);
  sched::Scheduler s({100, 4, 64}, &kv);
  s.add_request(make_request("a", 9));  // caches blocks [1..4] and [5..8]
  EXPECT_EQ(run_step(s), (Sched{{"a", 9}}));
  s.finish_request("a", sched::FinishReason::kStop);
  s.add_request(make_request("filler", 15));  // 4 blocks: 2 of them a's cached ones
  EXPECT_EQ(run_step(s), (Sched{{"filler", 7}}));
  auto b = make_request("b", 17);  // a's 8 tokens, then others: hits 8, needs 3 more blocks
  std::iota(b->prompt_token_ids.begin() + 8, b->prompt_token_ids.end(), 100);
  s.add_request(std::move(b));  // only 2 blocks are free
  EXPECT_EQ(run_step(s), (Sched{{"filler", 1}}));
  EXPECT_EQ(s.stats().num_waiting, 1);
  s.finish_request("filler", sched::FinishReason::kStop);
  auto out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(entry(out.scheduled[0]), Entry("b", 8, 9));
}

// SchedulerOutput carries a request in full once, then only deltas; the workers' view
// (prompt + new tokens, block table) always equals the scheduler's.
TEST(SchedulerOutputTest, NewRequestOnceThenDeltas) {
  kv::KvCacheManager kv(16, 4, false);
  sched::Scheduler s({6, 4, 64}, &kv);
  s.add_request(make_request("a", 10));
  auto first = s.schedule();
  ASSERT_EQ(first.scheduled.size(), 1u);
  const sched::ScheduledRequest& a0 = first.scheduled[0];
  ASSERT_TRUE(a0.new_request.has_value());
  EXPECT_EQ(a0.new_request->prompt_token_ids.size(), 10u);
  EXPECT_EQ(a0.new_block_ids, (std::vector<int32_t>{0, 1}));  // 6 tokens in blocks of 4
  EXPECT_EQ(a0.num_computed_tokens, 0);
  EXPECT_FALSE(a0.samples);
  s.update(first, {-1});
  auto second = s.schedule();  // the prompt's last 4 tokens: one more block, then a sample
  const sched::ScheduledRequest& a1 = second.scheduled[0];
  EXPECT_FALSE(a1.new_request.has_value());
  EXPECT_EQ(a1.new_block_ids, (std::vector<int32_t>{2}));
  EXPECT_TRUE(a1.new_token_ids.empty());
  EXPECT_EQ(a1.num_computed_tokens, 6);
  EXPECT_EQ(a1.num_scheduled_tokens, 4);
  EXPECT_TRUE(a1.samples);
  s.update(second, {42});
  auto third = s.schedule();  // decode: the sampled token travels once, no new block
  const sched::ScheduledRequest& a2 = third.scheduled[0];
  EXPECT_EQ(a2.new_token_ids, (std::vector<int32_t>{42}));
  EXPECT_TRUE(a2.new_block_ids.empty());
  s.update(third, {43});
  auto fourth = s.schedule();
  EXPECT_EQ(fourth.scheduled[0].new_token_ids, (std::vector<int32_t>{43}));
  s.update(fourth, {44});
  s.finish_request("a", sched::FinishReason::kStop);
  s.add_request(make_request("b", 2));
  auto fifth = s.schedule();  // the finished id rides along with the next step
  EXPECT_EQ(fifth.finished_req_ids, (std::vector<std::string>{"a"}));
  ASSERT_EQ(fifth.scheduled.size(), 1u);
  EXPECT_TRUE(fifth.scheduled[0].new_request.has_value());
}

TEST(SchedulerOutputTest, ResumedRequestReplacesItsBlockTable) {
  kv::KvCacheManager kv(4, 4, false);  // 16 tokens of cache
  sched::Scheduler s({100, 4, 64}, &kv);
  s.add_request(make_request("a", 8));
  s.add_request(make_request("b", 8));
  auto first = s.schedule();
  s.update(first, {7, 8});
  auto second = s.schedule();  // a needs a block: b is preempted (the workers keep its tokens)
  EXPECT_EQ(second.num_preempted, 1);
  s.update(second, {9});
  s.finish_request("a", sched::FinishReason::kLength);
  auto third = s.schedule();
  ASSERT_EQ(third.scheduled.size(), 1u);
  const sched::ScheduledRequest& b = third.scheduled[0];
  EXPECT_EQ(b.req_id, "b");
  EXPECT_FALSE(b.new_request.has_value());
  EXPECT_TRUE(b.resumed_from_preemption);
  EXPECT_EQ(b.new_token_ids, (std::vector<int32_t>{8}));  // sampled before the preemption
  EXPECT_EQ(b.new_block_ids.size(), 3u);                  // the whole new table: 9 tokens
  EXPECT_EQ(b.num_computed_tokens, 0);
  EXPECT_EQ(b.num_scheduled_tokens, 9);
  EXPECT_EQ(third.finished_req_ids, (std::vector<std::string>{"a"}));
}

// A result for a request that left while its step was in flight is dropped; the resumed
// request's own result is applied.
TEST(SchedulerOutputTest, ResultForALeftRequestIsDropped) {
  kv::KvCacheManager kv(4, 4, false);
  sched::Scheduler s({100, 4, 64}, &kv);
  s.add_request(make_request("a", 8));
  s.add_request(make_request("b", 8));
  auto first = s.schedule();
  s.update(first, {7, 8});
  auto decode = s.schedule();  // a decodes; b is preempted
  ASSERT_EQ(decode.scheduled.size(), 1u);
  s.abort_request("a");
  auto resumed = s.schedule();  // b resumes
  ASSERT_EQ(resumed.scheduled.size(), 1u);
  EXPECT_EQ(s.update(decode, {5}), (std::vector<bool>{false}));  // a is gone
  const auto before = s.find_request("b")->output_token_ids;
  EXPECT_EQ(s.update(resumed, {6}), (std::vector<bool>{true}));
  EXPECT_EQ(s.find_request("b")->output_token_ids.size(), before.size() + 1);
}

// The bytes of a step stay flat while a long prompt is chunked (the prompt travels once).
TEST(SchedulerOutputTest, StepBytesDoNotGrowWithTheHistory) {
  kv::KvCacheManager kv(2048, 16, false);
  sched::Scheduler s({1024, 4, 32768}, &kv);
  s.add_request(make_request("long", 32768));
  std::vector<size_t> sizes;
  for (int step = 0; step < 32; ++step) {
    auto so = s.schedule();
    ASSERT_EQ(so.scheduled.size(), 1u);
    size_t bytes = so.scheduled[0].req_id.size() + 8 * so.scheduled[0].new_block_ids.size() +
                   4 * so.scheduled[0].new_token_ids.size();
    if (so.scheduled[0].new_request)
      bytes += 4 * so.scheduled[0].new_request->prompt_token_ids.size();
    sizes.push_back(bytes);
    s.update(so, {so.scheduled[0].samples ? 1 : -1});
  }
  EXPECT_GT(sizes[0], 32768u * 4);  // the whole prompt, once
  for (size_t i = 2; i < sizes.size(); ++i) EXPECT_EQ(sizes[i], sizes[1]) << "step " << i;
}

}  // namespace

namespace {

sched::ChunkSizePredictor example_b_predictor() {
  sched::ChunkSizePredictor p(32768, 128, 1.0, 4096, 30);
  std::vector<std::pair<int64_t, double>> samples;
  for (int64_t l : sched::ChunkSizePredictor::profile_chunk_sizes(32768)) {
    samples.emplace_back(l, 2e-7 * double(l) * double(l) + 0.05 * double(l) + 15.0);
  }
  EXPECT_TRUE(p.fit_profile(samples, nullptr));
  return p;
}

std::vector<int64_t> chunks_of(sched::Scheduler& s, const std::string& id, int max_steps = 20) {
  std::vector<int64_t> out;
  for (int step = 0; step < max_steps; ++step) {
    auto so = s.schedule();
    std::vector<int32_t> sampled;
    bool done = false;
    for (const auto& r : so.scheduled) {
      if (r.req_id == id) {
        out.push_back(r.num_scheduled_tokens);
        done = r.samples;
      }
      sampled.push_back(r.samples ? 7 : -1);
    }
    s.update(so, sampled);
    if (done) break;
  }
  return out;
}

TEST(CppSchedulerTest, LongPromptChunksFollowThePredictor) {
  auto predictor = example_b_predictor();
  predictor.set_need_timing(false);
  kv::KvCacheManager kv(2000, 128, false);
  sched::Scheduler s({32768, 8, 200000}, &kv);
  s.set_chunk_predictor(&predictor);
  s.add_request(make_request("long", 131072));
  EXPECT_EQ(chunks_of(s, "long"), (std::vector<int64_t>{32768, 27136, 23680, 21248, 19456, 6784}));
}

// merge_tail (chunkpipe extension): example (b)'s 6784-token tail joins the chunk before it,
// since that chunk already reaches the prompt's end within the 32768-token budget.
TEST(CppSchedulerTest, MergeTailFoldsASmallRemainderIntoThePreviousChunk) {
  auto predictor = example_b_predictor();
  predictor.set_need_timing(false);
  predictor.set_merge_tail(8192);
  kv::KvCacheManager kv(2000, 128, false);
  sched::Scheduler s({32768, 8, 200000}, &kv);
  s.set_chunk_predictor(&predictor);
  s.add_request(make_request("long", 131072));
  EXPECT_EQ(chunks_of(s, "long"), (std::vector<int64_t>{32768, 27136, 23680, 21248, 26240}));
  // A threshold below the tail leaves upstream's chunks.
  predictor.set_merge_tail(6783);
  kv::KvCacheManager kv2(2000, 128, false);
  sched::Scheduler s2({32768, 8, 200000}, &kv2);
  s2.set_chunk_predictor(&predictor);
  s2.add_request(make_request("long2", 131072));
  EXPECT_EQ(chunks_of(s2, "long2"),
            (std::vector<int64_t>{32768, 27136, 23680, 21248, 19456, 6784}));
}

// overhead_aware (chunkpipe extension): example (b)'s prompt gets the chunk time that minimises
// the modelled two-stage TTFT W + K·c + max chunk time, instead of T = f(B) - f(0).
TEST(CppSchedulerTest, OverheadAwareTargetLowersTheModelledTtft) {
  const int64_t N = 131072;
  auto run = [&](bool aware) {
    auto predictor = example_b_predictor();
    predictor.set_need_timing(false);
    if (aware) predictor.set_overhead_aware(2);
    kv::KvCacheManager kv(2000, 128, false);
    sched::Scheduler s({32768, 8, 200000}, &kv);
    s.set_chunk_predictor(&predictor);
    s.add_request(make_request("long", N));
    const auto chunks = chunks_of(s, "long", 100);
    // The same chunks straight from the predictor, with the request's own target.
    std::vector<int64_t> expected;
    for (int64_t L = 0; L < N;) {
      const int64_t n =
          std::min({*predictor.predict(L, predictor.request_target_ms(N)), N - L, int64_t{32768}});
      expected.push_back(n);
      L += n;
    }
    EXPECT_EQ(chunks, expected) << "aware " << aware;
    double sum = 0, slowest = 0;  // with c = 15 ms paid by every forward
    int64_t L = 0;
    for (int64_t n : chunks) {
      const double t = predictor.predict_time(n, L) + 15.0;
      sum += t;
      slowest = std::max(slowest, t);
      L += n;
    }
    return std::make_pair(chunks.size(), sum + slowest);
  };
  auto probe = example_b_predictor();
  EXPECT_DOUBLE_EQ(probe.request_target_ms(N), probe.target_ms());  // off: upstream's T
  probe.set_overhead_aware(2);
  const double work = 2e-7 * double(N) * double(N) + 0.05 * double(N);   // 9990 ms
  EXPECT_NEAR(probe.request_target_ms(N), std::sqrt(work * 15.0), 0.5);  // about 387 ms
  const auto [upstream_chunks, upstream_ttft] = run(false);
  const auto [aware_chunks, aware_ttft] = run(true);
  EXPECT_EQ(upstream_chunks, 6u);
  EXPECT_GT(aware_chunks, upstream_chunks);
  EXPECT_LT(aware_ttft, 0.95 * upstream_ttft);
  // ... and within 1% of the analytic optimum W + 2·sqrt(W·c) + c (block alignment aside).
  EXPECT_LT(aware_ttft, 1.01 * (work + 2 * std::sqrt(work * 15.0) + 15.0));
  std::printf(
      "modelled TTFT, example (b), PP=2: upstream %zu chunks %.0f ms; overhead_aware "
      "%zu chunks %.0f ms\n",
      upstream_chunks, upstream_ttft, aware_chunks, aware_ttft);
}

TEST(CppSchedulerTest, CalibrationKeepsTheFirstChunkFullAndResizesLaterOnes) {
  auto predictor = example_b_predictor();  // need_timing stays on
  kv::KvCacheManager kv(2000, 128, false);
  sched::Scheduler s({32768, 8, 200000}, &kv);
  s.set_chunk_predictor(&predictor);
  s.add_request(make_request("long", 70000));
  const auto chunks = chunks_of(s, "long");
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks[0], 32768);  // zero-history first chunk is not resized while calibrating
  EXPECT_EQ(chunks[1], 27136);  // later chunks are
}

TEST(CppSchedulerTest, TimeBudgetIsSharedByConcurrentPrefills) {
  auto predictor = example_b_predictor();
  predictor.set_need_timing(false);
  kv::KvCacheManager kv(4000, 128, false);
  sched::Scheduler s({32768, 8, 300000}, &kv);
  s.set_chunk_predictor(&predictor);
  s.add_request(make_request("a", 40000));
  auto first = s.schedule();  // a alone: a full B chunk spends the whole budget
  ASSERT_EQ(first.scheduled.size(), 1u);
  EXPECT_EQ(first.scheduled[0].num_scheduled_tokens, 32768);
  s.update(first, {-1});
  s.add_request(make_request("b", 50000));
  auto second = s.schedule();
  ASSERT_EQ(second.scheduled.size(), 2u);
  const int64_t a_chunk = 40000 - 32768;  // a's last 7232 tokens (its predicted chunk is larger)
  EXPECT_EQ(second.scheduled[0].num_scheduled_tokens, a_chunk);
  const double left = predictor.target_ms() - predictor.predict_time(a_chunk, 32768);
  // b gets what the remaining budget buys (floored at min_chunk and block-aligned), below B.
  const int64_t b_chunk = std::min<int64_t>(*predictor.predict(0, left), 32768 - a_chunk);
  EXPECT_EQ(second.scheduled[1].num_scheduled_tokens, b_chunk);
  EXPECT_LT(b_chunk, 32768 - a_chunk);
  EXPECT_LE(second.total_num_scheduled_tokens, 32768);
}

TEST(CppSchedulerTest, DecodesAreNotChargedAndFailedProfilingGivesFixedChunks) {
  sched::ChunkSizePredictor unfitted(32768, 128, 1.0, 4096, 30);  // profiling failed: not ready
  kv::KvCacheManager kv(2000, 128, false);
  sched::Scheduler s({32768, 8, 200000}, &kv);
  s.set_chunk_predictor(&unfitted);
  s.add_request(make_request("x", 70000));
  EXPECT_EQ(chunks_of(s, "x"), (std::vector<int64_t>{32768, 32768, 4464}));
}

}  // namespace

namespace {

// A connector that offers `offered` tokens of every prompt but those in `own` (none), synchronously
// or not, asks the requests in `later` to come back later, and records the scheduler's calls.
class FakeConnector : public sched::KvConnectorScheduler {
 public:
  int64_t offered = 0;
  bool async = false;
  bool delay_free = false;
  std::set<std::string> own;
  std::set<std::string> later;
  std::vector<std::string> calls;

  std::optional<sched::MatchedTokens> get_num_new_matched_tokens(const sched::Request& r,
                                                                 int64_t computed) override {
    calls.push_back("match " + r.request_id + " " + std::to_string(computed));
    if (later.count(r.request_id)) return std::nullopt;
    if (own.count(r.request_id)) return sched::MatchedTokens{};
    return sched::MatchedTokens{offered, async};
  }
  void update_state_after_alloc(const sched::Request& r, const std::vector<kv::BlockId>& blocks,
                                int64_t external) override {
    calls.push_back("alloc " + r.request_id + " " + std::to_string(blocks.size()) + " " +
                    std::to_string(external));
  }
  std::vector<uint8_t> build_connector_meta(const sched::SchedulerOutput& so,
                                            const kv::KvCacheManager&) override {
    return {static_cast<uint8_t>(so.scheduled.size())};
  }
  sched::FinishedHandoff request_finished(const sched::Request& r,
                                          const std::vector<kv::BlockId>&) override {
    calls.push_back("finished " + r.request_id);
    return {delay_free, delay_free ? R"({"do_remote_prefill": true})" : ""};
  }
};

TEST(KvConnectorSchedulerTest, SyncLoadCountsAsComputedAndLeavesTheLastToken) {
  kv::KvCacheManager kv(16, 4, false);
  sched::Scheduler s({100, 4, 64}, &kv);
  FakeConnector c;
  c.offered = 100;  // more than the prompt: clamped so the last token still runs
  s.set_kv_connector(&c);
  s.add_request(make_request("a", 10));
  auto so = s.schedule();
  ASSERT_EQ(so.scheduled.size(), 1u);
  EXPECT_EQ(so.scheduled[0].num_computed_tokens, 9);
  EXPECT_EQ(so.scheduled[0].num_scheduled_tokens, 1);
  EXPECT_EQ(so.kv_connector_metadata, (std::vector<uint8_t>{1}));
  EXPECT_EQ(c.calls, (std::vector<std::string>{"match a 0", "alloc a 3 9"}));
  EXPECT_EQ(s.find_request("a")->num_external_tokens, 9);
}

sched::KvTransferReport received(std::vector<std::string> ids) {
  sched::KvTransferReport r;
  r.finished_recving = std::move(ids);
  return r;
}

// Makes `c` offer the first 8 prompt tokens, loaded asynchronously, and attaches it to `s`.
void attach_async_loader(FakeConnector* c, sched::Scheduler* s) {
  c->offered = 8;
  c->async = true;
  s->set_kv_connector(c);
}

TEST(KvConnectorSchedulerTest, AsyncLoadWaitsForRemoteKvThenRuns) {
  kv::KvCacheManager kv(16, 4, false);
  sched::Scheduler s({100, 4, 64}, &kv);
  FakeConnector c;
  attach_async_loader(&c, &s);
  s.add_request(make_request("a", 10));
  auto poll = s.schedule();  // blocks allocated, nothing runs while the KV arrives
  EXPECT_TRUE(poll.empty());
  EXPECT_TRUE(poll.kv_connector_poll);  // but the workers' connectors are asked how it goes
  s.update(poll, {});
  EXPECT_EQ(s.find_request("a")->status, sched::RequestStatus::kWaitingForRemoteKvs);
  EXPECT_EQ(kv.num_free_blocks(), 13);
  EXPECT_TRUE(s.has_unfinished_requests());
  EXPECT_FALSE(s.schedule(/*allow_poll=*/false).kv_connector_poll);
  s.update_kv_transfers(received({"a"}));
  auto so = s.schedule();
  ASSERT_EQ(so.scheduled.size(), 1u);
  EXPECT_EQ(so.scheduled[0].num_computed_tokens, 8);  // the two loaded blocks
  EXPECT_EQ(so.scheduled[0].num_scheduled_tokens, 2);
  EXPECT_EQ(kv.num_free_blocks(), 13) << "the slots for the whole prompt came with the load";
  EXPECT_EQ(c.calls, (std::vector<std::string>{"match a 0", "alloc a 3 8"}));
}

// Loaded requests never hold the whole cache while none can run: a load takes the slots of
// every prompt token, the last included, so a request whose KV arrived always starts.
TEST(KvConnectorSchedulerTest, LoadedRequestsAlwaysStart) {
  kv::KvCacheManager kv(4, 4, false);  // 16 slots
  sched::Scheduler s({100, 4, 64}, &kv);
  FakeConnector c;
  attach_async_loader(&c, &s);
  s.add_request(make_request("a", 9));  // 8 tokens load, the 9th needs a third block
  s.add_request(make_request("b", 9));
  s.update(s.schedule(), {});
  EXPECT_EQ(s.find_request("a")->status, sched::RequestStatus::kWaitingForRemoteKvs);
  EXPECT_EQ(s.find_request("b")->status, sched::RequestStatus::kWaiting) << "no room yet";
  s.update_kv_transfers(received({"a"}));
  auto so = s.schedule();
  ASSERT_EQ(so.scheduled.size(), 1u);
  EXPECT_EQ(so.scheduled[0].req_id, "a");
  EXPECT_EQ(so.scheduled[0].num_computed_tokens, 8);
  EXPECT_EQ(so.scheduled[0].num_scheduled_tokens, 1);
}

TEST(KvConnectorSchedulerTest, DelayedFreeHoldsBlocksUntilSent) {
  kv::KvCacheManager kv(16, 4, false);
  sched::Scheduler s({100, 4, 64}, &kv);
  FakeConnector c;
  c.delay_free = true;
  s.set_kv_connector(&c);
  s.add_request(make_request("a", 8));
  auto so = s.schedule();
  s.update(so, {5});
  auto r = s.finish_request("a", sched::FinishReason::kLength);
  EXPECT_EQ(r->kv_handoff_params, R"({"do_remote_prefill": true})");
  EXPECT_EQ(kv.num_free_blocks(), 14);  // the connector still owns them
  EXPECT_TRUE(s.has_requests());        // so the engine keeps polling the connectors
  EXPECT_FALSE(s.has_unfinished_requests());
  sched::KvTransferReport sent;
  sent.finished_sending = {"a"};
  s.update_kv_transfers(sent);
  EXPECT_EQ(kv.num_free_blocks(), 16);
  EXPECT_FALSE(s.has_requests());
}

// Request "a" (10 tokens, blocks of 4) whose first 8 tokens a connector loads asynchronously;
// the first step has allocated its blocks and started the load.
struct LoadingRequest {
  explicit LoadingRequest(bool recompute_failures = false)
      : kv(16, 4, false), s(config(recompute_failures), &kv) {
    attach_async_loader(&c, &s);
    s.add_request(make_request("a", 10));
    s.update(s.schedule(), {});
  }
  static sched::SchedulerConfig config(bool recompute_failures) {
    sched::SchedulerConfig c{100, 4, 64};
    c.recompute_kv_load_failures = recompute_failures;
    return c;
  }
  void fail_load() {
    sched::KvTransferReport failed;
    failed.failed_recving = {{"a", "peer gone"}};
    s.update_kv_transfers(failed);
  }
  kv::KvCacheManager kv;
  sched::Scheduler s;
  FakeConnector c;
};

// A remote load that fails: under "recompute" the request computes its whole prompt here.
TEST(KvConnectorSchedulerTest, FailedLoadRecomputesUnderTheRecomputePolicy) {
  LoadingRequest t(/*recompute_failures=*/true);
  t.fail_load();
  EXPECT_TRUE(t.s.take_load_failures().empty());
  auto so = t.s.schedule();
  ASSERT_EQ(so.scheduled.size(), 1u);
  EXPECT_EQ(so.scheduled[0].num_computed_tokens, 0);  // nothing of the load counts
  EXPECT_EQ(so.scheduled[0].num_scheduled_tokens, 10);
}

// Under "fail" (vLLM's default) the request leaves with the reason, and its blocks are freed.
TEST(KvConnectorSchedulerTest, FailedLoadFailsTheRequestUnderTheFailPolicy) {
  LoadingRequest t;
  t.fail_load();
  auto gone = t.s.take_load_failures();
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].first->request_id, "a");
  EXPECT_EQ(gone[0].second, "peer gone");
  EXPECT_EQ(t.kv.num_free_blocks(), 16);
  EXPECT_FALSE(t.s.has_requests());
}

// A request the connector asks to come back later lets the ones behind it start (vLLM skips
// it), holds no blocks meanwhile, and is first in line again the next step.
TEST(KvConnectorSchedulerTest, RequestAskedToComeBackLaterDoesNotBlockTheQueue) {
  kv::KvCacheManager kv(16, 4, /*enable_prefix_caching=*/true);
  sched::Scheduler s({100, 4, 64}, &kv);
  FakeConnector c;
  s.set_kv_connector(&c);
  s.add_request(make_request("a", 9));
  EXPECT_EQ(run_step(s), (Sched{{"a", 9}}));  // caches two blocks
  c.later = {"b"};
  s.add_request(make_request("b", 9));  // would hit a's two blocks
  s.add_request(make_request("c", 3));
  EXPECT_EQ(run_step(s), (Sched{{"a", 1}, {"c", 3}}));
  EXPECT_EQ(kv.num_free_blocks(), 16 - 3 - 1) << "b gave back the prefix it found";
  c.later.clear();
  auto so = s.schedule();
  ASSERT_EQ(so.scheduled.size(), 3u);
  EXPECT_EQ(entry(so.scheduled[2]), Entry("b", 8, 1));
}

// Blocks a connector loaded are prefix-cache hits once the load is in: a second request with the
// same prompt (another choice of the same request) reads them instead of computing them.
TEST(KvConnectorSchedulerTest, LoadedBlocksBecomePrefixHits) {
  kv::KvCacheManager kv(16, 4, /*enable_prefix_caching=*/true);
  sched::Scheduler s({100, 4, 64}, &kv);
  FakeConnector c;
  c.own = {"b"};
  attach_async_loader(&c, &s);
  s.add_request(make_request("a", 10));
  s.update(s.schedule(), {});
  s.update_kv_transfers(received({"a"}));
  s.add_request(make_request("b", 10));
  auto so = s.schedule();
  ASSERT_EQ(so.scheduled.size(), 2u);
  EXPECT_EQ(entry(so.scheduled[1]), Entry("b", 8, 2));
}

// Prompt logprobs need every prompt position computed: nothing is loaded for such a request,
// and the connector hears that it loads nothing (a PD decoder then releases P at once).
TEST(KvConnectorSchedulerTest, PromptLogprobsLoadNothing) {
  kv::KvCacheManager kv(16, 4, false);
  sched::Scheduler s({100, 4, 64}, &kv);
  FakeConnector c;
  attach_async_loader(&c, &s);
  auto r = make_request("a", 10);
  r->sampling.prompt_logprobs = 1;
  s.add_request(std::move(r));
  auto so = s.schedule();
  ASSERT_EQ(so.scheduled.size(), 1u);
  EXPECT_EQ(entry(so.scheduled[0]), Entry("a", 0, 10));
  EXPECT_EQ(c.calls, (std::vector<std::string>{"match a 0", "alloc a 3 0"}));
}

// A request preempted while a loaded one waits queues behind it: the loaded request holds its
// blocks and needs no new one, while the preempted one needs more than the rest of the cache.
TEST(KvConnectorSchedulerTest, APreemptedRequestQueuesBehindLoadedOnes) {
  kv::KvCacheManager kv(4, 4, false);  // 16 slots
  sched::Scheduler s({100, 4, 64}, &kv);
  FakeConnector c;
  c.own = {"x"};
  attach_async_loader(&c, &s);
  s.add_request(make_request("x", 8));  // computed here: 2 blocks
  s.add_request(make_request("a", 5));  // 4 tokens load into 2 blocks: the cache is full
  auto first = s.schedule();
  ASSERT_EQ(first.scheduled.size(), 1u);
  s.update(first, {7});
  s.update_kv_transfers(received({"a"}));
  auto second = s.schedule();  // x needs a third block: there is none, so x is preempted
  EXPECT_EQ(second.num_preempted, 1);
  EXPECT_TRUE(second.empty());
  auto third = s.schedule();  // x needs 3 blocks, 2 are free; a needs none
  ASSERT_EQ(third.scheduled.size(), 1u);
  EXPECT_EQ(entry(third.scheduled[0]), Entry("a", 4, 1));
  s.update(third, {9});
  ASSERT_NE(s.finish_request("a", sched::FinishReason::kStop), nullptr);
  auto fourth = s.schedule();
  ASSERT_EQ(fourth.scheduled.size(), 1u);
  EXPECT_EQ(entry(fourth.scheduled[0]), Entry("x", 0, 9));
}

// An abort while the KV is loading keeps the blocks until the load reports: it may still be
// writing into them.
TEST(KvConnectorSchedulerTest, AbortWhileLoadingFreesOnlyWhenTheLoadReports) {
  LoadingRequest t;
  ASSERT_NE(t.s.abort_request("a"), nullptr);
  EXPECT_EQ(t.kv.num_free_blocks(), 13);
  EXPECT_TRUE(t.s.has_requests());
  t.s.update_kv_transfers(received({"a"}));
  EXPECT_EQ(t.kv.num_free_blocks(), 16);
  EXPECT_FALSE(t.s.has_requests());
}

}  // namespace

namespace {

// vllm-ascend's recompute scheduler: the newest running request leaves with finish_reason stop
// (the engine reports stop_reason "recomputed") and nothing waiting is admitted that step.
TEST(RecomputeSchedulerTest, NewestRunningRequestIsHandedBackInsteadOfPreempted) {
  kv::KvCacheManager kv(4, 4, false);  // 16 tokens of cache
  sched::SchedulerConfig config{100, 4, 64};
  config.recompute_scheduler_enable = true;
  sched::Scheduler s(config, &kv);
  s.add_request(make_request("a", 8));
  s.add_request(make_request("b", 8));
  auto first = s.schedule();
  s.update(first, {7, 8});
  s.add_request(make_request("c", 2));
  auto second = s.schedule();  // a needs a third block: b goes, and c must wait
  EXPECT_EQ(second.num_recomputed, 1);
  EXPECT_EQ(second.num_preempted, 0);
  ASSERT_EQ(second.scheduled.size(), 1u);
  EXPECT_EQ(second.scheduled[0].req_id, "a");
  EXPECT_EQ(second.finished_req_ids, (std::vector<std::string>{"b"}));  // workers drop it now
  auto gone = s.take_recomputed();
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0]->request_id, "b");
  EXPECT_EQ(gone[0]->finish_reason, sched::FinishReason::kStop);
  EXPECT_EQ(gone[0]->output_token_ids, (std::vector<int32_t>{8}));
  EXPECT_EQ(s.find_request("b"), nullptr);
  EXPECT_EQ(s.stats().num_preemptions, 0);
  EXPECT_EQ(s.stats().num_waiting, 1);  // c waits for the next step
  s.update(second, {9});
  auto third = s.schedule();  // c is admitted once no request was handed back
  EXPECT_EQ(third.num_recomputed, 0);
  EXPECT_TRUE(s.take_recomputed().empty());
}

// One of several choices is preempted and recomputed here: the proxy resumes only an answer's
// first choice, so a handed-back second one would reach the client cut short.
TEST(RecomputeSchedulerTest, AChoiceThatCannotBeResumedElsewhereIsPreempted) {
  kv::KvCacheManager kv(4, 4, false);
  sched::SchedulerConfig config{100, 4, 64};
  config.recompute_scheduler_enable = true;
  sched::Scheduler s(config, &kv);
  s.add_request(make_request("a", 8));
  auto b = make_request("b", 8);
  b->recomputable = false;
  s.add_request(std::move(b));
  auto first = s.schedule();
  s.update(first, {7, 8});
  auto second = s.schedule();  // a needs a third block: b is preempted, not handed back
  EXPECT_EQ(second.num_recomputed, 0);
  EXPECT_EQ(second.num_preempted, 1);
  EXPECT_TRUE(s.take_recomputed().empty());
  ASSERT_NE(s.find_request("b"), nullptr);
  EXPECT_EQ(s.find_request("b")->status, sched::RequestStatus::kPreempted);
  EXPECT_EQ(s.stats().num_preemptions, 1);
}

}  // namespace

namespace spec {

std::vector<std::vector<int32_t>> none(size_t n) {
  return std::vector<std::vector<int32_t>>(n);
}

}  // namespace spec

// Speculative decoding: drafts ride after the last token, k lookahead slots are reserved, the
// rejected drafts are rolled back, only verified tokens are cached, and a prefix hit gives back
// its last matched block.
TEST(SchedulerTest, SpeculativeDraftsAreScheduledVerifiedAndRolledBack) {
  kv::KvCacheManager kv(64, 4, /*enable_prefix_caching=*/true);
  sched::SchedulerConfig config{/*max_num_batched_tokens=*/32, /*max_num_seqs=*/4,
                                /*max_model_len=*/64};
  config.num_lookahead_tokens = 3;
  sched::Scheduler s(config, &kv);
  s.add_request(make_request("a", 6));
  auto prefill = s.schedule();
  ASSERT_EQ(prefill.scheduled.size(), 1u);
  EXPECT_TRUE(prefill.scheduled[0].samples);
  EXPECT_TRUE(prefill.scheduled[0].spec_token_ids.empty());  // prefill chunks carry no drafts
  EXPECT_EQ(kv.block_table("a").size(), 3u);                 // 6 tokens + 3 lookahead: 9 slots
  EXPECT_EQ(s.update(prefill, {{100}}, {{101, 102, 103}}), (std::vector<int32_t>{1}));
  const sched::Request* a = s.find_request("a");
  EXPECT_EQ(a->num_computed_tokens, 6);
  EXPECT_EQ(a->spec_token_ids, (std::vector<int32_t>{101, 102, 103}));

  // [100, 101, 102, 103] at positions 6..9; 4 + 3 lookahead slots past position 6.
  auto verify = s.schedule();
  ASSERT_EQ(verify.scheduled.size(), 1u);
  const sched::ScheduledRequest& v = verify.scheduled[0];
  EXPECT_EQ(v.num_computed_tokens, 6);
  EXPECT_EQ(v.num_scheduled_tokens, 4);
  EXPECT_TRUE(v.samples);
  EXPECT_EQ(v.spec_token_ids, (std::vector<int32_t>{101, 102, 103}));
  EXPECT_EQ(v.new_token_ids, (std::vector<int32_t>{100}));
  EXPECT_EQ(kv.block_table("a").size(), 4u);  // ceil((10 + 3) / 4)
  EXPECT_TRUE(a->spec_token_ids.empty());     // consumed by the step
  // 101 accepted, 102 rejected in favour of 55: two tokens, two drafts rolled back.
  EXPECT_EQ(s.update(verify, {{101, 55}}, {{7, 8, 9}}), (std::vector<int32_t>{2}));
  EXPECT_EQ(a->output_token_ids, (std::vector<int32_t>{100, 101, 55}));
  EXPECT_EQ(a->num_computed_tokens, 8);  // positions 0..7 verified; 55 is next to compute
  EXPECT_EQ(a->spec_token_ids, (std::vector<int32_t>{7, 8, 9}));

  // Verified blocks only: tokens 1..6, 100, 101 fill blocks 0 and 1 (8 tokens); a request with
  // the same 9 first tokens hits them, less the last matched block.
  s.finish_request("a", sched::FinishReason::kStop);
  auto b = make_request("b", 9);
  b->prompt_token_ids = {1, 2, 3, 4, 5, 6, 100, 101, 55};
  s.add_request(std::move(b));
  kv.set_recompute_last_matched_block(true);
  auto hit = s.schedule();
  ASSERT_EQ(hit.scheduled.size(), 1u);
  EXPECT_EQ(hit.scheduled[0].num_computed_tokens, 4);  // 8 cached, one block given back
  s.update(hit, {{1}}, spec::none(1));
}

TEST(SchedulerTest, DraftsStopAtMaxModelLenAndTheTokenBudget) {
  kv::KvCacheManager kv(64, 4, false);
  sched::SchedulerConfig config{/*max_num_batched_tokens=*/3, 4, /*max_model_len=*/10};
  config.num_lookahead_tokens = 3;
  sched::Scheduler s(config, &kv);
  s.add_request(make_request("a", 2));
  auto first = s.schedule();
  s.update(first, {{50}}, {{51, 52, 53}});
  auto second = s.schedule();  // the budget of 3 takes the last token and two drafts
  ASSERT_EQ(second.scheduled.size(), 1u);
  EXPECT_EQ(second.scheduled[0].num_scheduled_tokens, 3);
  EXPECT_EQ(second.scheduled[0].spec_token_ids, (std::vector<int32_t>{51, 52}));
  s.update(second, {{51, 52, 60}}, {{61, 62, 63}});
  const sched::Request* a = s.find_request("a");
  EXPECT_EQ(a->num_computed_tokens, 5);  // nothing rejected
  auto third = s.schedule();             // [60, 61, 62]: the budget again cuts the third draft
  ASSERT_EQ(third.scheduled.size(), 1u);
  EXPECT_EQ(third.scheduled[0].spec_token_ids, (std::vector<int32_t>{61, 62}));
  s.update(third, {{61, 62, 70}}, {{1, 2, 3}});
  EXPECT_EQ(a->num_tokens(), 9);
  EXPECT_EQ(a->num_computed_tokens, 8);
  // max_model_len 10: positions 8 and 9 only, so one draft of three.
  auto fourth = s.schedule();
  ASSERT_EQ(fourth.scheduled.size(), 1u);
  EXPECT_EQ(fourth.scheduled[0].num_scheduled_tokens, 2);
  EXPECT_EQ(fourth.scheduled[0].spec_token_ids, (std::vector<int32_t>{1}));
}
