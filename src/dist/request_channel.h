// Request/reply over ZeroMQ, as vllm-ascend's Mooncake side channel runs it: a server binds one
// ROUTER socket and answers small requests; clients send them on REQ sockets with send and
// receive timeouts and a few tries, closing a socket after any error instead of reusing it.
// Used by the KV pull connector (metadata, DONE) and the collectives' rendezvous store.
// Thread-safety: a server is driven by its owner's thread; a client object belongs to one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace dist {

using Bytes = std::vector<uint8_t>;

class RequestServer {
 public:
  // Binds tcp://host:port (host "*" for every interface; port 0: one the kernel picks);
  // `what` names the socket in errors ("the KV side channel").
  static common::Result<std::unique_ptr<RequestServer>> bind(const std::string& host, int port,
                                                             const std::string& what);
  ~RequestServer();
  RequestServer(const RequestServer&) = delete;
  RequestServer& operator=(const RequestServer&) = delete;

  // Waits up to timeout_ms for a request on the socket or for `extra_fd` (-1: none) to become
  // readable, then answers every queued request with handler(request). Returns whether
  // extra_fd was readable.
  bool serve(int timeout_ms, int extra_fd, const std::function<Bytes(const Bytes&)>& handler);
  const std::string& endpoint() const { return endpoint_; }
  int port() const { return port_; }

 private:
  RequestServer() = default;
  void* socket_ = nullptr;
  std::string endpoint_;
  int port_ = 0;
};

class RequestClient {
 public:
  explicit RequestClient(int timeout_ms = 1000, int tries = 3)
      : timeout_ms_(timeout_ms), tries_(tries) {}
  ~RequestClient();
  RequestClient(const RequestClient&) = delete;
  RequestClient& operator=(const RequestClient&) = delete;

  // Sends `request` to tcp://host:port and returns the reply.
  common::Result<Bytes> call(const std::string& host, int port, const Bytes& request);

 private:
  void* socket_for(const std::string& endpoint);
  void close(const std::string& endpoint);
  int timeout_ms_;
  int tries_;
  std::map<std::string, void*> sockets_;  // pooled REQ sockets by endpoint
};

}  // namespace dist
