// The rendezvous store: a small key-value store where the ranks of a job meet before their
// collectives connect (gloo's full-mesh handshake, the name of a shared-memory segment, which
// host each rank is on). Rank 0 serves it at --master-addr:--master-port on its own thread;
// every rank, rank 0 included, is a client. Keys are written once and never deleted.
// Thread-safety: the server is internally synchronised; a client belongs to one thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "dist/request_channel.h"

namespace dist {

class StoreServer {
 public:
  // Binds tcp://host:port ("*" for every interface; port 0: a free one) and serves until
  // destroyed.
  static common::Result<std::unique_ptr<StoreServer>> start(const std::string& host, int port);
  int port() const { return server_->port(); }
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

 private:
  StoreServer() = default;
  Bytes handle(const Bytes& request);
  std::unique_ptr<RequestServer> server_;
  std::map<std::string, Bytes> values_;  // touched only by the serving thread
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

class StoreClient {
 public:
  // timeout_s bounds every wait for a key (and the first contact with the server).
  StoreClient(std::string host, int port, double timeout_s);
  common::Status set(const std::string& key, const Bytes& value);
  // Waits until the key is set, up to the timeout.
  common::Result<Bytes> get(const std::string& key);
  double timeout_s() const { return timeout_s_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }

 private:
  common::Result<Bytes> call(const Bytes& request);
  std::string host_;
  int port_;
  double timeout_s_;
  RequestClient client_;
};

}  // namespace dist
