// Reads /sys's node cpulists, splits them between ranks, and binds with sched_setaffinity and
// libnuma's numa_set_membind (Debian's libnuma: the kernel's set_mempolicy with a node mask).
#include "worker/numa_binding.h"

#include <numa.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace worker {
namespace {

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}; malformed parts are skipped.
std::vector<int> parse_cpulist(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    int a = 0, b = 0;
    char dash = 0;
    std::stringstream p(part);
    if (!(p >> a)) continue;
    if (p >> dash && dash == '-' && p >> b) {
      for (int c = a; c <= b && c - a < 1 << 16; ++c) cpus.push_back(c);
    } else {
      cpus.push_back(a);
    }
  }
  return cpus;
}

std::string ranges_text(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]) +
           (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  return out;
}

}  // namespace

std::vector<NumaNode> read_numa_topology(const std::vector<int>& allowed_cpus,
                                         const std::string& sys_root) {
  const std::set<int> allowed(allowed_cpus.begin(), allowed_cpus.end());
  std::vector<NumaNode> nodes;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(sys_root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 ||
        name.find_first_not_of("0123456789", 4) != std::string::npos)
      continue;
    std::ifstream f(e.path() / "cpulist");
    std::string text;
    std::getline(f, text);
    NumaNode n;
    n.id = std::stoi(name.substr(4));
    for (int c : parse_cpulist(text))
      if (allowed.count(c)) n.cpus.push_back(c);
    if (!n.cpus.empty()) nodes.push_back(std::move(n));
  }
  if (nodes.empty()) nodes.push_back({0, allowed_cpus});
  std::sort(nodes.begin(), nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  return nodes;
}

common::Result<std::vector<NumaBinding>> plan_numa_binding(const std::vector<NumaNode>& topology,
                                                           int ranks, int threads_per_rank) {
  const int nodes = static_cast<int>(topology.size());
  if (nodes == 0 || ranks < 1 || threads_per_rank < 1)
    return common::invalid_argument("--numa-bind: no NUMA node with usable cores");
  if (ranks % nodes != 0) {
    return common::invalid_argument(
        "--numa-bind places the ranks evenly over this host's NUMA nodes, but its " +
        std::to_string(ranks) +
        " rank(s) (pipeline stages x --tensor-parallel-size on this host) "
        "do not divide over its " +
        std::to_string(nodes) + " nodes: use a multiple of " + std::to_string(nodes) +
        " ranks, or leave --numa-bind out");
  }
  const int per_node = ranks / nodes;
  std::vector<NumaBinding> plan;
  for (int k = 0; k < ranks; ++k) {
    const NumaNode& n = topology[size_t(k / per_node)];
    const int share = static_cast<int>(n.cpus.size()) / per_node;
    if (share < threads_per_rank) {
      return common::invalid_argument(
          "--numa-bind: node " + std::to_string(n.id) + " has " + std::to_string(n.cpus.size()) +
          " usable core(s) for " + std::to_string(per_node) + " rank(s), " + std::to_string(share) +
          " each, fewer than the " + std::to_string(threads_per_rank) +
          " threads per rank: lower --threads to " + std::to_string(std::max(share, 1)) +
          (share == 0 ? " and use fewer ranks per node" : ""));
    }
    NumaBinding b;
    b.node = n.id;
    const int first = (k % per_node) * share;
    b.cpus.assign(n.cpus.begin() + first, n.cpus.begin() + first + threads_per_rank);
    plan.push_back(std::move(b));
  }
  return plan;
}

common::Status apply_numa_binding(const NumaBinding& b) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : b.cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return common::unavailable("--numa-bind: sched_setaffinity(" + ranges_text(b.cpus) +
                               ") failed: " + std::strerror(errno));
  }
  if (numa_available() < 0) return {};  // a kernel without NUMA support: one node, nothing to bind
  if (b.node > numa_max_node()) {
    return common::invalid_argument("--numa-bind: node " + std::to_string(b.node) +
                                    " is past this host's last node " +
                                    std::to_string(numa_max_node()));
  }
  bitmask* mask = numa_allocate_nodemask();
  numa_bitmask_setbit(mask, static_cast<unsigned>(b.node));
  errno = 0;
  numa_set_membind(mask);
  const int err = errno;
  numa_free_nodemask(mask);
  if (err != 0) {
    return common::unavailable("--numa-bind: binding memory to node " + std::to_string(b.node) +
                               " failed: " + std::strerror(err));
  }
  return {};
}

std::string binding_text(const NumaBinding& b) {
  return "node " + std::to_string(b.node) + ", cores " + ranges_text(b.cpus);
}

}  // namespace worker
