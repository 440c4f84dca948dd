// The pull connector (chunkpipe's MooncakeConnectorV1): D pulls the prompt's KV from P.
// PullScheduler, the scheduler side: on P (kv_producer) a request that arrived with
// do_remote_decode and ended length-capped keeps its blocks and answers kv_transfer_params
// naming them; on D (kv_consumer) a request carrying do_remote_prefill gets blocks for its
// prompt and waits (kWaitingForRemoteKvs) while its worker loads them; a D request that never
// got blocks still releases P's (DONE, on the releaser's thread). kv_both does both.
// Requests naming the same remote prompt (the n choices of one request) share it: one pulls,
// the others wait for its load and then find the blocks in the prefix cache. P's blocks are
// released when the last of them gives them up without pulling. A release asked from outside
// (the proxy's, for a client that left) is said only for a remote prompt no request here named;
// one that comes first makes a later request naming it compute its prompt here.
// PullWorker, the worker side: a PullSender on P, a PullReceiver on D (pull_sender.h,
// pull_receiver.h). The scheduler side is single-threaded except release_unscheduled.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sched/kv_connector.h"
#include "transfer/pull_protocol.h"
#include "transfer/pull_receiver.h"
#include "transfer/pull_sender.h"
#include "worker/kv_connector.h"

namespace transfer {

struct PullOptions {
  bool producer = false, consumer = false;
  std::string engine_id;
  std::string host;           // how peers reach this instance (host_ip())
  int side_channel_port = 0;  // kv_port + dp_rank * tp * pp
  int tp_size = 1, pp_size = 1;
  int remote_tp_size = 1, remote_pp_size = 1;  // kv_connector_extra_config.prefill
  int block_size = 16;
  double lease_seconds = 480;           // VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT
  int64_t transfer_timeout_ms = 33064;  // ASCEND_TRANSFER_TIMEOUT
};

// Sends DONE for requests whose blocks a decoder will never read, on its own thread. A
// prefiller with a stage that fails to answer gets no DONE for 10 s, so that it cannot hold up
// the others.
class PullReleaser {
 public:
  PullReleaser();
  ~PullReleaser();
  void release(const PullParams& remote, int default_tp, int default_pp);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::deque<PullParams> queue_;
  std::thread thread_;
};

class PullScheduler : public sched::KvConnectorScheduler {
 public:
  explicit PullScheduler(PullOptions options) : o_(std::move(options)) {}

  void request_added(const sched::Request& request) override;
  std::optional<sched::MatchedTokens> get_num_new_matched_tokens(
      const sched::Request& request, int64_t num_computed_tokens) override;
  void update_state_after_alloc(const sched::Request& request,
                                const std::vector<kv::BlockId>& block_ids,
                                int64_t num_external_tokens) override;
  std::vector<uint8_t> build_connector_meta(const sched::SchedulerOutput& output,
                                            const kv::KvCacheManager& kv) override;
  void update_connector_output(const sched::KvTransferReport& report) override;
  sched::FinishedHandoff request_finished(const sched::Request& request,
                                          const std::vector<kv::BlockId>& block_ids) override;
  void release_unscheduled(const std::string& kv_transfer_params) override;

 private:
  struct Remote {
    PullParams params;
    std::string key;      // the remote prompt: engine, host, port and request id
    std::string prompt;   // prompt_hash of this request's own prompt
    bool pending = true;  // has neither pulled nor given the remote prompt up yet
  };
  struct SharedRemote {     // one remote prompt, over the requests here that name it
    int pending_refs = 0;   // requests naming it that are still pending
    std::string puller;     // the request whose load of it is in flight
    std::string loaded_by;  // the request that loaded it, while it runs: others share its blocks
                            // (the entry is kept until it ends, for choices that come late)
    std::string loaded_prompt;  // prompt_hash of the puller's prompt: only the same one shares
    bool consumed = false;      // pulled or released: P holds it no more
  };
  struct Puller {
    std::string key;
    bool finished = false;  // left while its load was in flight
  };
  // The request's do_remote_prefill params, parsed once; null when it has none.
  Remote* remote_of(const sched::Request& request);
  // Remembers `key` (named here, or released from outside when `outside_release`), and as held
  // by P no more when `consumed`, even if it was known; returns {whether it is new, whether P
  // held it no more before this call}.
  std::pair<bool, bool> remember(const std::string& key, bool outside_release,
                                 bool consumed = false);
  // P holds `key` no more (a DONE or a release went out): a request here that names it later
  // shares a loader's blocks or computes its prompt, and never pulls it.
  void remember_consumed(const std::string& key);
  // The request will not pull: P is released if no other request here still may.
  void give_up(Remote* remote);
  void forget_if_unused(const std::string& key);
  void release(const PullParams& params);

  PullOptions o_;
  std::unordered_map<std::string, Remote> remotes_;       // consumer: requests that pull
  std::unordered_map<std::string, SharedRemote> shared_;  // by Remote::key
  std::unordered_map<std::string, Puller> pullers_;       // by request id, until it finishes
  PullStepMeta next_;                                     // for the next step
  std::unique_ptr<PullReleaser> releaser_;                // made on first use
  std::mutex release_mu_;  // guards releaser_ creation, seen_ and seen_order_
  // Remote prompts named by a request here or released from outside, the newest kSeenLimit:
  // whoever came first owns the release, and one that P holds no more is never pulled.
  std::unordered_map<size_t, bool> seen_;  // a hash of the key -> P holds it no more
  std::deque<size_t> seen_order_;
};

class PullWorker : public worker::KvConnectorWorker {
 public:
  // pp_rank: this worker's pipeline stage (its side-channel port follows from it).
  PullWorker(PullOptions options, int pp_rank) : o_(std::move(options)), pp_rank_(pp_rank) {}

  void register_kv_cache(model::LatentKvCache* cache, int layer_begin, int layer_end) override;
  common::Status init_status() const override { return init_; }
  common::Status start_load_kv(const std::vector<uint8_t>& metadata) override;
  void wait_for_layer_load(int /*layer*/) override {}
  common::Status save_kv_layer(int /*layer*/) override { return {}; }
  common::Status wait_for_save() override { return {}; }
  worker::FinishedTransfers get_finished(const std::vector<std::string>& finished) override;

 private:
  PullOptions o_;
  int pp_rank_;
  common::Status init_;
  std::unique_ptr<PullSender> sender_;
  std::unique_ptr<PullReceiver> receiver_;
};

}  // namespace transfer
