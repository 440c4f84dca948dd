// Communicator routing and the shared-memory link's framing.
#include "dist/communicator.h"

#include "common/check.h"

namespace dist {
namespace {

class ShmLink : public Link {
 public:
  explicit ShmLink(ShmPipe pipe) : pipe_(std::move(pipe)) {}
  common::Status send(const Message& m) override {
    const uint64_t sizes[2] = {m.meta.size(), m.data.size()};
    CP_RETURN_IF_ERROR(pipe_.write(sizes, sizeof(sizes)));
    CP_RETURN_IF_ERROR(pipe_.write(m.meta.data(), m.meta.size()));
    return pipe_.write(m.data.data(), m.data.size() * sizeof(float));
  }
  common::Status recv(Message* m) override {
    uint64_t sizes[2];
    CP_RETURN_IF_ERROR(pipe_.read(sizes, sizeof(sizes)));
    m->meta.resize(sizes[0]);
    m->data.resize(sizes[1]);
    CP_RETURN_IF_ERROR(pipe_.read(m->meta.data(), m->meta.size()));
    return pipe_.read(m->data.data(), m->data.size() * sizeof(float));
  }
  void close() override { pipe_.close(); }

 private:
  ShmPipe pipe_;
};

}  // namespace

std::unique_ptr<Link> make_shm_link(ShmPipe pipe) {
  return std::make_unique<ShmLink>(std::move(pipe));
}

void Communicator::set_send_link(int peer, std::unique_ptr<Link> link) {
  send_links_[peer] = std::move(link);
}

void Communicator::set_recv_link(int peer, std::unique_ptr<Link> link) {
  recv_links_[peer] = std::move(link);
}

common::Status Communicator::send(int peer, const Message& message) {
  auto it = send_links_.find(peer);
  CHECK(it != send_links_.end()) << "no link to peer " << peer;
  return it->second->send(message);
}

common::Status Communicator::recv(int peer, Message* message) {
  auto it = recv_links_.find(peer);
  CHECK(it != recv_links_.end()) << "no link from peer " << peer;
  return it->second->recv(message);
}

void Communicator::close() {
  for (auto& [peer, link] : send_links_) link->close();
  for (auto& [peer, link] : recv_links_) link->close();
}

}  // namespace dist
