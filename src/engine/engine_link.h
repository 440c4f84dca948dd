// EngineLink: an engine process's side of the data-parallel link (dp_protocol.h). It says
// HELLO to the front end's rpc port and waits for WELCOME (connect), then, once the engine is
// built, says READY and serves it (serve): requests in, outputs and STATS (every 100 ms) out.
// Driven by one thread; the engine's output callbacks may run on any thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/message_socket.h"
#include "engine/dp_protocol.h"
#include "engine/engine_client.h"

namespace engine {

class EngineLink {
 public:
  static common::Result<std::unique_ptr<EngineLink>> connect(const std::string& host, int port,
                                                             int rank, double timeout_s);
  ~EngineLink();
  EngineLink(const EngineLink&) = delete;
  EngineLink& operator=(const EngineLink&) = delete;
  const dp::Welcome& welcome() const { return welcome_; }
  int rank() const { return rank_; }

  // READY, then serves `engine` until the front end says SHUTDOWN or falls silent for
  // heartbeat_timeout_s, `stop_fd` becomes readable, or the engine fails (FAILED is sent).
  // Returns the process's exit status: 0, or 1 after a failure.
  int serve(EngineClient& engine, int stop_fd, double heartbeat_timeout_s = 10);
  // Tells the front end the engine could not be built.
  void report_failure(const std::string& why);

 private:
  EngineLink() = default;
  void push(std::vector<uint8_t> message);  // any thread
  std::unique_ptr<dist::DealerSocket> socket_;
  dp::Welcome welcome_;
  int rank_ = 0;
  int wake_fd_ = -1;
  std::mutex mu_;
  std::vector<std::vector<uint8_t>> outbox_;
};

}  // namespace engine
