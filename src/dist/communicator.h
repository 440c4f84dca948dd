// Communicator: one rank's point-to-point links to its peers. A Link is a one-way, ordered
// message channel: a shared-memory ring for ranks on one host (ShmPipe), or a TCP connection
// through ZeroMQ for ranks on other hosts. Collectives for tensor parallelism will sit on top.
// Thread-safety: one sender and one receiver per Link; close() from any thread wakes both.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "dist/shm_pipe.h"

namespace dist {

// What travels: a small serialized header and a float payload (hidden states, logits).
struct Message {
  std::vector<uint8_t> meta;
  std::vector<float> data;
};

class Link {
 public:
  virtual ~Link() = default;
  virtual common::Status send(const Message& message) = 0;
  // Fails (with the peer named) when the link is closed or the peer is gone.
  virtual common::Status recv(Message* message) = 0;
  virtual void close() = 0;
};

// Frames messages over a shared-memory ring.
std::unique_ptr<Link> make_shm_link(ShmPipe pipe);

// A ZeroMQ link over TCP. endpoint is "tcp://HOST:PORT"; the receiving or the sending side may
// bind (the other connects). `what` names the link in errors ("pipeline stage 1 input").
common::Result<std::unique_ptr<Link>> make_tcp_link(const std::string& endpoint, bool bind,
                                                    bool sending, const std::string& what);

// Before a process exits: waits (up to 2 s per link) until messages queued on closed TCP links
// have left. Every TCP link must be destroyed first; no TCP link can be made afterwards.
void flush_tcp_links();

class Communicator {
 public:
  void set_send_link(int peer, std::unique_ptr<Link> link);
  void set_recv_link(int peer, std::unique_ptr<Link> link);
  common::Status send(int peer, const Message& message);
  common::Status recv(int peer, Message* message);
  // Closes every link (wakes blocked senders and receivers).
  void close();

 private:
  std::map<int, std::unique_ptr<Link>> send_links_, recv_links_;
};

}  // namespace dist
