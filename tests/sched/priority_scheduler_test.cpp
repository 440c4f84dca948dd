// Scheduler under --scheduling-policy priority: waiting and running requests are served by
// (priority, arrival), the smaller first, and preemption takes the last of them; the same
// workloads under FCFS show what changes.
#include <gtest/gtest.h>

#include <numeric>

#include "sched/scheduler.h"

namespace {

using Policy = sched::SchedulingPolicy;
using Sched = std::vector<std::pair<std::string, int64_t>>;

std::unique_ptr<sched::Request> make_request(const std::string& id, int prompt_len,
                                             int64_t priority) {
  auto r = std::make_unique<sched::Request>();
  r->request_id = id;
  r->prompt_token_ids.resize(prompt_len);
  std::iota(r->prompt_token_ids.begin(), r->prompt_token_ids.end(), 1);
  r->priority = priority;
  return r;
}

// One step, every sampling entry given token 7; returns (id, tokens) per scheduled entry.
Sched run_step(sched::Scheduler& s) {
  auto out = s.schedule();
  Sched got;
  std::vector<int32_t> sampled;
  for (const auto& r : out.scheduled) {
    got.emplace_back(r.req_id, r.num_scheduled_tokens);
    sampled.push_back(r.samples ? 7 : -1);
  }
  s.update(out, sampled);
  return got;
}

sched::SchedulerConfig config(int64_t budget, int32_t max_num_seqs, Policy policy) {
  sched::SchedulerConfig c{budget, max_num_seqs, /*max_model_len=*/64};
  c.policy = policy;
  return c;
}

// The order in which one-at-a-time requests start (max_num_seqs 1, each finished after its
// first step).
std::vector<std::string> start_order(Policy policy) {
  kv::KvCacheManager kv(64, 4, false);
  sched::Scheduler s(config(100, 1, policy), &kv);
  s.add_request(make_request("low", 3, 5));
  s.add_request(make_request("mid", 3, 0));
  s.add_request(make_request("high", 3, -1));
  s.add_request(make_request("mid-later", 3, 0));
  std::vector<std::string> order;
  for (int step = 0; step < 4; ++step) {
    const Sched got = run_step(s);
    if (got.size() != 1) return order;
    order.push_back(got[0].first);
    s.finish_request(got[0].first, sched::FinishReason::kStop);
  }
  return order;
}

TEST(PrioritySchedulerTest, WaitingRequestsStartBySmallerPriorityThenArrival) {
  EXPECT_EQ(start_order(Policy::kPriority),
            (std::vector<std::string>{"high", "mid", "mid-later", "low"}));
  EXPECT_EQ(start_order(Policy::kFcfs),
            (std::vector<std::string>{"low", "mid", "high", "mid-later"}));
}

// Both prompts fill the cache; the next decode needs a block, so one request is preempted:
// the newest under FCFS, the larger priority under the priority policy (here the older one).
TEST(PrioritySchedulerTest, PreemptionTakesTheLargestPriorityNotTheNewest) {
  for (Policy policy : {Policy::kPriority, Policy::kFcfs}) {
    SCOPED_TRACE(policy == Policy::kPriority ? "priority" : "fcfs");
    kv::KvCacheManager kv(4, 4, false);  // 16 tokens of cache
    sched::Scheduler s(config(100, 4, policy), &kv);
    s.add_request(make_request("background", 8, 1));
    s.add_request(make_request("urgent", 8, 0));
    const Sched first = run_step(s);
    EXPECT_EQ(first.size(), 2u);
    const std::string kept = policy == Policy::kPriority ? "urgent" : "background";
    const std::string preempted = policy == Policy::kPriority ? "background" : "urgent";
    EXPECT_EQ(run_step(s), (Sched{{kept, 1}}));
    EXPECT_EQ(s.stats().num_preemptions, 1);
    ASSERT_NE(s.find_request(preempted), nullptr);
    EXPECT_EQ(s.find_request(preempted)->status, sched::RequestStatus::kPreempted);
  }
}

// A preempted request waits in priority order, not first in line: a later request with a
// smaller priority that fits starts before it (FCFS keeps the preempted one first, and it
// needs more blocks than are free).
TEST(PrioritySchedulerTest, APreemptedRequestWaitsInPriorityOrder) {
  for (Policy policy : {Policy::kPriority, Policy::kFcfs}) {
    SCOPED_TRACE(policy == Policy::kPriority ? "priority" : "fcfs");
    kv::KvCacheManager kv(4, 4, false);
    sched::Scheduler s(config(100, 4, policy), &kv);
    s.add_request(make_request("a", 8, 0));
    s.add_request(make_request("b", 8, 1));
    run_step(s);
    EXPECT_EQ(run_step(s), (Sched{{"a", 1}}));  // b goes under both policies: newest and largest
    s.add_request(make_request("c", 2, 0));     // one block; b needs three, one is free
    if (policy == Policy::kPriority) {
      EXPECT_EQ(run_step(s), (Sched{{"a", 1}, {"c", 2}}));
    } else {
      EXPECT_EQ(run_step(s), (Sched{{"a", 1}}));
      EXPECT_EQ(s.stats().num_waiting, 2);
    }
  }
}

// The token budget goes to running requests in priority order: a high-priority prompt admitted
// after a low-priority one still gets its chunks first.
TEST(PrioritySchedulerTest, TheTokenBudgetGoesToTheSmallerPriorityFirst) {
  kv::KvCacheManager kv(64, 4, false);
  sched::Scheduler s(config(8, 4, Policy::kPriority), &kv);
  s.add_request(make_request("low", 6, 2));
  EXPECT_EQ(run_step(s), (Sched{{"low", 6}}));
  s.add_request(make_request("high", 20, -2));
  EXPECT_EQ(run_step(s), (Sched{{"low", 1}, {"high", 7}}));  // admitted behind the running one
  EXPECT_EQ(run_step(s), (Sched{{"high", 8}}));              // now first in line
  EXPECT_EQ(run_step(s), (Sched{{"high", 5}, {"low", 1}}));
}

// The recompute scheduler (a PD decoder) hands back the request the priority policy would
// preempt.
TEST(PrioritySchedulerTest, TheRecomputeSchedulerHandsBackTheLargestPriority) {
  kv::KvCacheManager kv(4, 4, false);
  sched::SchedulerConfig c = config(100, 4, Policy::kPriority);
  c.recompute_scheduler_enable = true;
  sched::Scheduler s(c, &kv);
  s.add_request(make_request("background", 8, 3));
  s.add_request(make_request("urgent", 8, -1));
  run_step(s);
  const sched::SchedulerOutput second = s.schedule();
  EXPECT_EQ(second.num_recomputed, 1);
  ASSERT_EQ(second.scheduled.size(), 1u);
  EXPECT_EQ(second.scheduled[0].req_id, "urgent");
  const auto gone = s.take_recomputed();
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0]->request_id, "background");
}

}  // namespace
