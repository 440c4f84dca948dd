// The pull connector's scheduler side on a decoder, with the real scheduler and a real P
// sender for its leases: the n choices of one request name one remote prompt and pull it once
// (the others share its blocks, with or without a prefix cache), P is released only when the last
// choice gives it up without pulling, blocks that hold another prompt are never taken, and a
// release from outside (the proxy's) never frees blocks a request here may pull.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "model/kv_cache.h"
#include "sched/scheduler.h"
#include "transfer/pull_connector.h"
#include "transfer/pull_sender.h"

namespace {

constexpr int kBlockSize = 4;
constexpr int kPromptLen = 10;  // 3 blocks, the last one partial

class PullSchedulerTest : public ::testing::Test {
 protected:
  explicit PullSchedulerTest(bool enable_prefix_caching = true)
      : port_(29700 + getpid() % 1500),  // apart from pull_protocol_test's and pd_test's ports
        p_cache_(1, 0, 1, 16, kBlockSize, 6),
        kv_(32, kBlockSize, enable_prefix_caching),
        connector_(options()),
        scheduler_({100, 8, 64}, &kv_) {
    transfer::PullSenderOptions so;
    so.engine_id = "p";
    so.bind_host = "127.0.0.1";
    so.port = port_;
    auto sender = transfer::PullSender::start(so, &p_cache_, 0, 1);
    EXPECT_TRUE(sender.ok()) << sender.status().message();
    if (sender.ok()) sender_ = std::move(sender).value();
    scheduler_.set_kv_connector(&connector_);
  }

  static transfer::PullOptions options() {
    transfer::PullOptions o;
    o.consumer = true;
    o.block_size = kBlockSize;
    return o;
  }

  std::vector<int32_t> prompt(int first) const {
    std::vector<int32_t> ids(kPromptLen);
    std::iota(ids.begin(), ids.end(), first);
    return ids;
  }

  // The params P answers for remote request `remote`: the prompt starting at 1.
  std::string params(const std::string& remote, int port = 0, int pp = 1) const {
    return nlohmann::json{{"do_remote_prefill", true},
                          {"remote_engine_id", "p"},
                          {"remote_request_id", remote},
                          {"remote_host", "127.0.0.1"},
                          {"remote_port", port != 0 ? port : port_},
                          {"remote_block_ids", {{3, 4, 5}}},
                          {"num_prompt_blocks", 3},
                          {"remote_block_size", kBlockSize},
                          {"remote_ptp_size", 1},
                          {"remote_pp_size", pp},
                          {"prompt_hash", transfer::prompt_hash(prompt(1))}}
        .dump();
  }

  // A request whose KV P holds as remote request `remote`.
  void add(const std::string& id, const std::string& remote, int first_token = 1) {
    auto r = std::make_unique<sched::Request>();
    r->request_id = id;
    r->prompt_token_ids = prompt(first_token);
    r->kv_transfer_params = params(remote);
    scheduler_.add_request(std::move(r));
  }

  // The loads the step asks the workers to start.
  std::vector<std::string> loads(const sched::SchedulerOutput& out) {
    std::vector<std::string> ids;
    if (out.kv_connector_metadata.empty()) return ids;
    auto meta = transfer::decode_step_meta(out.kv_connector_metadata);
    EXPECT_TRUE(meta.ok());
    if (meta.ok())
      for (const auto& t : meta->recvs) ids.push_back(t.req_id + "<-" + t.remote.remote_request_id);
    return ids;
  }

  // The workers report request `id`'s load done.
  void loaded(const std::string& id) {
    sched::KvTransferReport report;
    report.finished_recving = {id};
    scheduler_.update_kv_transfers(report);
  }

  // The leases P ended within `ms` (a DONE arrived for them).
  std::vector<std::string> released_within(int ms) {
    std::vector<std::string> done;
    sched::KvTransferStats stats;
    for (int waited = 0; waited < ms && done.empty(); waited += 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      sender_->take_finished(&done, &stats);
    }
    return done;
  }

