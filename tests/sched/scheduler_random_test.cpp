// The scheduler under random traffic, as an engine drives it: arrivals, KV loads that finish or
// fail some steps later, requests asked to come back later, sends that hold blocks, aborts,
// handed-back and preempted requests, speculative drafts, one or two steps in flight, either
// scheduling policy (random priorities), over caches of a few blocks.
// Every request must leave within a bounded number of steps, and every block must come back.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "sched/scheduler.h"

namespace {

// Loads and sends that complete (or, for loads, fail) a random number of steps after they start.
class RandomConnector : public sched::KvConnectorScheduler {
 public:
  explicit RandomConnector(std::mt19937* rng) : rng_(*rng) {}

  std::optional<sched::MatchedTokens> get_num_new_matched_tokens(const sched::Request& r,
                                                                 int64_t computed) override {
    if (later_[r.request_id] < 3 && chance(0.2)) {
      ++later_[r.request_id];
      return std::nullopt;
    }
    const int64_t rest = r.num_prompt_tokens() - computed;
    async_[r.request_id] = chance(0.7);
    if (rest <= 0 || chance(0.4)) return sched::MatchedTokens{};
    return sched::MatchedTokens{std::uniform_int_distribution<int64_t>(1, rest)(rng_),
                                async_[r.request_id]};
  }
  void update_state_after_alloc(const sched::Request& r, const std::vector<kv::BlockId>&,
                                int64_t external) override {
    if (external > 0 && async_[r.request_id]) loading_[r.request_id] = steps();
  }
  std::vector<uint8_t> build_connector_meta(const sched::SchedulerOutput&,
                                            const kv::KvCacheManager&) override {
    return {};
  }
  sched::FinishedHandoff request_finished(const sched::Request& r,
                                          const std::vector<kv::BlockId>& blocks) override {
    if (blocks.empty() || loading_.count(r.request_id) || !chance(0.3)) return {};
    sending_[r.request_id] = steps();
    return {true, ""};
  }

  // What completed since the last call.
  sched::KvTransferReport report() {
    sched::KvTransferReport out;
    for (auto it = loading_.begin(); it != loading_.end();) {
      if (--it->second > 0) {
        ++it;
        continue;
      }
      if (chance(0.15)) {
        out.failed_recving.emplace_back(it->first, "peer gone");
      } else {
        out.finished_recving.push_back(it->first);
      }
      it = loading_.erase(it);
    }
    for (auto it = sending_.begin(); it != sending_.end();) {
      if (--it->second > 0) {
        ++it;
        continue;
      }
      out.finished_sending.push_back(it->first);
      it = sending_.erase(it);
    }
    return out;
  }
  bool idle() const { return loading_.empty() && sending_.empty(); }

 private:
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  int steps() { return std::uniform_int_distribution<int>(1, 6)(rng_); }

  std::mt19937& rng_;
  std::map<std::string, int> later_;    // times each request was asked to come back later
  std::map<std::string, bool> async_;   // whether its last answer offered an asynchronous load
  std::map<std::string, int> loading_;  // steps left
  std::map<std::string, int> sending_;  // steps left
};

// Counts over all workloads.
struct Trace {
  int steps = 0;
  int preempted = 0;
  int recomputed = 0;
  int load_failures = 0;
  int aborted = 0;
  int finished = 0;
  int drafts_verified = 0;
};

// Runs one random workload, counting into *t; fails the test (with the seed) on a stuck or
// leaking scheduler.
void run_workload(uint32_t seed, Trace* t) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  const int block_size = 4;
  const int num_blocks = pick(4, 12);
  kv::KvCacheManager kv(num_blocks, block_size, /*enable_prefix_caching=*/chance(0.5));
  sched::SchedulerConfig config;
  config.max_num_batched_tokens = pick(8, 64);
  config.max_num_seqs = pick(1, 8);
  config.max_model_len = num_blocks * block_size;
  config.recompute_scheduler_enable = chance(0.5);
  config.recompute_kv_load_failures = chance(0.5);
  config.num_lookahead_tokens = pick(0, 2);
  config.policy = chance(0.5) ? sched::SchedulingPolicy::kPriority : sched::SchedulingPolicy::kFcfs;
  sched::Scheduler s(config, &kv);
  RandomConnector connector(&rng);
  s.set_kv_connector(&connector);
  const size_t in_flight_limit = pick(1, 2);  // pipeline parallelism keeps two steps in flight

