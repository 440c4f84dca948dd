// The data-parallel balancer's rule, without processes: the score, the tie order, dead engines,
// and what a burst of arrivals does before and after the engines' reports.
#include "engine/dp_balance.h"

#include <gtest/gtest.h>

namespace engine {
namespace {

EngineLoad live(int64_t unfinished, int64_t reported_running) {
  return EngineLoad{true, unfinished, reported_running};
}

TEST(DpBalanceTest, NoLiveEngineIsMinusOne) {
  EXPECT_EQ(least_loaded_engine({}, 0), -1);
  EXPECT_EQ(least_loaded_engine({EngineLoad{}, EngineLoad{}}, 1), -1);
}

TEST(DpBalanceTest, DeadEnginesAreSkippedHoweverIdle) {
  std::vector<EngineLoad> loads = {live(9, 9), EngineLoad{false, 0, 0}, live(7, 7)};
  EXPECT_EQ(least_loaded_engine(loads, 0), 2);
  EXPECT_EQ(least_loaded_engine(loads, 1), 2);
}

TEST(DpBalanceTest, WaitingWeighsFourTimesRunning) {
  // Engine 0: 3 running (score 3). Engine 1: 1 unfinished, not yet reported (waiting, score 4).
  EXPECT_EQ(least_loaded_engine({live(3, 3), live(1, 0)}, 0), 0);
  EXPECT_EQ(least_loaded_engine({live(3, 3), live(1, 0)}, 1), 0);
  // A stale report never counts more running than there are unfinished requests.
  EXPECT_EQ(least_loaded_engine({live(2, 50), live(3, 3)}, 1), 0);
}

TEST(DpBalanceTest, TiesFollowTheScanStart) {
  const std::vector<EngineLoad> loads = {live(2, 2), live(2, 2), live(2, 2)};
  for (size_t first = 0; first < 6; ++first)
    EXPECT_EQ(least_loaded_engine(loads, first), int(first % 3));
}

// Places `n` arrivals one after another, no request finishing meanwhile; returns the counts.
std::vector<int64_t> place_burst(std::vector<EngineLoad> loads, int n) {
  std::vector<int64_t> placed(loads.size(), 0);
  for (int i = 0; i < n; ++i) {
    const int e = least_loaded_engine(loads, size_t(i) % loads.size());
    EXPECT_GE(e, 0);
    ++loads[size_t(e)].unfinished;
    ++placed[size_t(e)];
  }
  return placed;
}

TEST(DpBalanceTest, ABurstSplitsEvenlyBetweenEqualEngines) {
  EXPECT_EQ(place_burst({live(0, 0), live(0, 0)}, 64), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(place_burst({live(0, 0), live(0, 0), live(0, 0), live(0, 0)}, 64),
            (std::vector<int64_t>{16, 16, 16, 16}));
}

TEST(DpBalanceTest, AnEngineReportedRunningMoreTakesMoreOfTheBurst) {
  // Both hold 10 requests; engine 0 reported all 10 running (score 10), engine 1 only 2, so 8
  // wait there (score 2 + 4·8 = 34). Engine 0 takes the first 6 arrivals outright (10..30 < 34);
  // from then on every new request costs 4 on either side and they alternate: 6 + 5 against 5.
  EXPECT_EQ(place_burst({live(10, 10), live(10, 2)}, 16), (std::vector<int64_t>{11, 5}));
}

}  // namespace
}  // namespace engine
