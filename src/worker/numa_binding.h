// NUMA placement of one host's ranks (--numa-bind): one rank per node, or an equal share of a
// node's cores per rank; each rank's threads on those cores and its memory (weights, KV cache,
// scratch) on that node. The plan is a pure function of the topology; applying it binds the
// calling process (libnuma), before it allocates what it loads. Thread-safe except apply.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace worker {

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;  // the node's cores this process may run on
};

// The host's nodes that have allowed cores, from `sys_root` (/sys/devices/system/node), their
// cpulists intersected with `allowed_cpus`. A machine without that directory is one node 0.
std::vector<NumaNode> read_numa_topology(const std::vector<int>& allowed_cpus,
                                         const std::string& sys_root = "/sys/devices/system/node");

struct NumaBinding {
  int node = -1;
  std::vector<int> cpus;  // threads_per_rank cores of `node`, disjoint between ranks
};

// Rank k of `ranks` on this host: node k / (ranks / nodes), and the (k mod ranks/nodes)-th
// equal share of its cores. Errors name the numbers and the flag: ranks that do not divide over
// the nodes, or a share of cores smaller than threads_per_rank.
common::Result<std::vector<NumaBinding>> plan_numa_binding(const std::vector<NumaNode>& topology,
                                                           int ranks, int threads_per_rank);

// Binds the calling process: CPU affinity to b.cpus, and memory allocation to node b.node
// (MPOL_BIND), so pages it touches from now on are on that node. Threads started later inherit
// both.
common::Status apply_numa_binding(const NumaBinding& b);

// "node 0, cores 0-15": for the logs.
std::string binding_text(const NumaBinding& b);

}  // namespace worker
