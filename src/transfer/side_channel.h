// The pull connector's side channel over ZeroMQ, as vllm-ascend's Mooncake connector runs it:
// each serving worker binds one ROUTER socket at its handshake port and answers small
// requests (metadata, DONE); readers send them on REQ sockets with 1 s send and receive
// timeouts and 3 tries, closing a socket after any error instead of reusing it. The server is
// driven by its owner's thread; a client object belongs to one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace transfer {

using Bytes = std::vector<uint8_t>;

class SideChannelServer {
 public:
  // Binds tcp://host:port (host "*" for every interface).
  static common::Result<std::unique_ptr<SideChannelServer>> bind(const std::string& host, int port);
  ~SideChannelServer();
  SideChannelServer(const SideChannelServer&) = delete;
  SideChannelServer& operator=(const SideChannelServer&) = delete;

  // Waits up to timeout_ms for a request on the socket or for `extra_fd` (-1: none) to become
  // readable, then answers every queued request with handler(request). Returns whether
  // extra_fd was readable.
  bool serve(int timeout_ms, int extra_fd, const std::function<Bytes(const Bytes&)>& handler);
  const std::string& endpoint() const { return endpoint_; }

 private:
  SideChannelServer() = default;
  void* socket_ = nullptr;
  std::string endpoint_;
};

class SideChannelClient {
 public:
  explicit SideChannelClient(int timeout_ms = 1000, int tries = 3)
      : timeout_ms_(timeout_ms), tries_(tries) {}
  ~SideChannelClient();
  SideChannelClient(const SideChannelClient&) = delete;
  SideChannelClient& operator=(const SideChannelClient&) = delete;

  // Sends `request` to tcp://host:port and returns the reply.
  common::Result<Bytes> call(const std::string& host, int port, const Bytes& request);

 private:
  void* socket_for(const std::string& endpoint);
  void close(const std::string& endpoint);
  int timeout_ms_;
  int tries_;
  std::map<std::string, void*> sockets_;  // pooled REQ sockets by endpoint
};

}  // namespace transfer
