// PdProxy: chunkpipe's PD load-balancing proxy, the counterpart of vllm-ascend's
// load_balance_proxy_server_example.py with the same flags, endpoints, balancing and retries.
// Each completion goes to the least-loaded prefill instance with max_tokens 1 and
// kv_transfer_params {do_remote_decode: true}, then, with P's kv_transfer_params, to the
// least-loaded decoder, whose answer or stream is relayed one SSE event per HTTP chunk. Where
// upstream fails it does better: a decoder's error reaches the client with its status, load
// is released on every path (cancelled streams included), a client that leaves between the
// legs has P's blocks released through a decoder, and a request the decoder hands back
// (stop_reason "recomputed") is re-prefilled elsewhere from its exact token ids. Each proxied
// request runs on its own thread; the HTTP transport is server::HttpServer. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "proxy/instance_registry.h"
#include "server/http_server.h"

namespace proxy {

struct ProxyOptions {
  std::string host = "localhost";
  int port = 8000;
  std::vector<InstanceInfo> prefillers, decoders;
  int max_retries = 3;
  double retry_delay = 0.001;  // seconds; attempt n waits retry_delay * 2^(n-1)
  int max_waiting_retries = 3;
  double waiting_retry_interval = 10;  // seconds between probes of an added instance
  std::string api_key;                 // OPENAI_API_KEY; upstream sends "Bearer None" when unset
  double shutdown_drain_timeout = 3;   // seconds stop() lets running requests finish
};

class PdProxy {
 public:
  explicit PdProxy(ProxyOptions options);
  ~PdProxy();
  common::Status bind();
  int port() const;
  // Serves until stop(); returns once the in-flight requests have ended.
  void run();
  // Thread-safe. Stops accepting, lets running requests finish for shutdown_drain_timeout, then
  // cancels the rest: their clients get an error (a stream: an error event and [DONE]).
  void stop();

  InstanceRegistry& registry() { return registry_; }

 private:
  void handle(const std::shared_ptr<server::HttpExchange>& ex);
  void generate(const std::shared_ptr<server::HttpExchange>& ex, bool chat);
  void models(const std::shared_ptr<server::HttpExchange>& ex);
  void reset_prefix_cache(const std::shared_ptr<server::HttpExchange>& ex);
  void instances(const std::shared_ptr<server::HttpExchange>& ex, bool add);
  // Runs fn on a thread of its own, counted so that run() can wait for it. An exception (a bug)
  // ends `ex`, when given, with a 500 (or an error event, once streaming) and is logged; a
  // thread that cannot start (out of threads or memory) ends it with a 503 and returns false.
  bool spawn(std::function<void()> fn, std::shared_ptr<server::HttpExchange> ex = nullptr);
  std::vector<std::string> backend_headers(const std::string& request_id) const;

  ProxyOptions o_;
  InstanceRegistry registry_;
  std::unique_ptr<server::HttpServer> http_;
  std::atomic<bool> draining_{false};  // stop() began: new requests are refused
  std::atomic<bool> stopping_{false};  // the drain is over: backend calls are cancelled
  // Joins the threads that have ended. Called before each spawn and at the end of run().
  void join_ended_threads();

  std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;  // spawned threads still running
  // Request threads are joined, never detached: a thread that is still unwinding (its
  // thread-locals, libcurl's and OpenSSL's among them) when the process exits leaks them.
  std::list<std::thread> threads_;
  std::vector<std::list<std::thread>::iterator> ended_;  // in threads_, done, not yet joined
};

}  // namespace proxy
