// Every collective of both backends (shared memory, gloo over loopback) on 2 and 4 ranks,
// against a naive reference computed from the same inputs; uneven all-to-all splits; sizes
// that take several rounds of the shared-memory slots; timeouts, abort, and a peer process
// that dies. Ranks run as threads here (each with its own group, as separate processes
// would have), except where a process has to die.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/timer.h"
#include "dist/group_factory.h"
#include "dist/peer_liveness.h"
#include "dist/process.h"
#include "dist/rendezvous_store.h"

namespace {

using dist::GroupBackend;
using dist::ProcessGroup;
using dist::ReduceOp;

struct Params {
  GroupBackend backend;
  int size;
};

std::string name_of(const testing::TestParamInfo<Params>& info) {
  return std::string(info.param.backend == GroupBackend::kShm ? "Shm" : "Gloo") +
         std::to_string(info.param.size) + "Ranks";
}

// Small shared-memory slots, so that the larger cases below run in several rounds.
constexpr size_t kSlotBytes = 64 << 10;

// Runs body(group) on `size` threads, one rank each, all in one group.
void run_ranks(GroupBackend backend, int size, const std::function<void(ProcessGroup&)>& body,
               double timeout_s = 60) {
  auto server = dist::StoreServer::start("127.0.0.1", 0);  // a free port
  const int port = server.ok() ? (*server)->port() : 0;
  ASSERT_TRUE(server.ok()) << server.status().message();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      dist::StoreClient store("127.0.0.1", port, 30);
      dist::GroupSpec spec("test", r, size);
      spec.timeout_s = timeout_s;
      spec.backend = backend;
      spec.shm_slot_bytes = kSlotBytes;
      auto group = dist::make_process_group(store, spec);
      ASSERT_TRUE(group.ok()) << group.status().message();
      if (backend != GroupBackend::kAuto) {
        EXPECT_STREQ((*group)->backend(), backend == GroupBackend::kShm ? "shm" : "gloo");
      }
      body(**group);
    });
  }
  for (auto& t : threads) t.join();
}

// Exact in float (small integers over a power of two), however the compiler contracts it.
float input(int rank, size_t i) {
  const int v = (rank + 1) * 64 + int(i % 97) - 64 * rank * int(i % 5);
  return static_cast<float>(v) / 128.0f;
}

class CollectivesTest : public testing::TestWithParam<Params> {};

TEST_P(CollectivesTest, AllReduceSumsAndMaxesInRankOrderOnEveryRank) {
  const auto [backend, size] = GetParam();
  for (const size_t count : {size_t(1), size_t(7168), size_t(100003)}) {
    std::mutex mu;
    std::vector<std::vector<float>> got(static_cast<size_t>(size));
    run_ranks(backend, size, [&](ProcessGroup& g) {
      std::vector<float> sum(count), mx(count);
      for (size_t i = 0; i < count; ++i) sum[i] = mx[i] = input(g.rank(), i);
      ASSERT_TRUE(g.all_reduce(sum.data(), count, ReduceOp::kSum).ok());
      ASSERT_TRUE(g.all_reduce(mx.data(), count, ReduceOp::kMax).ok());
      for (size_t i = 0; i < count; i += 1 + count / 1000) {
        float want = input(0, i), want_max = input(0, i);
        for (int r = 1; r < size; ++r) {
          want += input(r, i);
          want_max = std::max(want_max, input(r, i));
        }
        ASSERT_NEAR(sum[i], want, 1e-4f * (1 + std::abs(want))) << "element " << i;
        ASSERT_EQ(mx[i], want_max) << "element " << i;
      }
      std::lock_guard<std::mutex> lock(mu);
      got[size_t(g.rank())] = std::move(sum);
    });
    for (int r = 1; r < size; ++r)
      EXPECT_EQ(0, std::memcmp(got[0].data(), got[size_t(r)].data(), count * sizeof(float)))
          << "rank " << r << " holds other bits than rank 0 (count " << count << ")";
  }
}

