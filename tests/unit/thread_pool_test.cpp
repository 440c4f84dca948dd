// ThreadPool: every index is visited exactly once (contiguous ranges and dynamic pieces), across
// many back-to-back regions, and a held thread's dynamic pieces are taken over.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace {

TEST(ThreadPoolTest, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    common::ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, 1, [&](int64_t b, int64_t e, int tid) {
        EXPECT_LT(tid, threads);
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPoolTest, DynamicPiecesCoverRangeExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    common::ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 16, 1000}) {
      for (int64_t piece : {1, 16, 5000}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> calls{0};
        pool.parallel_for_dynamic(n, piece, [&](int64_t b, int64_t e, int tid) {
          EXPECT_LT(tid, threads);
          EXPECT_EQ(b % piece, 0) << "pieces start on multiples of the piece size";
          EXPECT_LE(e - b, piece);
          calls.fetch_add(1);
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i)
          EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " piece=" << piece << " i=" << i;
        EXPECT_EQ(calls.load(), (n + piece - 1) / piece) << "n=" << n << " piece=" << piece;
      }
    }
  }
}

TEST(ThreadPoolTest, GrainLimitsParts) {
  common::ThreadPool pool(4);
  std::atomic<int> parts{0};
  pool.parallel_for(10, 8, [&](int64_t, int64_t, int) { parts.fetch_add(1); });
  EXPECT_EQ(parts.load(), 2);
}

TEST(ThreadPoolTest, ManyShortRegionsDoNotLoseWork) {
  common::ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int iter = 0; iter < 20000; ++iter) {
    pool.parallel_for(4, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) sum.fetch_add(i + 1);
    });
  }
  EXPECT_EQ(sum.load(), 20000 * 10);
}

// A thread held up on its first piece: the other runs its own share and then every piece left
// in the held one's, so the held thread ends with that one piece. The hold is bounded, so a
// pool that does not help fails the count instead of hanging.
TEST(ThreadPoolTest, DynamicPiecesOfAHeldThreadAreTakenOver) {
  common::ThreadPool pool(2);
  constexpr int64_t kPieces = 16;
  std::atomic<int64_t> done_by_caller{0}, done_by_worker{0};
  std::atomic<bool> worker_started{false};
  auto wait_for = [](auto&& condition) {
    for (int i = 0; i < 10000 && !condition(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  pool.parallel_for_dynamic(kPieces, 1, [&](int64_t, int64_t, int tid) {
    if (tid == 0) {  // the caller: not before the worker holds a piece
      wait_for([&] { return worker_started.load(); });
      done_by_caller.fetch_add(1);
      return;
    }
    worker_started = true;
    wait_for([&] { return done_by_caller.load() >= kPieces - 1; });
    done_by_worker.fetch_add(1);
  });
  EXPECT_EQ(done_by_caller.load(), kPieces - 1);
  EXPECT_EQ(done_by_worker.load(), 1);
}

}  // namespace
