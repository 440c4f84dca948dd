// --numa-bind's plan on made-up two- and four-node topologies (one rank per node, shares of a
// node, errors that name the numbers), the topology read from a made-up /sys tree, and, on this
// machine, a bound child process: its affinity and its new pages' policy in /proc/self/numa_maps.
#include "worker/numa_binding.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "worker/stage_plan.h"

namespace {

std::vector<worker::NumaNode> nodes(int count, int cores_each) {
  std::vector<worker::NumaNode> t;
  for (int n = 0; n < count; ++n) {
    worker::NumaNode node{n, {}};
    for (int c = 0; c < cores_each; ++c) node.cpus.push_back(n * cores_each + c);
    t.push_back(node);
  }
  return t;
}

TEST(NumaBindingTest, OneRankPerNodeOfTwoAndFourNodes) {
  for (int count : {2, 4}) {
    auto plan = worker::plan_numa_binding(nodes(count, 8), count, 8);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    ASSERT_EQ(int(plan->size()), count);
    for (int k = 0; k < count; ++k) {
      EXPECT_EQ((*plan)[size_t(k)].node, k);
      ASSERT_EQ((*plan)[size_t(k)].cpus.size(), 8u);
      EXPECT_EQ((*plan)[size_t(k)].cpus.front(), 8 * k);
      EXPECT_EQ((*plan)[size_t(k)].cpus.back(), 8 * k + 7);
    }
  }
  EXPECT_EQ(worker::binding_text((*worker::plan_numa_binding(nodes(2, 8), 2, 4))[1]),
            "node 1, cores 8-11");
}

TEST(NumaBindingTest, SeveralRanksShareANodesCoresDisjointly) {
  // Four ranks over two nodes of 8 cores: two per node, 4 cores each, 3 threads used.
  auto plan = worker::plan_numa_binding(nodes(2, 8), 4, 3);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const std::vector<std::pair<int, int>> want = {{0, 0}, {0, 4}, {1, 8}, {1, 12}};
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ((*plan)[k].node, want[k].first);
    EXPECT_EQ((*plan)[k].cpus,
              std::vector<int>({want[k].second, want[k].second + 1, want[k].second + 2}));
  }
}

TEST(NumaBindingTest, PlansThatCannotHoldAreRefusedWithTheNumbers) {
  const std::string uneven = worker::plan_numa_binding(nodes(4, 8), 6, 1).status().message();
  for (const char* part : {"6 rank(s)", "4 nodes", "multiple of 4", "--tensor-parallel-size"})
    EXPECT_NE(uneven.find(part), std::string::npos) << part << " in: " << uneven;
  const std::string fewer = worker::plan_numa_binding(nodes(2, 8), 1, 1).status().message();
  EXPECT_NE(fewer.find("multiple of 2"), std::string::npos) << fewer;
  const std::string cores = worker::plan_numa_binding(nodes(2, 8), 4, 6).status().message();
  for (const char* part : {"node 0 has 8 usable core(s)", "4 each", "6 threads", "--threads to 4"})
    EXPECT_NE(cores.find(part), std::string::npos) << part << " in: " << cores;
}

TEST(NumaBindingTest, TopologyIsReadFromSysAndLimitedToTheAllowedCores) {
  char tmpl[] = "/tmp/chunkpipe_numa_XXXXXX";
  const std::filesystem::path root = mkdtemp(tmpl);
  const std::vector<std::pair<std::string, std::string>> lists = {
      {"node0", "0-3,8-11"}, {"node1", "4-7,12-15"}, {"node2", ""}};  // node2: memory only
  for (const auto& [name, list] : lists) {
    std::filesystem::create_directories(root / name);
    std::ofstream(root / name / "cpulist") << list << "\n";
  }
  std::filesystem::create_directories(root / "power");  // not a node
  const auto topo = worker::read_numa_topology({0, 1, 2, 3, 4, 5, 6, 7, 8, 12}, root.string());
  ASSERT_EQ(topo.size(), 2u);
  EXPECT_EQ(topo[0].id, 0);
  EXPECT_EQ(topo[0].cpus, std::vector<int>({0, 1, 2, 3, 8}));
  EXPECT_EQ(topo[1].id, 1);
  EXPECT_EQ(topo[1].cpus, std::vector<int>({4, 5, 6, 7, 12}));
  const auto none = worker::read_numa_topology({0, 1}, (root / "absent").string());
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].cpus, std::vector<int>({0, 1}));
  std::filesystem::remove_all(root);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// In a child (binding is process-wide): bind to this machine's first node and its first core,
// then check the affinity, and that a fresh mapping's pages carry the node's bind policy.
TEST(NumaBindingTest, ABoundProcessRunsOnItsCoresAndAllocatesOnItsNode) {
  const auto topo = worker::read_numa_topology(worker::allowed_cpus());
  auto plan = worker::plan_numa_binding({topo[0]}, 1, 1);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const worker::NumaBinding b = (*plan)[0];
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    std::string report;
    if (auto st = worker::apply_numa_binding(b); !st.ok()) {
      report = "apply: " + st.message();
    } else {
      cpu_set_t set;
      CPU_ZERO(&set);
      sched_getaffinity(0, sizeof(set), &set);
      report = "cpus " + std::to_string(CPU_COUNT(&set)) + " first " +
               std::to_string(CPU_ISSET(b.cpus[0], &set)) + "\n";
      const size_t bytes = size_t{8} << 20;
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      std::memset(p, 1, bytes);
      char addr[32];
      std::snprintf(addr, sizeof(addr), "%lx ", reinterpret_cast<unsigned long>(p));
      std::stringstream maps(read_file("/proc/self/numa_maps"));
      for (std::string line; std::getline(maps, line);)
        if (line.rfind(addr, 0) == 0) report += line;
    }
    if (write(fds[1], report.data(), report.size()) < 0) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) report.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << report;
  EXPECT_NE(report.find("cpus 1 first 1"), std::string::npos) << report;
  // numa_maps: "<addr> bind:0 anon=2048 dirty=2048 ... N0=2048" (or "prefer" on a kernel
  // without NUMA, where apply binds only the cores).
  const std::string node = std::to_string(b.node);
  EXPECT_NE(report.find("bind:" + node), std::string::npos) << report;
  EXPECT_NE(report.find(" N" + node + "="), std::string::npos) << report;
}

}  // namespace
