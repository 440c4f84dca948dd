// ThreadPool: every index is visited exactly once (contiguous ranges and dynamic pieces), across
// many back-to-back regions.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
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

}  // namespace