TEST_P(CollectivesTest, AllReduceOfIntegersIsExact) {
  const auto [backend, size] = GetParam();
  run_ranks(backend, size, [&](ProcessGroup& g) {
    std::vector<int64_t> v = {g.rank() + 1, int64_t(1) << 40, -g.rank()};
    ASSERT_TRUE(g.all_reduce(v.data(), v.size(), ReduceOp::kSum).ok());
    EXPECT_EQ(v[0], int64_t(size) * (size + 1) / 2);
    EXPECT_EQ(v[1], int64_t(size) << 40);
    EXPECT_EQ(v[2], -int64_t(size) * (size - 1) / 2);
    int64_t busy = g.rank() == size - 1 ? 1 : 0;  // "anything unfinished?"
    ASSERT_TRUE(g.all_reduce(&busy, 1, ReduceOp::kMax).ok());
    EXPECT_EQ(busy, 1);
  });
}

TEST_P(CollectivesTest, AllGatherPutsEveryRanksBytesInRankOrder) {
  const auto [backend, size] = GetParam();
  for (const size_t bytes : {size_t(13), size_t(200001)}) {
    run_ranks(backend, size, [&](ProcessGroup& g) {
      std::vector<uint8_t> in(bytes), out(bytes * static_cast<size_t>(size), 0xEE);
      for (size_t i = 0; i < bytes; ++i) in[i] = uint8_t(g.rank() * 31 + i * 7);
      ASSERT_TRUE(g.all_gather(in.data(), bytes, out.data()).ok());
      for (int r = 0; r < size; ++r)
        for (size_t i = 0; i < bytes; i += 1 + bytes / 500)
          ASSERT_EQ(out[size_t(r) * bytes + i], uint8_t(r * 31 + i * 7)) << r << " " << i;
    });
  }
}

TEST_P(CollectivesTest, ReduceScatterGivesEachRankItsSummedSlice) {
  const auto [backend, size] = GetParam();
  for (const size_t count : {size_t(5), size_t(50000)}) {
    run_ranks(backend, size, [&](ProcessGroup& g) {
      std::vector<float> in(count * static_cast<size_t>(size)), out(count);
      for (size_t i = 0; i < in.size(); ++i) in[i] = input(g.rank(), i);
      ASSERT_TRUE(g.reduce_scatter(in.data(), out.data(), count).ok());
      for (size_t i = 0; i < count; i += 1 + count / 500) {
        const size_t at = size_t(g.rank()) * count + i;
        float want = 0;
        for (int r = 0; r < size; ++r) want += input(r, at);
        ASSERT_NEAR(out[i], want, 1e-4f * (1 + std::abs(want))) << i;
      }
    });
  }
}

// Bytes rank `from` sends to rank `to`: uneven, some pairs nothing, some past a slot window.
size_t split(int from, int to) {
  const size_t sizes[] = {0, 1, 64, 1000, 37000, 70001};
  return sizes[size_t(from * 5 + to * 3) % 6];
}

TEST_P(CollectivesTest, AllToAllVMovesUnevenSplits) {
  const auto [backend, size] = GetParam();
  run_ranks(backend, size, [&](ProcessGroup& g) {
    std::vector<size_t> send(static_cast<size_t>(size)), recv(static_cast<size_t>(size));
    size_t send_total = 0, recv_total = 0;
    for (int p = 0; p < size; ++p) {
      send[size_t(p)] = split(g.rank(), p);
      recv[size_t(p)] = split(p, g.rank());
      send_total += send[size_t(p)];
      recv_total += recv[size_t(p)];
    }
    std::vector<uint8_t> in(send_total), out(recv_total, 0xEE);
    size_t at = 0;
    for (int p = 0; p < size; ++p)
      for (size_t i = 0; i < send[size_t(p)]; ++i) in[at++] = uint8_t(g.rank() * 50 + p * 7 + i);
    ASSERT_TRUE(g.all_to_all_v(in.data(), send, out.data(), recv).ok());
    at = 0;
    for (int q = 0; q < size; ++q)
      for (size_t i = 0; i < recv[size_t(q)]; ++i, ++at)
        ASSERT_EQ(out[at], uint8_t(q * 50 + g.rank() * 7 + i)) << "from " << q << " byte " << i;
  });
}

