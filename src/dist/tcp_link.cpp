// The cross-host Link: a ZeroMQ PUSH/PULL pair over TCP. ZeroMQ gives message framing,
// connection retries while the other host starts, and ZMTP heartbeats; a socket monitor turns
// "the peer went away" into an error instead of a silent wait.
#include <zmq.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include "dist/communicator.h"

namespace dist {
namespace {

void* context() {
  static void* ctx = zmq_ctx_new();  // process-wide, never destroyed (links linger 0)
  return ctx;
}

int64_t zmq_clock_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string zmq_error() {
  return zmq_strerror(zmq_errno());
}

class TcpLink : public Link {
 public:
  TcpLink(void* sock, void* monitor, std::string what, std::string endpoint)
      : sock_(sock), monitor_(monitor), what_(std::move(what)), endpoint_(std::move(endpoint)) {}
  ~TcpLink() override {
    // Queued messages (the shutdown a stage forwards just before it exits) get up to 2 s to
    // leave; flush_tcp_links() waits for them.
    const int linger_ms = 2000;
    zmq_setsockopt(sock_, ZMQ_LINGER, &linger_ms, sizeof(linger_ms));
    zmq_socket_monitor(sock_, nullptr, 0);
    zmq_close(monitor_);
    zmq_close(sock_);
  }

  common::Status send(const Message& m) override {
    CP_RETURN_IF_ERROR(wait_for(ZMQ_POLLOUT));
    if (zmq_send(sock_, m.meta.data(), m.meta.size(), ZMQ_SNDMORE) < 0 ||
        zmq_send(sock_, m.data.data(), m.data.size() * sizeof(float), 0) < 0) {
      return common::invalid_argument(what_ + ": send failed: " + zmq_error());
    }
    return {};
  }

  common::Status recv(Message* m) override {
    CP_RETURN_IF_ERROR(wait_for(ZMQ_POLLIN));
    CP_RETURN_IF_ERROR(recv_part(&m->meta));
    std::vector<uint8_t> bytes;
    CP_RETURN_IF_ERROR(recv_part(&bytes));
    if (bytes.size() % sizeof(float) != 0)
      return common::invalid_argument(what_ + ": a message payload is not whole floats");
    m->data.resize(bytes.size() / sizeof(float));
    std::memcpy(m->data.data(), bytes.data(), bytes.size());
    return {};
  }

  void close() override { closed_ = true; }

 private:
  // Polls until the socket is ready for `event`, the link is closed, or the peer is gone.
  common::Status wait_for(short event) {
    while (true) {
      if (closed_) return common::invalid_argument(what_ + ": the link was closed");
      zmq_pollitem_t items[2] = {{sock_, 0, event, 0}, {monitor_, 0, ZMQ_POLLIN, 0}};
      if (zmq_poll(items, 2, lost_peer_ ? 20 : 100) < 0 && zmq_errno() != EINTR)
        return common::invalid_argument(what_ + ": poll failed: " + zmq_error());
      if (items[1].revents & ZMQ_POLLIN) drain_monitor();
      if (items[0].revents & event) return {};  // what arrived before a disconnect still counts
      if (lost_peer_) {
        // The monitor can report the disconnect before the socket shows the peer's last
        // message (e.g. a shutdown sent just before it exited): give that message a moment.
        if (lost_at_ == 0) lost_at_ = zmq_clock_ms();
        if (zmq_clock_ms() - lost_at_ > 500) {
          return common::invalid_argument(what_ + ": lost the connection to the peer at " +
                                          endpoint_);
        }
      }
    }
  }

  void drain_monitor() {
    while (true) {
      zmq_msg_t head, addr;
      zmq_msg_init(&head);
      if (zmq_msg_recv(&head, monitor_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&head);
        return;
      }
      uint16_t event = 0;
      std::memcpy(&event, zmq_msg_data(&head), sizeof(event));
      zmq_msg_close(&head);
      zmq_msg_init(&addr);
      zmq_msg_recv(&addr, monitor_, 0);
      zmq_msg_close(&addr);
      if (event == ZMQ_EVENT_CONNECTED || event == ZMQ_EVENT_ACCEPTED) {
        ++peers_;
      } else if (event == ZMQ_EVENT_DISCONNECTED && peers_ > 0 && --peers_ == 0) {
        lost_peer_ = true;
      }
    }
  }

  common::Status recv_part(std::vector<uint8_t>* out) {
    zmq_msg_t part;
    zmq_msg_init(&part);
    if (zmq_msg_recv(&part, sock_, 0) < 0) {
      zmq_msg_close(&part);
      return common::invalid_argument(what_ + ": receive failed: " + zmq_error());
    }
    const auto* p = static_cast<const uint8_t*>(zmq_msg_data(&part));
    out->assign(p, p + zmq_msg_size(&part));
    zmq_msg_close(&part);
    return {};
  }

  void* sock_;
  void* monitor_;
  std::string what_, endpoint_;
  std::atomic<bool> closed_{false};
  int peers_ = 0;
  bool lost_peer_ = false;
  int64_t lost_at_ = 0;  // when lost_peer_ was first seen (ms)
};

}  // namespace

void flush_tcp_links() {
  zmq_ctx_term(context());
}

common::Result<std::unique_ptr<Link>> make_tcp_link(const std::string& endpoint, bool bind,
                                                    bool sending, const std::string& what) {
  static std::atomic<int> next_monitor{0};
  void* sock = zmq_socket(context(), sending ? ZMQ_PUSH : ZMQ_PULL);
  if (sock == nullptr) return common::invalid_argument(what + ": " + zmq_error());
  // No ZMQ_IMMEDIATE: with it, a message sent just before the sender exits (the shutdown a
  // stage forwards) was lost about one time in ten, even with linger and zmq_ctx_term.
  const int linger = 0, heartbeat_ms = 1000, heartbeat_timeout_ms = 5000;
  zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &heartbeat_ms, sizeof(heartbeat_ms));
  zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &heartbeat_timeout_ms, sizeof(heartbeat_timeout_ms));
  const std::string monitor_name =
      "inproc://chunkpipe-link-monitor-" + std::to_string(next_monitor++);
  if (zmq_socket_monitor(sock, monitor_name.c_str(),
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
    zmq_close(sock);
    return common::invalid_argument(what + ": socket monitor: " + zmq_error());
  }
  void* monitor = zmq_socket(context(), ZMQ_PAIR);
  zmq_setsockopt(monitor, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_connect(monitor, monitor_name.c_str());
  const int rc = bind ? zmq_bind(sock, endpoint.c_str()) : zmq_connect(sock, endpoint.c_str());
  if (rc != 0) {
    const std::string why = zmq_error();
    zmq_close(monitor);
    zmq_close(sock);
    return common::invalid_argument(what + ": cannot " + (bind ? "bind " : "connect to ") +
                                    endpoint + ": " + why);
  }
  return std::unique_ptr<Link>(std::make_unique<TcpLink>(sock, monitor, what, endpoint));
}

}  // namespace dist
