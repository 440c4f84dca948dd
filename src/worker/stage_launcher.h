// Where pipeline stages run and how they are wired: stages are split over --nnodes hosts in
// contiguous blocks; the ring's links (engine -> stage 0 -> ... -> last -> engine) are shared-
// memory pipes between ranks on one host and TCP links (ZeroMQ) between hosts, on
// master_port + link index, bound on node 0 (whose address, --master-addr, everyone knows).
// launch_local_stages starts this node's stages as processes of this binary.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "dist/communicator.h"
#include "dist/rendezvous_store.h"
#include "dist/shm_pipe.h"
#include "worker/stage_worker.h"

namespace worker {

struct PipelineTopology {
  int num_stages = 1;
  int tp_size = 1;  // processes per stage; rank (stage s, tp rank r) is s·tp_size + r
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

common::Status validate_topology(const PipelineTopology& t);
// Ranks are split over the nodes in contiguous blocks; a stage lives where its TP rank 0 is.
int node_of_rank(const PipelineTopology& t, int stage, int tp_rank);
int node_of_stage(const PipelineTopology& t, int stage);
// Where the TP groups' rendezvous store listens with --nnodes > 1 (node 0 serves it).
int store_port(const PipelineTopology& t);

// This node's stage processes, and (on node 0) the engine's ends of the ring.
struct LocalStages {
  std::vector<pid_t> pids;
  std::vector<int> stages;                   // stages[i] runs in pids[i]
  std::vector<int> tp_ranks;                 // as its tensor-parallel rank tp_ranks[i]
  std::unique_ptr<dist::StoreServer> store;  // the TP groups' rendezvous (tp > 1)
  std::vector<dist::ShmPipe> pipes;          // links between two local stages (kept to close them)
  std::unique_ptr<dist::Link> driver_send, driver_recv;  // node 0: to stage 0, from the last
  // Closes every link this node holds, so that blocked ranks wake up and fail.
  void close_all();
};

// Watches this node's stage processes (the engine's node and --headless nodes alike): reaps
// each one that exits and says which failed. Thread-safe.
class StageMonitor {
 public:
  explicit StageMonitor(const LocalStages& stages) : stages_(stages), reaped_(stages.pids.size()) {}
  // Reaps the stages that exited since the last call; the first that did not exit with status
  // 0 comes back as "pipeline stage S (pid P) <how>".
  std::optional<std::string> poll();
  bool all_exited() const;
  // SIGKILLs and reaps every stage still running.
  void kill_remaining();

 private:
  const LocalStages& stages_;
  mutable std::mutex mu_;
  std::vector<bool> reaped_;
};

// specs[s] describes stage s (all stages; only this node's are started).
common::Result<LocalStages> launch_local_stages(const std::vector<StageSpec>& specs,
                                                const PipelineTopology& topology,
                                                const std::string& worker_binary);

// The stage process's command line: `pp-stage` arguments, and their parser. A link is
// "shm:FD", "tcp-bind:ENDPOINT" or "tcp-connect:ENDPOINT".
std::vector<std::string> stage_worker_args(const StageSpec& spec, const std::string& recv_link,
                                           const std::string& send_link);
struct StageWorkerArgs {
  StageSpec spec;
  std::string recv_link, send_link;
};
common::Result<StageWorkerArgs> parse_stage_worker_args(const std::vector<std::string>& args);
common::Result<std::unique_ptr<dist::Link>> open_link(const std::string& link, bool sending,
                                                      const std::string& what);

}  // namespace worker
