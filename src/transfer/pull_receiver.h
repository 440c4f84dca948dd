// PullReceiver: a decoder worker's half of the pull connector. Loads run on its own thread, one
// at a time in arrival order: for each prefill pipeline stage behind the request's remote port,
// fetch the stage's metadata (cached per peer, dropped after any failure), read the request's
// blocks of the layers this worker and that stage share with one-sided UCX reads, then always
// send DONE, even after a failure, so P frees the blocks. A load fails (never half-succeeds)
// on any error, timeout (ASCEND_TRANSFER_TIMEOUT) or expired lease. Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "dist/request_channel.h"
#include "model/kv_cache.h"
#include "sched/scheduler_output.h"
#include "transfer/pull_protocol.h"
#include "transfer/ucx_transport.h"

namespace transfer {

struct PullReceiverOptions {
  int64_t transfer_timeout_ms = 33064;  // ASCEND_TRANSFER_TIMEOUT
  int default_remote_tp = 1;            // kv_connector_extra_config.prefill, when P sends none
  int default_remote_pp = 1;
};

class PullReceiver {
 public:
  PullReceiver(PullReceiverOptions options, model::LatentKvCache* cache, int layer_begin,
               int layer_end);
  ~PullReceiver();

  void enqueue(std::vector<RecvTask> tasks);
  // Loads that ended since the last call, and the counters.
  void take_finished(sched::KvTransferReport* report);

 private:
  void loop();
  // Reads every block of `task`; an error names the peer.
  common::Status load(const RecvTask& task, int64_t* bytes);
  common::Result<const AgentMetadata*> metadata(const std::string& host, int port);

  PullReceiverOptions options_;
  model::LatentKvCache* cache_;
  int layer_begin_, layer_end_;
  // Thread-owned: UCX (single-thread mode), side-channel sockets, the metadata cache.
  std::unique_ptr<UcxTransport> ucx_;
  std::unique_ptr<dist::RequestClient> side_;
  std::map<std::pair<std::string, int>, AgentMetadata> peers_;
  std::thread thread_;

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  bool stopping_ = false;
  std::deque<RecvTask> queue_;
  int64_t busy_ = 0;  // loads dequeued and not yet reported
  sched::KvTransferReport done_;
};

}  // namespace transfer
