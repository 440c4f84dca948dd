// PeerLiveness over plain sockets: the connections carry only the dialing rank's number, once.
// Hand-written because no library here offers "tell me when this peer's process is gone"
// without a protocol on top (ZeroMQ hides disconnects behind reconnection).
#include "dist/peer_liveness.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

namespace dist {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// Waits up to timeout_s for fd to become readable (or writable). Returns false on timeout.
bool wait_fd(int fd, short events, double timeout_s) {
  pollfd p{fd, events, 0};
  const int rc = poll(&p, 1, static_cast<int>(timeout_s * 1000));
  return rc > 0;
}

common::Result<sockaddr_in> resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr)
    return common::invalid_argument("peer liveness: cannot resolve '" + host + "'");
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

}  // namespace

common::Result<std::unique_ptr<PeerLiveness>> PeerLiveness::connect(StoreClient& store,
                                                                    const std::string& prefix,
                                                                    int rank, int size,
                                                                    const std::string& address) {
  std::unique_ptr<PeerLiveness> l(new PeerLiveness());
  l->fds_.assign(size_t(size), -1);
  const double timeout_s = store.timeout_s();
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return common::unavailable("peer liveness: socket: " + errno_text());
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } close_listener{listener};
  CP_ASSIGN_OR_RETURN(sockaddr_in me, resolve(address, 0));
  socklen_t len = sizeof(me);
  if (bind(listener, reinterpret_cast<sockaddr*>(&me), len) != 0 || listen(listener, size) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&me), &len) != 0)
    return common::unavailable("peer liveness: cannot listen on " + address + ": " + errno_text());
  // "HOST PORT": HOST is an IPv4 address or a host name.
  const std::string endpoint = address + " " + std::to_string(ntohs(me.sin_port));
  CP_RETURN_IF_ERROR(
      store.set(prefix + std::to_string(rank), Bytes(endpoint.begin(), endpoint.end())));
  for (int peer = 0; peer < rank; ++peer) {
    CP_ASSIGN_OR_RETURN(Bytes value, store.get(prefix + std::to_string(peer)));
    const std::string text(value.begin(), value.end());
    const size_t space = text.rfind(' ');
    if (space == std::string::npos)
      return common::data_loss("peer liveness: a malformed endpoint for rank " +
                               std::to_string(peer));
    CP_ASSIGN_OR_RETURN(sockaddr_in to,
                        resolve(text.substr(0, space), std::atoi(text.c_str() + space + 1)));
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return common::unavailable("peer liveness: socket: " + errno_text());
    l->fds_[size_t(peer)] = fd;
    const int32_t id = rank;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 ||
        send(fd, &id, sizeof(id), MSG_NOSIGNAL) != ssize_t(sizeof(id)))
      return common::unavailable("peer liveness: cannot reach rank " + std::to_string(peer) + ": " +
                                 errno_text());
  }
  for (int accepted = rank + 1; accepted < size; ++accepted) {
    if (!wait_fd(listener, POLLIN, timeout_s))
      return common::deadline_exceeded("peer liveness: a higher rank did not connect within " +
                                       std::to_string(int(timeout_s)) + " s");
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    int32_t id = -1;
    if (fd < 0 || !wait_fd(fd, POLLIN, timeout_s) ||
        recv(fd, &id, sizeof(id), MSG_WAITALL) != ssize_t(sizeof(id)) || id <= rank || id >= size ||
        l->fds_[size_t(id)] >= 0) {
      if (fd >= 0) close(fd);
      return common::unavailable("peer liveness: a bad hello from a connecting rank");
    }
    l->fds_[size_t(id)] = fd;
  }
  return l;
}

PeerLiveness::~PeerLiveness() {
  for (int fd : fds_)
    if (fd >= 0) close(fd);
}

int PeerLiveness::wait_for_loss(int timeout_ms) {
  std::vector<pollfd> polled;
  std::vector<int> ranks;
  for (size_t r = 0; r < fds_.size(); ++r) {
    if (fds_[r] < 0) continue;
    polled.push_back({fds_[r], POLLIN | POLLRDHUP, 0});
    ranks.push_back(int(r));
  }
  if (polled.empty()) {
    poll(nullptr, 0, timeout_ms);
    return -1;
  }
  if (poll(polled.data(), polled.size(), timeout_ms) <= 0) return -1;
  for (size_t i = 0; i < polled.size(); ++i) {
    if (polled[i].revents == 0) continue;
    char byte = 0;
    const ssize_t n = recv(polled[i].fd, &byte, 1, MSG_DONTWAIT);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR))) continue;  // not a close
    close(polled[i].fd);
    fds_[size_t(ranks[i])] = -1;
    return ranks[i];
  }
  return -1;
}

}  // namespace dist