  const int port_;
  model::LatentKvCache p_cache_;
  kv::KvCacheManager kv_;
  transfer::PullScheduler connector_;
  sched::Scheduler scheduler_;
  std::unique_ptr<transfer::PullSender> sender_;
};

// The seed's decoders run without a prefix cache.
class PullSchedulerWithoutPrefixCacheTest : public PullSchedulerTest {
 protected:
  PullSchedulerWithoutPrefixCacheTest() : PullSchedulerTest(false) {}
};

TEST_F(PullSchedulerTest, ChoicesOfOneRequestPullOnceAndReadTheLoadedBlocks) {
  ASSERT_NE(sender_, nullptr);
  sender_->add_leases({"r1"});
  for (const char* id : {"c0", "c1", "c2"}) add(id, "r1");
  auto first = scheduler_.schedule();
  EXPECT_EQ(loads(first), (std::vector<std::string>{"c0<-r1"})) << "one pull for three choices";
  scheduler_.update(first, {});
  EXPECT_EQ(scheduler_.find_request("c0")->status, sched::RequestStatus::kWaitingForRemoteKvs);
  for (const char* id : {"c1", "c2"}) {
    EXPECT_EQ(scheduler_.find_request(id)->status, sched::RequestStatus::kWaiting) << id;
    EXPECT_TRUE(kv_.block_table(id).empty()) << id << " holds no blocks while it waits";
  }
  auto waiting = scheduler_.schedule();  // c0 still loading: the others keep waiting
  EXPECT_TRUE(waiting.scheduled.empty());
  EXPECT_TRUE(loads(waiting).empty());
  scheduler_.update(waiting, {});

  loaded("c0");
  auto so = scheduler_.schedule();
  ASSERT_EQ(so.scheduled.size(), 3u);
  EXPECT_EQ(so.scheduled[0].req_id, "c0");
  EXPECT_EQ(so.scheduled[0].num_computed_tokens, kPromptLen - 1);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(so.scheduled[i].num_computed_tokens, 8) << "c0's two full blocks, from the cache";
    EXPECT_EQ(so.scheduled[i].num_scheduled_tokens, 2);
  }
  EXPECT_TRUE(loads(so).empty());
  EXPECT_TRUE(released_within(200).empty()) << "the puller's own DONE ends P's lease, not us";
}

TEST_F(PullSchedulerWithoutPrefixCacheTest, ChoicesShareTheBlocksTheFirstOneLoaded) {
  ASSERT_NE(sender_, nullptr);
  sender_->add_leases({"r4"});
  for (const char* id : {"c0", "c1"}) add(id, "r4");
  auto first = scheduler_.schedule();
  EXPECT_EQ(loads(first), (std::vector<std::string>{"c0<-r4"}));
  scheduler_.update(first, {});
  loaded("c0");
  auto so = scheduler_.schedule();
  ASSERT_EQ(so.scheduled.size(), 2u);
  EXPECT_EQ(so.scheduled[1].req_id, "c1");
  EXPECT_EQ(so.scheduled[1].num_computed_tokens, 8) << "c0's two full blocks, shared";
  EXPECT_EQ(so.scheduled[1].num_scheduled_tokens, 2);
  const auto& c0 = kv_.block_table("c0");
  const auto& c1 = kv_.block_table("c1");
  ASSERT_EQ(c1.size(), 3u);
  EXPECT_EQ(c1[0], c0[0]);
  EXPECT_EQ(c1[1], c0[1]);
  EXPECT_NE(c1[2], c0[2]) << "each choice writes its own last block";
  scheduler_.update(so, {7, 7});
  scheduler_.finish_request("c0", sched::FinishReason::kStop);
  EXPECT_EQ(kv_.num_free_blocks(), 32 - 3) << "c1 still holds the shared blocks";
  scheduler_.finish_request("c1", sched::FinishReason::kStop);
  EXPECT_EQ(kv_.num_free_blocks(), 32);
}

// A choice can reach the engine a step after its siblings, under load after their whole pull
// (a PD soak saw it): P freed the blocks at the puller's DONE, so a second pull would fail the
// request. The late choice shares the loaded blocks while their loader runs, and computes its
// prompt here once the loader has ended; neither pulls again.
TEST_F(PullSchedulerWithoutPrefixCacheTest, AChoiceArrivingAfterTheLoadNeverPullsAgain) {
  ASSERT_NE(sender_, nullptr);
  sender_->add_leases({"r9"});
  add("c0", "r9");
  auto first = scheduler_.schedule();
  EXPECT_EQ(loads(first), (std::vector<std::string>{"c0<-r9"}));
  scheduler_.update(first, {});
  loaded("c0");
  auto step = scheduler_.schedule();
  scheduler_.update(step, {7});
  add("c1", "r9");
  auto late = scheduler_.schedule();
  EXPECT_TRUE(loads(late).empty()) << "P no longer holds the blocks";
  const sched::ScheduledRequest* c1 = nullptr;
  for (const auto& r : late.scheduled)
    if (r.req_id == "c1") c1 = &r;
  ASSERT_NE(c1, nullptr);
  EXPECT_EQ(c1->num_computed_tokens, 8) << "c0's two full blocks, shared";
  scheduler_.update(late, {7, 7});
  scheduler_.finish_request("c0", sched::FinishReason::kStop);
  scheduler_.finish_request("c1", sched::FinishReason::kStop);
  add("c2", "r9");
  auto after = scheduler_.schedule();
  EXPECT_TRUE(loads(after).empty()) << "nor after its loader has ended";
  ASSERT_EQ(after.scheduled.size(), 1u);
  EXPECT_EQ(after.scheduled[0].num_computed_tokens, 0);
  EXPECT_EQ(after.scheduled[0].num_scheduled_tokens, kPromptLen);
}

