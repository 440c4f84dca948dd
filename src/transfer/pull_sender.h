// PullSender: a prefill worker's half of the pull connector. It registers the worker's KV
// layers with UCX, binds the worker's side-channel port, and on its own thread answers GET_META
// (where the blocks live) and DONE (a decoder has read them), while keeping UCX progressing so
// that decoders' reads complete. Each request's blocks are leased: a DONE or the lease's
// expiry (VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT) hands them back, once. A DONE that arrives after
// that (expiry, or a release by someone else) is answered kExpired, so a decoder never trusts a
// read of blocks that may have been reused. Thread-safe: lease calls come from the compute thread,
// DONE from the server thread.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "dist/request_channel.h"
#include "model/kv_cache.h"
#include "sched/scheduler_output.h"
#include "transfer/lease_book.h"
#include "transfer/pull_protocol.h"
#include "transfer/ucx_transport.h"

namespace transfer {

struct PullSenderOptions {
  std::string engine_id;
  std::string bind_host = "*";
  int port = 0;                // this worker's handshake port
  double lease_seconds = 480;  // VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT
};

class PullSender {
 public:
  // Registers layers [layer_begin, layer_end) of `cache`, binds the port and starts serving.
  static common::Result<std::unique_ptr<PullSender>> start(PullSenderOptions options,
                                                           model::LatentKvCache* cache,
                                                           int layer_begin, int layer_end);
  ~PullSender();

  // Requests whose blocks now wait for a DONE (a DONE that came first ends them at once).
  void add_leases(const std::vector<std::string>& request_ids);
  // Leases ended since the last call (DONE or expiry), and this worker's counters.
  void take_finished(std::vector<std::string>* finished, sched::KvTransferStats* stats);
  int port() const { return options_.port; }

 private:
  explicit PullSender(PullSenderOptions options)
      : options_(std::move(options)), leases_(options_.lease_seconds) {}
  void serve_loop();
  Bytes handle(const Bytes& request);

  PullSenderOptions options_;
  Bytes metadata_;  // the GET_META answer
  std::unique_ptr<UcxTransport> ucx_;
  std::unique_ptr<dist::RequestServer> server_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  std::mutex mu_;  // guards everything below
  LeaseBook leases_;
  int64_t leases_expired_ = 0;
  int64_t late_releases_ = 0;
};

}  // namespace transfer
