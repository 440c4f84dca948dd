// Where pinned pipeline ranks go: the cores of this process's affinity mask (taskset, a
// container's cpuset), not cores 0..n-1 of the machine.
#include "worker/stage_plan.h"

#include <gtest/gtest.h>
#include <sched.h>

namespace {

TEST(StagePlanTest, AllowedCpusFollowTheAffinityMask) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  const std::vector<int> all = worker::allowed_cpus();
  ASSERT_FALSE(all.empty());
  for (int c : all) EXPECT_TRUE(CPU_ISSET(c, &saved)) << c;
  // Restricted to its last allowed core, this thread sees only that one.
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(all.back(), &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const std::vector<int> restricted = worker::allowed_cpus();
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(restricted, std::vector<int>{all.back()});
}

}  // namespace
