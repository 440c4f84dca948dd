// Scheduler: token budget, chunked prefill, decode, sequence limit and preemption, step by step.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <numeric>

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
    got.emplace_back(r.request->request_id, r.num_scheduled_tokens);
    sampled.push_back(r.samples ? next_token : -1);
  }
  s.update(out, sampled);
  return got;
}

using Sched = std::vector<std::pair<std::string, int64_t>>;

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

TEST(SchedulerTest, MaxNumSeqsLimitsRunning) {
  kv::KvCacheManager kv(64, 4, false);
  sched::Scheduler s({100, 2, 64}, &kv);
  for (const char* id : {"a", "b", "c"}) s.add_request(make_request(id, 2));
  EXPECT_EQ(run_step(s), (Sched{{"a", 2}, {"b", 2}}));
  EXPECT_EQ(s.stats().num_waiting, 1);
  s.finish_request("a", sched::FinishReason::kStop);
  EXPECT_EQ(run_step(s), (Sched{{"b", 1}, {"c", 2}}));
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

}  // namespace
