// The body of one pipeline-stage process: loads the stage's layer slice, owns the KV cache of
// those layers and a pinned thread pool, and serves the ring's messages in order (receive from
// the previous rank, compute, send to the next). A receiver thread drains the inbound link into
// a queue so the previous stage never waits for this one to finish its current step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "worker/kv_connector.h"

namespace worker {

// The engine's peer id on the ring (stages are 0..num_stages-1).
constexpr int kDriverPeer = -1;

struct StageSpec {
  std::string model_dir;
  int stage = 0;
  int num_stages = 1;
  int layer_begin = 0, layer_end = 0;
  int threads = 1;
  std::vector<int> cpus;  // pin the stage's threads here (empty: not pinned)
  int64_t num_blocks = 0;
  int block_size = 16;
  bool expanded_kv_cache = false;
  std::string kv_transfer_config;  // --kv-transfer-config JSON (empty: no KV connector)
  int kv_dp_rank = 0;              // --kv-dp-rank: the instance's data-parallel rank
};

inline int upstream_peer(const StageSpec& s) {
  return s.stage == 0 ? kDriverPeer : s.stage - 1;
}
inline int downstream_peer(const StageSpec& s) {
  return s.stage + 1 == s.num_stages ? kDriverPeer : s.stage + 1;
}

// Returns the process exit code: 0 after a shutdown message, 1 when loading fails or a link
// breaks (the peer died), with the reason logged.
// `kv_connector` (may be null) is the stage's side of the KV connector.
int run_stage_worker(const StageSpec& spec, dist::Communicator& comm,
                     std::shared_ptr<KvConnectorWorker> kv_connector = nullptr);

}  // namespace worker