TEST_P(CollectivesTest, BroadcastFromEveryRootAndBarrier) {
  const auto [backend, size] = GetParam();
  std::atomic<int> arrived{0};
  run_ranks(backend, size, [&](ProcessGroup& g) {
    for (int root = 0; root < size; ++root) {
      std::vector<uint8_t> data(150001, uint8_t(g.rank()));
      if (g.rank() == root)
        for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(root + i * 3);
      ASSERT_TRUE(g.broadcast(data.data(), data.size(), root).ok());
      for (size_t i = 0; i < data.size(); i += 997) ASSERT_EQ(data[i], uint8_t(root + i * 3));
    }
    ++arrived;
    ASSERT_TRUE(g.barrier().ok());
    EXPECT_EQ(arrived.load(), size) << "a rank left the barrier before every rank came";
  });
}

TEST_P(CollectivesTest, ARankThatNeverComesTimesTheCollectiveOut) {
  const auto [backend, size] = GetParam();
  run_ranks(
      backend, size,
      [&](ProcessGroup& g) {
        if (g.rank() == size - 1) {
          std::this_thread::sleep_for(std::chrono::seconds(3));
          return;  // never joins the all-reduce
        }
        float x = 1;
        const double t0 = common::now_seconds();
        const common::Status st = g.all_reduce(&x, 1, ReduceOp::kSum);
        const double waited = common::now_seconds() - t0;
        EXPECT_FALSE(st.ok());
        EXPECT_NE(st.message().find("test"), std::string::npos) << st.message();
        EXPECT_LT(waited, 2.9) << st.message();
        EXPECT_FALSE(g.all_reduce(&x, 1, ReduceOp::kSum).ok()) << "a failed group stays failed";
      },
      /*timeout_s=*/1);
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectivesTest,
                         testing::Values(Params{GroupBackend::kShm, 2},
                                         Params{GroupBackend::kShm, 4},
                                         Params{GroupBackend::kGloo, 2},
                                         Params{GroupBackend::kGloo, 4}),
                         name_of);

TEST(ShmGroupTest, AbortFromOneRankFailsTheOthersAtOnce) {
  run_ranks(GroupBackend::kShm, 3, [&](ProcessGroup& g) {
    if (g.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      g.abort("the server is stopping");
      return;
    }
    float x = 1;
    const double t0 = common::now_seconds();
    const common::Status st = g.all_reduce(&x, 1, ReduceOp::kSum);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("the server is stopping"), std::string::npos) << st.message();
    EXPECT_LT(common::now_seconds() - t0, 5.0);
  });
}

TEST(GroupFactoryTest, OneHostGetsSharedMemoryAndTheStoreNamesAMissingRank) {
  run_ranks(GroupBackend::kAuto, 2, [](ProcessGroup& g) { EXPECT_STREQ(g.backend(), "shm"); });
  auto server = dist::StoreServer::start("127.0.0.1", 0);  // a free port
  const int port = server.ok() ? (*server)->port() : 0;
  ASSERT_TRUE(server.ok());
  dist::StoreClient store("127.0.0.1", port, 0.5);
  dist::GroupSpec spec;
  spec.name = "lonely";
  spec.size = 2;  // rank 1 never comes
  auto group = dist::make_process_group(store, spec);
  ASSERT_FALSE(group.ok());
  EXPECT_NE(group.status().message().find("lonely/host/1"), std::string::npos)
      << group.status().message();
  int unused_port = 0;  // a port that was free a moment ago, and no store on it now
  {
    auto gone = dist::StoreServer::start("127.0.0.1", 0);
    ASSERT_TRUE(gone.ok());
    unused_port = (*gone)->port();
  }
  dist::StoreClient nobody("127.0.0.1", unused_port, 0.3);
  auto missing = nobody.get("x");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("is rank 0 running"), std::string::npos)
      << missing.status().message();
}

