// Data parallelism for `chunkpipe serve`, as vLLM spells it: the plan the --data-parallel-*
// flags make (internal load balancing with one API server, --headless nodes, or external
// ranks with --data-parallel-rank), the DP groups lock-step ranks join (experts or the lm_head
// split over ranks), and the engine processes a node starts. Single-threaded set-up code.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "cli/arg_parser.h"
#include "common/status.h"
#include "dist/process_group.h"
#include "dist/rendezvous_store.h"

namespace cli {

struct DataParallelPlan {
  int size = 1;
  int size_local = 1;     // engines this node runs (internal load balancing)
  int start_rank = 0;     // this node's first rank
  int rank = -1;          // this process's one rank: an external rank or an internal engine
  bool external = false;  // --data-parallel-rank: each rank is its own API server
  std::string address = "127.0.0.1";  // --data-parallel-address: the head (rank 0's node)
  int rpc_port = 29550;               // --data-parallel-rpc-port
  bool headless = false;              // this node runs engines only
  std::string engine_of;              // internal engine process: the front end's host:port
  bool lockstep = false;              // experts (EP) or the lm_head split over the ranks
  bool expert_parallel = false;
  int lmhead_size = 0;
  bool active() const { return size > 1; }
  bool engine_process() const { return !engine_of.empty(); }
};

// Where this node binds the sockets its DP peers dial (rank 0's store, the front end's rpc
// port): --data-parallel-address when it is a numeric IP (this node's), else every interface.
std::string data_parallel_bind_host(const DataParallelPlan& plan);

// Reads and checks the flags. tp/pp: per rank; lmhead: finegrained_tp_config's size.
common::Status plan_data_parallel(const ArgParser& p, int tensor_parallel_size,
                                  int pipeline_parallel_size, int lmhead_size,
                                  DataParallelPlan* plan);

// The groups of one lock-step rank, over a rendezvous store (served here when `serve_store`).
struct DataParallelGroups {
  std::unique_ptr<dist::StoreServer> store;
  std::unique_ptr<dist::ProcessGroup> dp;      // every rank (the experts' all-to-all)
  std::unique_ptr<dist::ProcessGroup> lmhead;  // this rank's lm_head group (null: none)
};
common::Result<DataParallelGroups> join_data_parallel_groups(const DataParallelPlan& plan,
                                                             const std::string& store_host,
                                                             int store_port, bool serve_store);

// Starts this node's engine processes: `chunkpipe serve ARGS --data-parallel-rank r
// --dp-engine-of FRONT`, for r in [start_rank, start_rank + size_local).
struct LocalEngines {
  std::vector<pid_t> pids;
  std::vector<int> ranks;
};
common::Result<LocalEngines> spawn_local_engines(const std::vector<std::string>& serve_args,
                                                 const DataParallelPlan& plan,
                                                 const std::string& front_end);

}  // namespace cli
