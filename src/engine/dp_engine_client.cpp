// The front end's side of the data-parallel link: routing, the handshake, heartbeats, failover.
#include "engine/dp_engine_client.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>

#include "common/logging.h"
#include "common/timer.h"
#include "engine/dp_balance.h"
#include "engine/engine_wire.h"

namespace engine {
namespace {

void wake(int fd) {
  const uint64_t one = 1;
  if (write(fd, &one, sizeof(one)) < 0) {
  }  // the counter cannot overflow in practice; a failed wake only delays the send
}

void drain(int fd) {
  uint64_t n = 0;
  if (read(fd, &n, sizeof(n)) < 0) {
  }
}

void add_metrics(Metrics& into, const Metrics& m) {
  into.prompt_tokens += m.prompt_tokens;
  into.generation_tokens += m.generation_tokens;
  into.prefix_cache_queries += m.prefix_cache_queries;
  into.prefix_cache_hits += m.prefix_cache_hits;
  into.external_prefix_cache_hits += m.external_prefix_cache_hits;
  into.preemptions += m.preemptions;
  into.recomputed_requests += m.recomputed_requests;
  into.dummy_batches += m.dummy_batches;
  into.balance_paused_steps += m.balance_paused_steps;
  into.kv_transfer += m.kv_transfer;
  into.spec_decoding += m.spec_decoding;
  for (const auto& [reason, n] : m.request_success) into.request_success[reason] += n;
  const auto to = Metrics::histograms(into);
  const auto from = Metrics::histograms(m);
  for (size_t i = 0; i < to.size(); ++i) to[i]->merge(*from[i]);  // same binary, same bounds
}

}  // namespace

common::Result<std::unique_ptr<DpEngineClient>> DpEngineClient::start(DpClientOptions options) {
  std::unique_ptr<DpEngineClient> c(new DpEngineClient(std::move(options)));
  CP_ASSIGN_OR_RETURN(c->socket_,
                      dist::RouterSocket::bind(c->options_.bind_host, c->options_.rpc_port,
                                               "the data-parallel rpc port"));
  c->socket_port_ = c->socket_->port();
  c->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (c->wake_fd_ < 0) return common::Status(common::StatusCode::kInternal, "eventfd failed");
  c->engines_.resize(static_cast<size_t>(c->options_.dp_size));
  c->io_ = std::thread([p = c.get()] { p->io_loop(); });
  return c;
}

DpEngineClient::~DpEngineClient() {
  shutdown();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void DpEngineClient::shutdown() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < engines_.size(); ++i)
      if (!engines_[i].peer.empty()) outbox_.emplace_back(int(i), dp::message(dp::Kind::kShutdown));
  }
  wake(wake_fd_);
  if (io_.joinable()) io_.join();
  std::vector<std::pair<std::string, OutputCallback>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, p] : pending_) left.emplace_back(id, std::move(p.callback));
    pending_.clear();
    pd_engines_.clear();
  }
  for (auto& [id, cb] : left) {
    RequestOutput out;
    out.request_id = id;
    out.finished = true;
    out.finish_reason = sched::FinishReason::kAbort;
    out.error = "the server is shutting down";
    cb(out);
  }
}

common::Status DpEngineClient::wait_ready(double timeout_s) {
  const double deadline = common::now_seconds() + timeout_s;
  while (true) {
    std::string missing, dead;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < engines_.size(); ++i) {
        if (engines_[i].dead) dead += (dead.empty() ? "" : ", ") + std::to_string(i);
        if (!engines_[i].ready) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
      }
    }
    if (!dead.empty())
      return common::unavailable("data-parallel engine(s) " + dead + " failed while starting");
    if (missing.empty()) return {};
    if (common::now_seconds() > deadline)
      return common::deadline_exceeded("data-parallel engine(s) " + missing +
                                       " did not connect to --data-parallel-rpc-port " +
                                       std::to_string(socket_port_) + " and report READY within " +
                                       std::to_string(static_cast<int>(timeout_s)) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void DpEngineClient::post(int engine, std::vector<uint8_t> message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.emplace_back(engine, std::move(message));
  }
  wake(wake_fd_);
}

void DpEngineClient::io_loop() {
  double last_ping = 0;
  while (true) {
    const bool woke = socket_->poll(
        50, wake_fd_, [this](const std::string& peer, const auto& m) { on_message(peer, m); });
    if (woke) drain(wake_fd_);
    std::vector<std::pair<int, std::vector<uint8_t>>> out;
    std::vector<std::string> peers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      out.swap(outbox_);
      for (const Engine& e : engines_) peers.push_back(e.peer);
    }
    std::vector<std::pair<int, std::string>> failed;
    for (auto& [engine, m] : out) {
      if (peers[size_t(engine)].empty()) continue;
      if (auto st = socket_->send(peers[size_t(engine)], m); !st.ok())
        failed.emplace_back(engine, st.message());
    }
    const double now = common::now_seconds();
    if (now - last_ping > 1.0) {
      last_ping = now;
      for (size_t i = 0; i < peers.size(); ++i)
        if (!peers[i].empty()) (void)socket_->send(peers[i], dp::message(dp::Kind::kPing));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < engines_.size(); ++i) {
        const Engine& e = engines_[i];
        if (e.ready && !e.dead && now - e.last_seen > options_.heartbeat_timeout_s)
          failed.emplace_back(int(i), "no word from it for " +
                                          std::to_string(int(options_.heartbeat_timeout_s)) + " s");
      }
    }
    for (const auto& [engine, why] : failed) mark_dead(engine, why);
    if (stopping_ && out.empty()) return;
  }
}