  const int num_requests = 40;
  std::map<std::string, int> max_tokens;  // of the requests still in the scheduler
  int steps = 0;
  int added = 0;
  int stuck = 0;
  std::deque<sched::SchedulerOutput> in_flight;
  std::ostringstream where;
  where << "seed " << seed << ", " << num_blocks << " blocks";
  while (added < num_requests || s.has_requests() || !in_flight.empty()) {
    ++t->steps;
    if (++steps > 20000) {
      ADD_FAILURE() << where.str() << ": still running after 20000 steps";
      return;
    }
    if (added < num_requests && chance(0.3)) {
      auto r = std::make_unique<sched::Request>();
      r->request_id = "r" + std::to_string(added++);
      const int prompt = pick(1, static_cast<int>(std::min<int64_t>(
                                     24, config.max_model_len - 1 - config.num_lookahead_tokens)));
      for (int i = 0; i < prompt; ++i)
        r->prompt_token_ids.push_back(pick(1, 3));  // shared prefixes
      r->recomputable = chance(0.7);
      r->priority = pick(-2, 2);
      max_tokens[r->request_id] =
          pick(1, static_cast<int>(config.max_model_len - config.num_lookahead_tokens - prompt));
      s.add_request(std::move(r));
    }
    s.update_kv_transfers(connector.report());
    sched::SchedulerOutput out = s.schedule();
    const bool ran = !out.empty() || out.kv_connector_poll;
    // Each step keeps to the budget and the sequence limit, and each entry has its slots.
    if (out.total_num_scheduled_tokens > config.max_num_batched_tokens ||
        static_cast<int>(out.scheduled.size()) > config.max_num_seqs) {
      ADD_FAILURE() << where.str() << ": a step over its limits";
      return;
    }
    for (const auto& e : out.scheduled) {
      const int64_t slots = static_cast<int64_t>(kv.block_table(e.req_id).size()) * block_size;
      if (slots < e.num_computed_tokens + e.num_scheduled_tokens) {
        ADD_FAILURE() << where.str() << ": " << e.req_id << " scheduled past its slots";
        return;
      }
    }
    t->preempted += out.num_preempted;
    t->recomputed += out.num_recomputed;
    if (ran) in_flight.push_back(std::move(out));
    if (in_flight.size() >= in_flight_limit || (!ran && !in_flight.empty())) {
      const sched::SchedulerOutput step = std::move(in_flight.front());
      in_flight.pop_front();
      // A sampling entry gets its token and some of its drafts accepted, and new drafts.
      std::vector<std::vector<int32_t>> sampled(step.scheduled.size());
      std::vector<std::vector<int32_t>> drafts(step.scheduled.size());
      for (size_t i = 0; i < step.scheduled.size(); ++i) {
        const sched::ScheduledRequest& e = step.scheduled[i];
        if (!e.samples) continue;
        t->drafts_verified += static_cast<int>(e.spec_token_ids.size());
        sampled[i].resize(1 + pick(0, static_cast<int>(e.spec_token_ids.size())), pick(1, 3));
        drafts[i].resize(pick(0, config.num_lookahead_tokens), pick(1, 3));
      }
      s.update(step, sampled, drafts);
      for (const auto& e : step.scheduled) {
        const sched::Request* r = s.find_request(e.req_id);
        if (r != nullptr && static_cast<int>(r->output_token_ids.size()) >= max_tokens[e.req_id]) {
          s.truncate_output(e.req_id,
                            max_tokens[e.req_id]);  // tokens past the stop, as drafts give
          s.finish_request(e.req_id, sched::FinishReason::kLength);
          max_tokens.erase(e.req_id);
          ++t->finished;
        }
      }
    }
    if (!max_tokens.empty() && chance(0.01)) {
      auto victim = std::next(max_tokens.begin(), pick(0, static_cast<int>(max_tokens.size()) - 1));
      if (s.abort_request(victim->first) != nullptr) ++t->aborted;
      max_tokens.erase(victim);
    }
    for (const auto& r : s.take_recomputed()) max_tokens.erase(r->request_id);
    for (const auto& [r, why] : s.take_load_failures()) {
      max_tokens.erase(r->request_id);
      ++t->load_failures;
    }
    // Nothing ran, nothing is in flight or being transferred, and no request is on its way in:
    // the next steps see the same state (but for come-back-later answers, a few at most).
    stuck = !ran && in_flight.empty() && connector.idle() && added == num_requests ? stuck + 1 : 0;
    if (stuck > 8) {
      const sched::SchedulerStats st = s.stats();
      ADD_FAILURE() << where.str() << ": stuck with " << st.num_running << " running, "
                    << st.num_waiting << " waiting and " << kv.num_free_blocks() << " free blocks";
      return;
    }
  }
  EXPECT_EQ(kv.num_free_blocks(), num_blocks) << where.str() << ": blocks leaked";
  EXPECT_TRUE(max_tokens.empty()) << where.str() << ": a request vanished";
}

TEST(SchedulerRandomTest, EveryRequestLeavesAndEveryBlockComesBack) {
  Trace total;
  for (uint32_t seed = 1; seed <= 1000 && !HasFailure(); ++seed) run_workload(seed, &total);
  // The workloads reach every path they are here to exercise.
  EXPECT_GT(total.preempted, 0);
  EXPECT_GT(total.recomputed, 0);
  EXPECT_GT(total.load_failures, 0);
  EXPECT_GT(total.aborted, 0);
  EXPECT_GT(total.finished, 0);
  EXPECT_GT(total.drafts_verified, 0);
  std::printf(
      "    %d steps: %d finished, %d preempted, %d handed back, %d failed loads, %d aborted, %d "
      "drafts verified\n",
      total.steps, total.finished, total.preempted, total.recomputed, total.load_failures,
      total.aborted, total.drafts_verified);
}

}  // namespace
