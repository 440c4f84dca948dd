// ROUTER frames are [identity, payload]; DEALER frames are [payload].
#include "dist/message_socket.h"

#include <zmq.h>

#include <cerrno>
#include <cstdlib>

#include "dist/zmq_util.h"

namespace dist {
namespace {

// A send of `message` as the last frame; ZMQ_DONTWAIT so that a stalled peer cannot block.
common::Status send_last(void* socket, const std::vector<uint8_t>& message, const char* what) {
  if (zmq_send(socket, message.data(), message.size(), ZMQ_DONTWAIT) < 0)
    return common::unavailable(std::string("cannot send to ") + what + ": " + zmq_util::error());
  return {};
}

// zmq_poll over the socket and an optional fd; returns {socket readable, fd readable}.
std::pair<bool, bool> wait(void* socket, int timeout_ms, int extra_fd) {
  zmq_pollitem_t items[2] = {{socket, 0, ZMQ_POLLIN, 0}, {nullptr, extra_fd, ZMQ_POLLIN, 0}};
  if (zmq_poll(items, extra_fd >= 0 ? 2 : 1, timeout_ms) <= 0) return {false, false};
  return {(items[0].revents & ZMQ_POLLIN) != 0,
          extra_fd >= 0 && (items[1].revents & ZMQ_POLLIN) != 0};
}

}  // namespace

common::Result<std::unique_ptr<RouterSocket>> RouterSocket::bind(const std::string& host, int port,
                                                                 const std::string& what) {
  std::unique_ptr<RouterSocket> s(new RouterSocket());
  std::string endpoint =
      "tcp://" + host + ":" + (port == 0 ? std::string("*") : std::to_string(port));
  s->socket_ = zmq_socket(zmq_util::context(), ZMQ_ROUTER);
  if (s->socket_ == nullptr) return common::invalid_argument("zmq_socket: " + zmq_util::error());
  zmq_util::set_int(s->socket_, ZMQ_LINGER, 0);
  zmq_util::set_int(s->socket_, ZMQ_ROUTER_MANDATORY, 1);  // unknown peer: an error, not a drop
  zmq_util::set_int(s->socket_, ZMQ_SNDHWM, 0);            // queued outputs are never dropped
  zmq_util::set_int(s->socket_, ZMQ_RCVHWM, 0);
  if (zmq_bind(s->socket_, endpoint.c_str()) != 0)
    return common::invalid_argument("cannot bind " + what + " at " + endpoint + ": " +
                                    zmq_util::error());
  char bound[256] = {0};
  size_t len = sizeof(bound);
  zmq_getsockopt(s->socket_, ZMQ_LAST_ENDPOINT, bound, &len);
  endpoint = bound;
  s->port_ = std::atoi(endpoint.c_str() + endpoint.rfind(':') + 1);
  return s;
}

RouterSocket::~RouterSocket() {
  if (socket_ != nullptr) zmq_close(socket_);
}

common::Status RouterSocket::send(const std::string& peer, const std::vector<uint8_t>& message) {
  if (zmq_send(socket_, peer.data(), peer.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
    return common::unavailable("engine " + peer + " is not connected: " + zmq_util::error());
  return send_last(socket_, message, "an engine");
}

bool RouterSocket::poll(
    int timeout_ms, int extra_fd,
    const std::function<void(const std::string&, const std::vector<uint8_t>&)>& handler) {
  const auto [readable, fd_ready] = wait(socket_, timeout_ms, extra_fd);
  if (!readable) return fd_ready;
  while (true) {
    std::vector<uint8_t> identity, payload;
    bool more = false;
    if (!zmq_util::recv_frame(socket_, &identity, &more, ZMQ_DONTWAIT)) break;
    if (!more) continue;  // an identity without a payload: dropped
    if (!zmq_util::recv_frame(socket_, &payload, &more, 0)) break;
    while (more) {  // extra frames are not part of this protocol
      std::vector<uint8_t> extra;
      if (!zmq_util::recv_frame(socket_, &extra, &more, 0)) break;
    }
    handler(std::string(identity.begin(), identity.end()), payload);
  }
  return fd_ready;
}

common::Result<std::unique_ptr<DealerSocket>> DealerSocket::connect(const std::string& host,
                                                                    int port,
                                                                    const std::string& identity) {
  std::unique_ptr<DealerSocket> s(new DealerSocket());
  s->socket_ = zmq_socket(zmq_util::context(), ZMQ_DEALER);
  if (s->socket_ == nullptr) return common::invalid_argument("zmq_socket: " + zmq_util::error());
  zmq_util::set_int(s->socket_, ZMQ_LINGER, 0);
  zmq_util::set_int(s->socket_, ZMQ_SNDHWM, 0);
  zmq_util::set_int(s->socket_, ZMQ_RCVHWM, 0);
  zmq_setsockopt(s->socket_, ZMQ_ROUTING_ID, identity.data(), identity.size());
  const std::string endpoint = "tcp://" + host + ":" + std::to_string(port);
  if (zmq_connect(s->socket_, endpoint.c_str()) != 0)
    return common::invalid_argument("cannot connect to " + endpoint + ": " + zmq_util::error());
  return s;
}

DealerSocket::~DealerSocket() {
  if (socket_ != nullptr) zmq_close(socket_);
}

common::Status DealerSocket::send(const std::vector<uint8_t>& message) {
  return send_last(socket_, message, "the front end");
}

bool DealerSocket::poll(int timeout_ms, int extra_fd,
                        const std::function<void(const std::vector<uint8_t>&)>& handler) {
  const auto [readable, fd_ready] = wait(socket_, timeout_ms, extra_fd);
  if (!readable) return fd_ready;
  while (true) {
    std::vector<uint8_t> payload;
    bool more = false;
    if (!zmq_util::recv_frame(socket_, &payload, &more, ZMQ_DONTWAIT)) break;
    while (more) {
      std::vector<uint8_t> extra;
      if (!zmq_util::recv_frame(socket_, &extra, &more, 0)) break;
    }
    handler(payload);
  }
  return fd_ready;
}

}  // namespace dist