void DpEngineClient::on_message(const std::string& peer, const std::vector<uint8_t>& bytes) {
  dp::Kind kind;
  std::vector<uint8_t> payload;
  if (!dp::parse(bytes, &kind, &payload)) return;
  int engine = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = rank_of_peer_.find(peer); it != rank_of_peer_.end()) engine = it->second;
  }
  if (kind == dp::Kind::kHello) {
    auto rank = dp::decode_rank(payload);
    if (!rank.ok() || *rank >= options_.dp_size) {
      LOG(WARNING) << "A data-parallel HELLO from an engine with rank "
                   << (rank.ok() ? std::to_string(*rank) : "?") << " outside [0, "
                   << options_.dp_size << "): ignored";
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      Engine& e = engines_[size_t(*rank)];
      if (!e.peer.empty() && !e.dead) {
        LOG(WARNING) << "Data-parallel rank " << *rank << " said HELLO twice: ignored";
        return;
      }
      if (!e.peer.empty()) rank_of_peer_.erase(e.peer);  // a restarted engine
      e = Engine{};
      e.peer = peer;
      rank_of_peer_[peer] = *rank;
      e.last_seen = common::now_seconds();
    }
    (void)socket_->send(peer,
                        dp::message(dp::Kind::kWelcome, dp::encode_welcome(options_.welcome)));
    return;
  }
  if (engine < 0) return;  // not a known engine
  std::vector<std::pair<OutputCallback, RequestOutput>> deliver;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Engine& e = engines_[size_t(engine)];
    e.last_seen = common::now_seconds();
    if (kind == dp::Kind::kReady) {
      e.ready = true;
      LOG(INFO) << "Data-parallel engine " << engine << " is ready";
    } else if (kind == dp::Kind::kStats) {
      if (auto s = decode_metrics(payload); s.ok()) e.stats = std::move(s).value();
    } else if (kind == dp::Kind::kOutput) {
      auto o = decode_output(payload);
      if (!o.ok()) return;
      o->engine_index = engine;
      auto it = pending_.find(o->request_id);
      if (it == pending_.end() || it->second.engine != engine) return;
      const bool finished = o->finished;
      deliver.emplace_back(finished ? std::move(it->second.callback) : it->second.callback,
                           std::move(o).value());
      if (finished) {
        forget_pd_engine(it->second);
        pending_.erase(it);
        --e.unfinished;
      }
    }
  }
  if (kind == dp::Kind::kFailed) {
    mark_dead(engine, std::string(payload.begin(), payload.end()));
    return;
  }
  for (auto& [cb, out] : deliver) cb(out);
}

void DpEngineClient::engine_died(int rank, const std::string& why) {
  if (rank >= 0 && rank < options_.dp_size) mark_dead(rank, why);
}

void DpEngineClient::mark_dead(int engine, const std::string& why) {
  std::vector<std::pair<std::string, OutputCallback>> failed;
  std::string fatal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Engine& e = engines_[size_t(engine)];
    if (e.dead) return;
    e.dead = true;
    if (stopping_)  // it exits as asked
      LOG(INFO) << "Data-parallel engine " << engine << " ended: " << why;
    else
      LOG(ERROR) << "Data-parallel engine " << engine << " failed: " << why;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.engine == engine) {
        forget_pd_engine(it->second);
        failed.emplace_back(it->first, std::move(it->second.callback));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    e.unfinished = 0;
    bool any_alive = false;
    for (const Engine& o : engines_) any_alive |= !o.dead;
    if ((!any_alive || options_.lockstep) && !fatal_reported_ && !stopping_) {
      fatal_reported_ = true;
      fatal = options_.lockstep ? "data-parallel engine " + std::to_string(engine) +
                                      " of a lock-step (expert "
                                      "parallel) group failed: " +
                                      why
                                : "every data-parallel engine failed; the last: " + why;
    }
  }
  for (auto& [id, cb] : failed) {
    RequestOutput out;
    out.request_id = id;
    out.finished = true;
    out.finish_reason = sched::FinishReason::kAbort;
    out.error = "EngineCore encountered an issue: data-parallel engine " + std::to_string(engine) +
                " failed: " + why;
    out.engine_index = engine;
    cb(out);
  }
  if (!fatal.empty() && options_.on_fatal) options_.on_fatal(fatal);
}

