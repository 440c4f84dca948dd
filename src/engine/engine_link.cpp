// The engine process's loop: the socket, the outbox its callbacks fill, and the heartbeats.
#include "engine/engine_link.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/logging.h"
#include "common/timer.h"
#include "engine/engine_wire.h"

namespace engine {

common::Result<std::unique_ptr<EngineLink>> EngineLink::connect(const std::string& host, int port,
                                                                int rank, double timeout_s) {
  std::unique_ptr<EngineLink> link(new EngineLink());
  link->rank_ = rank;
  CP_ASSIGN_OR_RETURN(link->socket_,
                      dist::DealerSocket::connect(host, port, "dp-rank-" + std::to_string(rank)));
  link->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (link->wake_fd_ < 0) return common::Status(common::StatusCode::kInternal, "eventfd failed");
  const double deadline = common::now_seconds() + timeout_s;
  double last_hello = -1;
  bool welcomed = false;
  common::Status bad;
  while (!welcomed && bad.ok()) {
    const double now = common::now_seconds();
    if (now > deadline)
      return common::deadline_exceeded("no WELCOME from the data-parallel front end at " + host +
                                       ":" + std::to_string(port) + " within " +
                                       std::to_string(static_cast<int>(timeout_s)) + " s");
    if (now - last_hello > 1.0) {  // HELLO again until the front end is up
      (void)link->socket_->send(dp::message(dp::Kind::kHello, dp::encode_rank(rank)));
      last_hello = now;
    }
    link->socket_->poll(100, -1, [&](const std::vector<uint8_t>& m) {
      dp::Kind kind;
      std::vector<uint8_t> payload;
      if (welcomed || !dp::parse(m, &kind, &payload) || kind != dp::Kind::kWelcome) return;
      auto w = dp::decode_welcome(payload);
      if (!w.ok()) {
        bad = w.status();
        return;
      }
      link->welcome_ = std::move(w).value();
      welcomed = true;
    });
  }
  if (!bad.ok()) return bad;
  return link;
}

EngineLink::~EngineLink() {
  if (wake_fd_ >= 0) close(wake_fd_);
}

void EngineLink::push(std::vector<uint8_t> message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.push_back(std::move(message));
  }
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
  }  // a lost wake only delays the send to the next poll (at most 100 ms)
}

void EngineLink::report_failure(const std::string& why) {
  (void)socket_->send(dp::message(dp::Kind::kFailed, why));
}

int EngineLink::serve(EngineClient& engine, int stop_fd, double heartbeat_timeout_s) {
  (void)socket_->send(dp::message(dp::Kind::kReady, dp::encode_rank(rank_)));
  double last_heard = common::now_seconds(), last_stats = 0;
  bool shutdown = false;
  while (!shutdown) {
    const bool woke = socket_->poll(100, wake_fd_, [&](const std::vector<uint8_t>& m) {
      dp::Kind kind;
      std::vector<uint8_t> payload;
      if (!dp::parse(m, &kind, &payload)) return;
      last_heard = common::now_seconds();
      if (kind == dp::Kind::kAdd) {
        auto request = decode_request(payload);
        if (!request.ok()) {
          LOG(WARNING) << request.status().message();
          return;
        }
        engine.add_request(std::move(request).value(), [this](const RequestOutput& out) {
          push(dp::message(dp::Kind::kOutput, encode_output(out)));
        });
      } else if (kind == dp::Kind::kAbort) {
        engine.abort_request(std::string(payload.begin(), payload.end()));
      } else if (kind == dp::Kind::kRelease) {
        engine.release_kv_transfer(std::string(payload.begin(), payload.end()));
      } else if (kind == dp::Kind::kShutdown) {
        shutdown = true;
      }
    });
    if (woke) {
      uint64_t n = 0;
      if (read(wake_fd_, &n, sizeof(n)) < 0) {
      }
    }
    std::vector<std::vector<uint8_t>> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      out.swap(outbox_);
    }
    for (const auto& m : out) (void)socket_->send(m);
    const double now = common::now_seconds();
    if (now - last_stats > 0.1) {
      last_stats = now;
      (void)socket_->send(dp::message(dp::Kind::kStats, encode_metrics(engine.metrics())));
    }
    if (!engine.is_healthy()) {
      report_failure("the engine of data-parallel rank " + std::to_string(rank_) + " failed");
      return 1;
    }
    if (stop_fd >= 0) {
      pollfd pfd{stop_fd, POLLIN, 0};
      if (::poll(&pfd, 1, 0) > 0) return 0;
    }
    if (now - last_heard > heartbeat_timeout_s) {
      LOG(ERROR) << "The data-parallel front end fell silent for " << heartbeat_timeout_s
                 << " s: engine of rank " << rank_ << " exiting";
      return 1;
    }
  }
  LOG(INFO) << "Data-parallel engine " << rank_ << ": shutdown requested by the front end";
  return 0;
}

}  // namespace engine
