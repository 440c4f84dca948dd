// ZeroMQ ROUTER server and REQ client of the pull connector's side channel.
#include "dist/request_channel.h"

#include "dist/zmq_util.h"

#include <zmq.h>

#include <cerrno>
#include <cstdlib>
#include <thread>

namespace dist {
namespace {

using zmq_util::context;
using zmq_util::recv_frame;
using zmq_util::set_int;
std::string zmq_error() {
  return zmq_util::error();
}

}  // namespace

common::Result<std::unique_ptr<RequestServer>> RequestServer::bind(const std::string& host,
                                                                   int port,
                                                                   const std::string& what) {
  std::unique_ptr<RequestServer> s(new RequestServer());
  s->endpoint_ = "tcp://" + host + ":" + (port == 0 ? std::string("*") : std::to_string(port));
  s->socket_ = zmq_socket(context(), ZMQ_ROUTER);
  if (s->socket_ == nullptr) return common::invalid_argument("zmq_socket: " + zmq_error());
  set_int(s->socket_, ZMQ_LINGER, 0);
  if (zmq_bind(s->socket_, s->endpoint_.c_str()) != 0) {
    const bool in_use = zmq_errno() == EADDRINUSE;
    return common::invalid_argument(
        "cannot bind " + what + " at " + s->endpoint_ + ": " + zmq_error() +
        (in_use ? " (choose a port that is free; ports in the ephemeral range, "
                  "net.ipv4.ip_local_port_range, can be taken by outgoing connections)"
                : ""));
  }
  if (port == 0) {  // the kernel chose: read back which
    char bound[256] = {0};
    size_t len = sizeof(bound);
    zmq_getsockopt(s->socket_, ZMQ_LAST_ENDPOINT, bound, &len);
    s->endpoint_ = bound;
  }
  const size_t colon = s->endpoint_.rfind(':');
  s->port_ = std::atoi(s->endpoint_.c_str() + colon + 1);
  return s;
}

RequestServer::~RequestServer() {
  if (socket_ != nullptr) zmq_close(socket_);
}

bool RequestServer::serve(int timeout_ms, int extra_fd,
                          const std::function<Bytes(const Bytes&)>& handler) {
  zmq_pollitem_t items[2] = {{socket_, 0, ZMQ_POLLIN, 0}, {nullptr, extra_fd, ZMQ_POLLIN, 0}};
  const int n = zmq_poll(items, extra_fd >= 0 ? 2 : 1, timeout_ms);
  if (n <= 0) return false;
  // Frames: [identity, "", payload]. Anything else is dropped without an answer.
  while (true) {
    Bytes identity, frame, payload;
    bool more = false;
    if (!recv_frame(socket_, &identity, &more, ZMQ_DONTWAIT)) break;
    std::vector<Bytes> frames;
    while (more && recv_frame(socket_, &frame, &more, 0)) frames.push_back(frame);
    if (frames.size() != 2 || !frames[0].empty()) continue;
    const Bytes reply = handler(frames[1]);
    zmq_send(socket_, identity.data(), identity.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(socket_, nullptr, 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(socket_, reply.data(), reply.size(), ZMQ_DONTWAIT);
  }
  return extra_fd >= 0 && (items[1].revents & ZMQ_POLLIN) != 0;
}

RequestClient::~RequestClient() {
  for (auto& [endpoint, socket] : sockets_) zmq_close(socket);
}

void* RequestClient::socket_for(const std::string& endpoint) {
  auto it = sockets_.find(endpoint);
  if (it != sockets_.end()) return it->second;
  void* s = zmq_socket(context(), ZMQ_REQ);
  if (s == nullptr) return nullptr;
  set_int(s, ZMQ_LINGER, 0);
  set_int(s, ZMQ_SNDTIMEO, timeout_ms_);
  set_int(s, ZMQ_RCVTIMEO, timeout_ms_);
  if (zmq_connect(s, endpoint.c_str()) != 0) {
    zmq_close(s);
    return nullptr;
  }
  sockets_[endpoint] = s;
  return s;
}

void RequestClient::close(const std::string& endpoint) {
  auto it = sockets_.find(endpoint);
  if (it == sockets_.end()) return;
  zmq_close(it->second);
  sockets_.erase(it);
}

common::Result<Bytes> RequestClient::call(const std::string& host, int port, const Bytes& request) {
  const std::string endpoint = "tcp://" + host + ":" + std::to_string(port);
  std::string error = "no attempt";
  for (int attempt = 0; attempt < tries_; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    void* s = socket_for(endpoint);
    if (s == nullptr) {
      error = zmq_error();
      continue;
    }
    Bytes reply;
    bool more = false;
    if (zmq_send(s, request.data(), request.size(), 0) < 0 || !recv_frame(s, &reply, &more, 0)) {
      error = zmq_errno() == EAGAIN ? "no answer within " + std::to_string(timeout_ms_) + " ms"
                                    : zmq_error();
      close(endpoint);  // a REQ socket that missed its reply cannot be reused
      continue;
    }
    return reply;
  }
  return common::Status(common::StatusCode::kInternal, endpoint + ": " + error);
}

}  // namespace dist