int DpEngineClient::pick_engine() {
  if (engines_.empty()) return -1;
  std::vector<EngineLoad> loads(engines_.size());
  for (size_t i = 0; i < engines_.size(); ++i) {
    const Engine& e = engines_[i];
    loads[i] = EngineLoad{e.ready && !e.dead, e.unfinished, e.stats.num_running};
  }
  return least_loaded_engine(loads, next_first_++ % engines_.size());
}

int DpEngineClient::engine_for(const EngineRequest& request) {
  if (request.kv_transfer_params.empty()) return pick_engine();
  // The choices of one PD request name the same remote prompt: one engine pulls it once and
  // its other choices share those blocks (P frees them after the first pull).
  auto [it, added] = pd_engines_.try_emplace(request.kv_transfer_params, -1, 0);
  const bool alive = !added && engines_[size_t(it->second.first)].ready &&
                     !engines_[size_t(it->second.first)].dead;
  if (!alive) it->second = {pick_engine(), 0};
  if (it->second.first < 0) {
    pd_engines_.erase(it);
    return -1;
  }
  ++it->second.second;
  return it->second.first;
}

void DpEngineClient::forget_pd_engine(const Pending& p) {
  if (p.kv_transfer_params.empty()) return;
  auto it = pd_engines_.find(p.kv_transfer_params);
  if (it == pd_engines_.end() || --it->second.second > 0) return;
  constexpr size_t kRemembered = 16384;
  const size_t hash = std::hash<std::string>()(p.kv_transfer_params);
  if (finished_pd_engines_.insert_or_assign(hash, it->second.first).second) {
    finished_pd_order_.push_back(hash);
    if (finished_pd_order_.size() > kRemembered) {
      finished_pd_engines_.erase(finished_pd_order_.front());
      finished_pd_order_.pop_front();
    }
  }
  pd_engines_.erase(it);
}

void DpEngineClient::add_request(EngineRequest request, OutputCallback callback) {
  int engine = -1;
  std::string refusal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      refusal = "the server is shutting down";
    } else if (pending_.count(request.request_id)) {
      refusal = "request id " + request.request_id + " is already running";
    } else if ((engine = engine_for(request)) < 0) {
      refusal = "EngineCore encountered an issue: no data-parallel engine is alive";
    } else {
      pending_[request.request_id] = Pending{engine, callback, request.kv_transfer_params};
      ++engines_[size_t(engine)].unfinished;
      outbox_.emplace_back(engine, dp::message(dp::Kind::kAdd, encode_request(request)));
    }
  }
  if (refusal.empty()) {
    wake(wake_fd_);
    return;
  }
  RequestOutput out;
  out.request_id = request.request_id;
  out.finished = true;
  out.finish_reason = sched::FinishReason::kAbort;
  out.error = refusal;
  callback(out);
}

void DpEngineClient::abort_request(const std::string& request_id) {
  int engine = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(request_id);
    if (it == pending_.end()) return;
    engine = it->second.engine;
  }
  post(engine, dp::message(dp::Kind::kAbort, request_id));
}

void DpEngineClient::release_kv_transfer(const std::string& kv_transfer_params) {
  int engine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The engine that runs (or ran) requests naming these params owns their release and skips
    // this one; any engine can say DONE for params none of them has seen.
    auto it = pd_engines_.find(kv_transfer_params);
    auto done = finished_pd_engines_.find(std::hash<std::string>()(kv_transfer_params));
    engine = it != pd_engines_.end()              ? it->second.first
             : done != finished_pd_engines_.end() ? done->second
                                                  : -1;
    if (engine < 0 || !engines_[size_t(engine)].ready || engines_[size_t(engine)].dead)
      engine = pick_engine();
  }
  if (engine >= 0) post(engine, dp::message(dp::Kind::kRelease, kv_transfer_params));
}

MetricsSnapshot DpEngineClient::metrics() const {
  MetricsSnapshot sum;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Engine& e : engines_) {
    add_metrics(sum.totals, e.stats.totals);
    sum.recent_prefix_cache_queries += e.stats.recent_prefix_cache_queries;
    sum.recent_prefix_cache_hits += e.stats.recent_prefix_cache_hits;
    sum.num_running += e.stats.num_running;
    sum.num_waiting += e.stats.num_waiting;
    sum.num_kv_blocks += e.stats.num_kv_blocks;
    sum.kv_cache_usage += e.stats.kv_cache_usage / double(engines_.size());
    sum.block_size = e.stats.block_size;
  }
  return sum;
}

std::vector<EngineMetrics> DpEngineClient::engine_metrics() const {
  std::vector<EngineMetrics> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < engines_.size(); ++i) out.push_back({int(i), engines_[i].stats});
  return out;
}

bool DpEngineClient::is_healthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (fatal_reported_) return false;
  for (const Engine& e : engines_)
    if (!e.dead) return true;
  return false;
}

}  // namespace engine