TEST_F(PullSchedulerTest, PIsReleasedWhenTheLastChoiceGivesUpWithoutPulling) {
  ASSERT_NE(sender_, nullptr);
  sender_->add_leases({"r2"});
  for (const char* id : {"c0", "c1"}) add(id, "r2");
  scheduler_.finish_request("c0", sched::FinishReason::kAbort);
  EXPECT_TRUE(released_within(200).empty()) << "c1 may still pull it";
  scheduler_.finish_request("c1", sched::FinishReason::kAbort);
  EXPECT_EQ(released_within(5000), (std::vector<std::string>{"r2"}));
}

TEST_F(PullSchedulerTest, BlocksOfAnotherPromptAreComputedHereAndReleased) {
  ASSERT_NE(sender_, nullptr);
  sender_->add_leases({"r3"});
  add("other", "r3", /*first_token=*/100);  // P's blocks hold the prompt starting at 1
  auto so = scheduler_.schedule();
  EXPECT_TRUE(loads(so).empty());
  ASSERT_EQ(so.scheduled.size(), 1u);
  EXPECT_EQ(so.scheduled[0].num_computed_tokens, 0);
  EXPECT_EQ(so.scheduled[0].num_scheduled_tokens, kPromptLen);
  EXPECT_EQ(released_within(5000), (std::vector<std::string>{"r3"}));
}

// A batch's prompts all carry the params of the first (P's answer names one prompt): the other
// prompt neither waits for the pull nor shares the blocks, even with the same block count.
TEST_F(PullSchedulerWithoutPrefixCacheTest, ABatchsOtherPromptNeitherWaitsNorShares) {
  ASSERT_NE(sender_, nullptr);
  sender_->add_leases({"r5"});
  add("mine", "r5");
  add("other", "r5", /*first_token=*/100);
  auto first = scheduler_.schedule();
  EXPECT_EQ(loads(first), (std::vector<std::string>{"mine<-r5"}));
  ASSERT_EQ(first.scheduled.size(), 1u);
  EXPECT_EQ(first.scheduled[0].req_id, "other");
  EXPECT_EQ(first.scheduled[0].num_computed_tokens, 0);
  EXPECT_EQ(first.scheduled[0].num_scheduled_tokens, kPromptLen);
  EXPECT_TRUE(released_within(200).empty()) << "mine pulls it";
}

// The proxy asks for a release when its client leaves, but the request may already be here:
// its own pull (or give-up) ends P's lease, and a DONE now would free the blocks under the pull.
TEST_F(PullSchedulerTest, AnOutsideReleaseLeavesAPromptARequestHereNamesToIt) {
  ASSERT_NE(sender_, nullptr);
  sender_->add_leases({"r6"});
  add("c0", "r6");
  connector_.release_unscheduled(params("r6"));
  EXPECT_TRUE(released_within(300).empty()) << "c0 owns the release";
  auto so = scheduler_.schedule();
  EXPECT_EQ(loads(so), (std::vector<std::string>{"c0<-r6"}));
  scheduler_.update(so, {});
  scheduler_.finish_request("c0", sched::FinishReason::kAbort);  // the client left mid-pull
  connector_.release_unscheduled(params("r6"));
  EXPECT_TRUE(released_within(300).empty()) << "the load in flight reads the blocks";
}

// The release may come first: the request that then arrives computes its prompt here.
TEST_F(PullSchedulerTest, ARequestArrivingAfterAnOutsideReleaseComputesItsPrompt) {
  ASSERT_NE(sender_, nullptr);
  sender_->add_leases({"r7"});
  connector_.release_unscheduled(params("r7"));
  EXPECT_EQ(released_within(5000), (std::vector<std::string>{"r7"}));
  add("late", "r7");
  auto so = scheduler_.schedule();
  EXPECT_TRUE(loads(so).empty()) << "P freed those blocks";
  ASSERT_EQ(so.scheduled.size(), 1u);
  EXPECT_EQ(so.scheduled[0].num_computed_tokens, 0);
  EXPECT_EQ(so.scheduled[0].num_scheduled_tokens, kPromptLen);
}

// A prefiller that died (killed, its host gone) answers no DONE; each costs the client's whole
// retry budget (3 x 1 s). Releases for a live prefiller must not queue behind all of them.
TEST_F(PullSchedulerTest, ADeadPrefillerDoesNotHoldUpReleasesForALiveOne) {
  ASSERT_NE(sender_, nullptr);
  const int dead_port = port_ + 1;  // nothing here listens on it
  // The first names 64 stages: a release stops at its first stage that fails.
  for (int i = 0; i < 8; ++i)
    connector_.release_unscheduled(params("dead" + std::to_string(i), dead_port, i == 0 ? 64 : 1));
  sender_->add_leases({"r8"});
  connector_.release_unscheduled(params("r8"));
  // One DONE to the dead port times out (3 s); the rest are dropped, not minutes more.
  EXPECT_EQ(released_within(12000), (std::vector<std::string>{"r8"}));
}

}  // namespace