// A peer process that joins and then exits: the survivor's collective fails within seconds,
// naming what happened, on both backends.
TEST(DeadPeerTest, APeerProcessThatExitsFailsTheCollective) {
  for (const GroupBackend backend : {GroupBackend::kShm, GroupBackend::kGloo}) {
    auto server = dist::StoreServer::start("127.0.0.1", 0);  // a free port
    const int port = server.ok() ? (*server)->port() : 0;
    ASSERT_TRUE(server.ok());
    auto child = dist::spawn_process(
        COLLECTIVE_RANK_BINARY,
        {std::to_string(port), "1", "2", backend == GroupBackend::kShm ? "shm" : "gloo", "exit"},
        {});
    ASSERT_TRUE(child.ok()) << child.status().message();
    dist::StoreClient store("127.0.0.1", port, 30);
    dist::GroupSpec spec;
    spec.name = "dead";
    spec.size = 2;
    spec.backend = backend;
    spec.timeout_s = 60;
    auto group = dist::make_process_group(store, spec);
    ASSERT_TRUE(group.ok()) << group.status().message();
    // The peer leaves after this barrier: before it, gloo's connections may still be forming
    // (a peer gone then fails the group's creation instead of its first collective).
    ASSERT_TRUE((*group)->barrier().ok()) << (*group)->backend();
    float x = 1;
    const double t0 = common::now_seconds();
    const common::Status st = (*group)->all_reduce(&x, 1, ReduceOp::kSum);
    const double waited = common::now_seconds() - t0;
    EXPECT_FALSE(st.ok()) << (*group)->backend();
    EXPECT_LT(waited, 10.0) << (*group)->backend() << ": " << st.message();
    std::printf("    %s: the collective failed after %.2f s: %s\n", (*group)->backend(), waited,
                st.message().c_str());
    int status = 0;
    waitpid(*child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
  }
}

}  // namespace

namespace {

// The liveness mesh gloo groups keep: a peer whose connections close (its process ending)
// is reported once, to every other rank, within the poll; live peers are not.
TEST(PeerLivenessTest, ReportsAClosedPeerToEveryOtherRankOnce) {
  auto server = dist::StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  constexpr int kRanks = 3;
  std::vector<std::unique_ptr<dist::PeerLiveness>> ranks(kRanks);
  std::vector<std::thread> joiners;
  std::mutex mu;
  std::vector<std::string> errors;
  for (int r = 0; r < kRanks; ++r) {
    joiners.emplace_back([&, r] {
      dist::StoreClient store("127.0.0.1", (*server)->port(), 30);
      auto l = dist::PeerLiveness::connect(store, "live/", r, kRanks, "127.0.0.1");
      std::lock_guard<std::mutex> lock(mu);
      if (l.ok()) {
        ranks[size_t(r)] = std::move(*l);
      } else {
        errors.push_back(l.status().message());
      }
    });
  }
  for (auto& t : joiners) t.join();
  ASSERT_TRUE(errors.empty()) << errors.front();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(ranks[size_t(r)]->wait_for_loss(50), -1) << r;
  ranks[2].reset();  // rank 2 goes away: its sockets close as a dead process's would
  for (int r = 0; r < 2; ++r) {
    const double t0 = common::now_seconds();
    EXPECT_EQ(ranks[size_t(r)]->wait_for_loss(5000), 2) << "rank " << r;
    EXPECT_LT(common::now_seconds() - t0, 1.0) << "rank " << r;
    EXPECT_EQ(ranks[size_t(r)]->wait_for_loss(50), -1) << "reported once, rank " << r;
  }
}

}  // namespace
