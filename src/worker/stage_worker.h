// The body of one pipeline-stage process: loads its layer slice, owns their KV cache and a pinned
// thread pool, and serves the ring's messages in order; a receiver thread queues inbound ones so
// the previous stage never waits. With TP the stage is several processes: rank 0 is on the ring
// and broadcasts each message to the others, all compute their shard, only rank 0 answers. With
// experts over data-parallel ranks every rank also joins the DP x TP expert group.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "model/tensor_parallel.h"
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
  // --numa-bind: this rank's NUMA node (its memory is bound there before it loads, its threads
  // run on `cpus` of it); -1: not bound. The plan sets 0 to ask; the launcher picks the node.
  int numa_node = -1;
  int64_t num_blocks = 0;
  int block_size = 16;
  bool expanded_kv_cache = false;
  int num_speculative_tokens = 0;  // the last stage drafts with the MTP layers (0: off)
  bool lm_head_int8 = false;       // model::LoadOptions::lm_head_int8
  bool bf16_activations = false;   // kernels::ActivationPrecision::kBf16 (serve's --dtype)
  bool bf16_kv_cache = false;      // model::KvCacheDtype::kBf16 (serve's --kv-cache-dtype)
  std::string kv_transfer_config;  // --kv-transfer-config JSON (empty: no KV connector)
  int kv_dp_rank = 0;              // --kv-dp-rank: the instance's data-parallel rank
  // Tensor parallelism inside the stage: tp_size processes, rank 0 on the ring, the others
  // fed by it over the stage's process group (which meets in the store at `store`).
  int tp_rank = 0;
  int tp_size = 1;
  bool expert_parallel = false;
  std::string store;  // "HOST:PORT" of the rendezvous store (tp_size > 1)
  // Experts over data-parallel ranks (model::DataParallelExperts, expert_parallel set): the
  // instance is DP rank experts_dp_rank of experts_dp_size (1: off), and every rank of every
  // stage joins the DP x TP expert group in the DP group's store `experts_store` (HOST:PORT).
  // The DP ranks then step in lock step, so the runner keeps a dummy block.
  int experts_dp_rank = 0;
  int experts_dp_size = 1;
  std::string experts_store;
};

// This rank's place in the DP x TP expert group (vLLM's order: DP-major).
inline model::DataParallelExperts expert_group_rank(const StageSpec& s) {
  if (s.experts_dp_size <= 1) return {};
  return {s.experts_dp_rank * s.tp_size + s.tp_rank, s.experts_dp_size * s.tp_size};
}

inline int upstream_peer(const StageSpec& s) {
  return s.stage == 0 ? kDriverPeer : s.stage - 1;
}
inline int downstream_peer(const StageSpec& s) {
  return s.stage + 1 == s.num_stages ? kDriverPeer : s.stage + 1;
}

// Returns the process exit code: 0 after a shutdown message, 1 when loading fails, a link
// breaks or a collective of the stage's group fails (a peer died), with the reason logged.
// `kv_connector` (may be null) is the stage's side of the KV connector.
int run_stage_worker(const StageSpec& spec, dist::Communicator& comm,
                     std::shared_ptr<KvConnectorWorker> kv_connector = nullptr);

}  // namespace worker
