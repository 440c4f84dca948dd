// DpEngineClient: the API server's EngineClient for data parallelism with internal load
// balancing (vLLM's DPLBAsyncMPClient). N engine processes, local or --headless, connect to
// --data-parallel-rpc-port; each request goes to the least loaded live engine (dp_balance.h).
// One I/O thread owns the socket; public methods are thread-safe. A dead or silent engine fails
// its own requests and the others keep serving, unless the ranks step in lock step (expert
// parallelism), where one dead rank ends the group.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dist/message_socket.h"
#include "engine/dp_protocol.h"
#include "engine/engine_client.h"

namespace engine {

struct DpClientOptions {
  int dp_size = 1;
  std::string bind_host = "*";
  int rpc_port = 0;       // 0: a free port (tests)
  dp::Welcome welcome;    // what every engine is told (its store address)
  bool lockstep = false;  // one dead engine fails every engine
  double heartbeat_timeout_s = 10;
  // Called once, from the I/O thread, when no engine is left to serve (or the lock-step group
  // broke).
  std::function<void(const std::string&)> on_fatal;
};

class DpEngineClient : public EngineClient {
 public:
  static common::Result<std::unique_ptr<DpEngineClient>> start(DpClientOptions options);
  ~DpEngineClient() override;
  DpEngineClient(const DpEngineClient&) = delete;
  DpEngineClient& operator=(const DpEngineClient&) = delete;
  int port() const { return socket_port_; }

  // Blocks until every engine said READY; an error names the ranks still missing.
  common::Status wait_ready(double timeout_s);
  // An engine process known to have ended (a local child reaped by the launcher).
  void engine_died(int rank, const std::string& why);
  // Tells every engine to stop, then stops the I/O thread. Idempotent.
  void shutdown();

  void add_request(EngineRequest request, OutputCallback callback) override;
  void abort_request(const std::string& request_id) override;
  MetricsSnapshot metrics() const override;  // the engines' sum
  std::vector<EngineMetrics> engine_metrics() const override;
  bool is_healthy() const override;
  void release_kv_transfer(const std::string& kv_transfer_params) override;

 private:
  struct Engine {
    std::string peer;  // the socket identity ("" until HELLO)
    bool ready = false, dead = false;
    double last_seen = 0;
    MetricsSnapshot stats;
    int64_t unfinished = 0;  // this front end's requests not yet finished there
  };
  struct Pending {
    int engine = 0;
    OutputCallback callback;
    std::string kv_transfer_params;  // a PD request's: its choices share one engine
  };
  explicit DpEngineClient(DpClientOptions options) : options_(std::move(options)) {}
  void io_loop();
  void on_message(const std::string& peer, const std::vector<uint8_t>& bytes);
  // Queues a message for the I/O thread (any thread).
  void post(int engine, std::vector<uint8_t> message);
  // Marks an engine dead and fails its requests; mu_ must not be held.
  void mark_dead(int engine, const std::string& why);
  int pick_engine();                             // mu_ held; -1 when none is alive
  int engine_for(const EngineRequest& request);  // mu_ held; pick_engine but for PD choices
  void forget_pd_engine(const Pending& p);       // mu_ held; p leaves pending_

  DpClientOptions options_;
  std::unique_ptr<dist::RouterSocket> socket_;
  int socket_port_ = 0;
  int wake_fd_ = -1;
  mutable std::mutex mu_;
  std::vector<Engine> engines_;
  std::unordered_map<std::string, Pending> pending_;
  std::unordered_map<std::string, int> rank_of_peer_;  // socket identity -> rank (every message)
  std::vector<std::pair<int, std::vector<uint8_t>>> outbox_;
  bool fatal_reported_ = false;
  // A PD request's kv_transfer_params -> (its engine, its pending choices there).
  std::unordered_map<std::string, std::pair<int, int>> pd_engines_;
  // The engines of the newest finished PD requests, by a hash of their params: a proxy's late
  // release goes to the engine that remembers it said DONE (transfer/pull_connector.h).
  std::unordered_map<size_t, int> finished_pd_engines_;
  std::deque<size_t> finished_pd_order_;
  size_t next_first_ = 0;  // where pick_engine's next scan starts
  std::atomic<bool> stopping_{false};
  std::thread io_;
};

}  // namespace engine
