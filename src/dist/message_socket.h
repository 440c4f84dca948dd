// Message streams over ZeroMQ ROUTER / DEALER, for a front end that talks to engines in other
// processes (data parallelism): the front end binds a RouterSocket, every engine connects a
// DealerSocket whose identity names it. Messages are whole byte strings, in order per peer.
// Sends never block: a message for a peer that is not connected fails. Thread-safety: a socket
// belongs to the one thread that drives it (poll and send).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace dist {

class RouterSocket {
 public:
  // Binds tcp://host:port ("*": every interface; port 0: a free one). `what` names it in errors.
  static common::Result<std::unique_ptr<RouterSocket>> bind(const std::string& host, int port,
                                                            const std::string& what);
  ~RouterSocket();
  RouterSocket(const RouterSocket&) = delete;
  RouterSocket& operator=(const RouterSocket&) = delete;
  int port() const { return port_; }

  common::Status send(const std::string& peer, const std::vector<uint8_t>& message);
  // Waits up to timeout_ms for messages or for extra_fd (-1: none) to become readable, then
  // hands every queued message to handler(peer, message). Returns whether extra_fd was readable.
  bool poll(int timeout_ms, int extra_fd,
            const std::function<void(const std::string&, const std::vector<uint8_t>&)>& handler);

 private:
  RouterSocket() = default;
  void* socket_ = nullptr;
  int port_ = 0;
};

class DealerSocket {
 public:
  // Connects to tcp://host:port as `identity` (connection is asynchronous; messages wait).
  static common::Result<std::unique_ptr<DealerSocket>> connect(const std::string& host, int port,
                                                               const std::string& identity);
  ~DealerSocket();
  DealerSocket(const DealerSocket&) = delete;
  DealerSocket& operator=(const DealerSocket&) = delete;

  common::Status send(const std::vector<uint8_t>& message);
  // As RouterSocket::poll, for the messages of the one peer.
  bool poll(int timeout_ms, int extra_fd,
            const std::function<void(const std::vector<uint8_t>&)>& handler);

 private:
  DealerSocket() = default;
  void* socket_ = nullptr;
};

}  // namespace dist
