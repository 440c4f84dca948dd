// The pull connector's scheduler side, its releaser thread, and the worker side's wiring.
#include "transfer/pull_connector.h"

#include <functional>

#include "common/logging.h"
#include "common/timer.h"
#include "dist/request_channel.h"

namespace transfer {
namespace {

int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Remote prompts remembered (outside releases, and prompts P no longer holds): far more than run
// at once, under 1 MB.
constexpr size_t kSeenLimit = 16384;

// One remote prompt: P's request id is unique per prefill, the rest tells prefillers apart.
std::string remote_key(const PullParams& p) {
  return p.remote_engine_id + "\n" + p.remote_host + "\n" + std::to_string(p.remote_port) + "\n" +
         p.remote_request_id;
}

// What the seen list keeps of a key: its hash, since the params (the client's) may be long.
size_t seen_id(const std::string& key) {
  return std::hash<std::string>()(key);
}

}  // namespace

PullReleaser::PullReleaser() : thread_([this] { loop(); }) {}

PullReleaser::~PullReleaser() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void PullReleaser::release(const PullParams& remote, int default_tp, int default_pp) {
  PullParams p = remote;
  if (p.remote_tp_size == 0) p.remote_tp_size = default_tp;
  if (p.remote_pp_size == 0) p.remote_pp_size = default_pp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(p));
  }
  cv_.notify_one();
}

void PullReleaser::loop() {
  dist::RequestClient client;
  // A DONE to a prefiller that does not answer costs the client's whole retry budget (seconds):
  // one dead prefiller (or params naming a dead host with many stages) would hold up every
  // release behind it. A release stops at its first stage that fails, and the prefiller's
  // releases are dropped for kUnreachableSeconds (its leases end by expiry, or died with it).
  constexpr double kUnreachableSeconds = 10;
  struct Unreachable {
    double until = 0;
    int64_t dropped = 0;
  };
  std::unordered_map<std::string, Unreachable> unreachable;  // by host:port of stage 0
  while (true) {
    PullParams p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      // Stopping: what is left is not said (each could wait seconds on a dead prefiller);
      // those leases end by expiry.
      if (stopping_) return;
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    const double now = common::now_seconds();
    if (unreachable.size() > 1024)  // params may name any number of hosts: forget expired ones
      std::erase_if(unreachable, [&](const auto& u) { return u.second.until <= now; });
    const std::string prefiller = p.remote_host + ":" + std::to_string(p.remote_port);
    if (auto u = unreachable.find(prefiller); u != unreachable.end()) {
      if (now < u->second.until) {
        ++u->second.dropped;
        continue;
      }
      if (u->second.dropped > 0)
        LOG(WARNING) << "Dropped " << u->second.dropped << " releases for the prefiller at "
                     << prefiller << " while it did not answer";
      unreachable.erase(u);
    }
    for (int stage = 0; stage < p.remote_pp_size; ++stage) {
      const int port = worker_port(p.remote_port, stage, 0, p.remote_tp_size);
      auto acked = send_done(client, p.remote_host, port, p.remote_request_id);
      if (!acked.ok()) {
        LOG(WARNING) << "Could not release remote request " << p.remote_request_id << " at "
                     << p.remote_host << ":" << port << ": " << acked.status().message()
                     << "; releases for the prefiller at " << prefiller
                     << " are dropped for the next " << kUnreachableSeconds << " s";
        unreachable[prefiller].until = common::now_seconds() + kUnreachableSeconds;
        break;
      }
    }
  }
}

PullScheduler::Remote* PullScheduler::remote_of(const sched::Request& request) {
  auto it = remotes_.find(request.request_id);
  if (it != remotes_.end()) return &it->second;
  if (request.kv_transfer_params.empty()) return nullptr;
  auto params = parse_pull_params(request.kv_transfer_params);
  if (!params.ok()) {
    LOG(WARNING) << "Request " << request.request_id << ": ignoring its kv_transfer_params ("
                 << params.status().message() << ")";
    return nullptr;
  }
  if (!params->do_remote_prefill) return nullptr;
  Remote remote;
  remote.key = remote_key(*params);
  remote.params = std::move(params).value();
  remote.prompt = prompt_hash(request.prompt_token_ids);
  SharedRemote& shared = shared_[remote.key];
  ++shared.pending_refs;
  if (remember(remote.key, false).second) shared.consumed = true;  // released or pulled before
  return &remotes_.emplace(request.request_id, std::move(remote)).first->second;
}

void PullScheduler::request_added(const sched::Request& request) {
  if (o_.consumer) remote_of(request);  // counts it among the requests naming its remote prompt
}

void PullScheduler::give_up(Remote* remote) {
  remote->pending = false;
  SharedRemote& s = shared_[remote->key];
  if (--s.pending_refs == 0 && s.puller.empty() && !s.consumed) {
    s.consumed = true;
    remember_consumed(remote->key);
    release(remote->params);
  }
  forget_if_unused(remote->key);
}

void PullScheduler::forget_if_unused(const std::string& key) {
  auto it = shared_.find(key);
  if (it != shared_.end() && it->second.pending_refs == 0 && it->second.puller.empty() &&
      it->second.loaded_by.empty())
    shared_.erase(it);
}

void PullScheduler::release(const PullParams& params) {
  std::lock_guard<std::mutex> lock(release_mu_);
  if (!releaser_) releaser_ = std::make_unique<PullReleaser>();
  releaser_->release(params, o_.remote_tp_size, o_.remote_pp_size);
}

void PullScheduler::remember_consumed(const std::string& key) {
  remember(key, /*outside_release=*/false, /*consumed=*/true);
}

std::pair<bool, bool> PullScheduler::remember(const std::string& key, bool outside_release,
                                              bool consumed) {
  std::lock_guard<std::mutex> lock(release_mu_);
  const size_t id = seen_id(key);
  auto [it, added] = seen_.try_emplace(id, outside_release);
  const bool released = it->second;
  if (consumed) it->second = true;
  if (added) {
    seen_order_.push_back(id);
    if (seen_order_.size() > kSeenLimit) {
      seen_.erase(seen_order_.front());
      seen_order_.pop_front();
    }
  }
  return {added, released};
}

void PullScheduler::release_unscheduled(const std::string& kv_transfer_params) {
  if (!o_.consumer) return;
  auto params = parse_pull_params(kv_transfer_params);
  if (!params.ok() || !params->do_remote_prefill) return;
  // A request here that named this prompt says DONE itself when it pulls or gives it up; a
  // second DONE could free P's blocks under its pull.
  if (!remember(remote_key(*params), true).first) return;
  release(*params);
}

std::optional<sched::MatchedTokens> PullScheduler::get_num_new_matched_tokens(
    const sched::Request& request, int64_t num_computed_tokens) {
  sched::MatchedTokens none;
  if (!o_.consumer) return none;
  Remote* remote = remote_of(request);
  if (remote == nullptr || !remote->pending) return none;
  const PullParams& p = remote->params;
  const int64_t blocks = cdiv(request.num_prompt_tokens(), o_.block_size);
  std::string mismatch;
  if (!p.prompt_hash.empty() && p.prompt_hash != remote->prompt) {
    mismatch = "its blocks hold another prompt";
  } else if (p.remote_block_size != 0 && p.remote_block_size != o_.block_size) {
    mismatch = "its KV blocks hold " + std::to_string(p.remote_block_size) +
               " tokens, this decoder's " + std::to_string(o_.block_size);
  } else if ((p.num_prompt_blocks >= 0 && p.num_prompt_blocks != blocks) ||
             static_cast<int64_t>(p.remote_block_ids.size()) < blocks) {
    mismatch = "it names " + std::to_string(p.remote_block_ids.size()) +
               " blocks for a prompt of " + std::to_string(blocks);
  }
  if (!mismatch.empty()) {
    LOG(WARNING) << "Request " << request.request_id << ": computing the prompt here, not "
                 << "pulling it from " << p.remote_host << ":" << p.remote_port << ": " << mismatch;
    give_up(remote);
    return none;
  }
  const SharedRemote& shared = shared_[remote->key];
  if (!shared.puller.empty()) return std::nullopt;  // another choice loads it: wait for its blocks
  if (shared.consumed) {  // loaded for another choice (its blocks are shared here) or released
    sched::MatchedTokens m;
    if (shared.loaded_prompt == remote->prompt) m.share_from = shared.loaded_by;
    give_up(remote);
    return m;
  }
  sched::MatchedTokens m;
  m.num_tokens = request.num_prompt_tokens() - num_computed_tokens;
  m.load_async = true;
  return m;
}

void PullScheduler::update_state_after_alloc(const sched::Request& request,
                                             const std::vector<kv::BlockId>& block_ids,
                                             int64_t num_external_tokens) {
  if (!o_.consumer) return;
  Remote* remote = remote_of(request);
  if (remote == nullptr || !remote->pending) return;
  if (num_external_tokens == 0) {  // nothing to pull after all (local prefix hits)
    give_up(remote);
    return;
  }
  remote->pending = false;
  SharedRemote& shared = shared_[remote->key];
  --shared.pending_refs;
  shared.puller = request.request_id;
  shared.loaded_prompt = remote->prompt;
  pullers_[request.request_id] = Puller{remote->key, false};
  // Local prefix hits are whole blocks; the blocks after them come from P, index for index.
  const int64_t first = request.num_computed_tokens / o_.block_size;
  const int64_t last =
      std::min<int64_t>(cdiv(request.num_computed_tokens + num_external_tokens, o_.block_size),
                        static_cast<int64_t>(block_ids.size()));
  RecvTask t;
  t.req_id = request.request_id;
  t.remote = remote->params;
  if (t.remote.remote_tp_size == 0) t.remote.remote_tp_size = o_.remote_tp_size;
  if (t.remote.remote_pp_size == 0) t.remote.remote_pp_size = o_.remote_pp_size;
  for (int64_t i = first; i < last; ++i) {
    t.remote_block_ids.push_back(remote->params.remote_block_ids[static_cast<size_t>(i)]);
    t.local_block_ids.push_back(block_ids[static_cast<size_t>(i)]);
  }
  next_.recvs.push_back(std::move(t));
}

std::vector<uint8_t> PullScheduler::build_connector_meta(const sched::SchedulerOutput&,
                                                         const kv::KvCacheManager&) {
  if (next_.new_leases.empty() && next_.recvs.empty()) return {};
  Bytes out = encode_step_meta(next_);
  next_ = {};
  return out;
}

void PullScheduler::update_connector_output(const sched::KvTransferReport& report) {
  auto load_ended = [&](const std::string& id, bool loaded) {
    auto it = pullers_.find(id);
    if (it == pullers_.end()) return;
    const std::string key = it->second.key;
    if (auto s = shared_.find(key); s != shared_.end()) {
      s->second.puller.clear();
      s->second.consumed = true;  // its DONE went to P, whatever the outcome
      if (loaded && !it->second.finished) s->second.loaded_by = id;
    }
    remember_consumed(key);
    if (it->second.finished || !loaded) pullers_.erase(it);
    forget_if_unused(key);
  };
  for (const std::string& id : report.finished_recving) load_ended(id, true);
  for (const auto& failed : report.failed_recving) load_ended(failed.first, false);
}

sched::FinishedHandoff PullScheduler::request_finished(const sched::Request& request,
                                                       const std::vector<kv::BlockId>& block_ids) {
  if (auto it = remotes_.find(request.request_id); it != remotes_.end()) {
    if (it->second.pending) give_up(&it->second);  // refused or aborted before blocks
    remotes_.erase(it);
  }
  if (auto it = pullers_.find(request.request_id); it != pullers_.end()) {
    auto s = shared_.find(it->second.key);
    if (s != shared_.end() && s->second.puller == request.request_id) {
      it->second.finished = true;  // the load reports later; its blocks are not to be shared
    } else {
      const std::string key = it->second.key;
      if (s != shared_.end() && s->second.loaded_by == request.request_id)
        s->second.loaded_by.clear();
      pullers_.erase(it);
      forget_if_unused(key);
    }
  }
  sched::FinishedHandoff h;
  if (!o_.producer || request.kv_transfer_params.empty()) return h;
  auto params = parse_pull_params(request.kv_transfer_params);
  // Only a prefill that ran to its one token hands its KV over (vllm-ascend: length-capped).
  if (!params.ok() || !params->do_remote_decode ||
      request.finish_reason != sched::FinishReason::kLength || block_ids.empty())
    return h;
  Handoff off;
  off.engine_id = o_.engine_id;
  off.request_id = request.request_id;
  off.host = o_.host;
  off.port = o_.side_channel_port;
  off.tp_size = o_.tp_size;
  off.pp_size = o_.pp_size;
  off.block_size = o_.block_size;
  const size_t n = std::min(block_ids.size(),
                            static_cast<size_t>(cdiv(request.num_prompt_tokens(), o_.block_size)));
  off.block_ids.assign(block_ids.begin(), block_ids.begin() + static_cast<std::ptrdiff_t>(n));
  if (!request.output_token_ids.empty()) off.last_token_id = request.output_token_ids.back();
  off.prompt_hash = prompt_hash(request.prompt_token_ids);
  h.delay_free = true;
  h.kv_transfer_params = handoff_json(off).dump();
  next_.new_leases.push_back(request.request_id);
  return h;
}

void PullWorker::register_kv_cache(model::LatentKvCache* cache, int layer_begin, int layer_end) {
  if (o_.producer) {
    PullSenderOptions s;
    s.engine_id = o_.engine_id;
    s.bind_host = o_.host;
    s.port = worker_port(o_.side_channel_port, pp_rank_, 0, o_.tp_size);
    s.lease_seconds = o_.lease_seconds;
    auto started = PullSender::start(std::move(s), cache, layer_begin, layer_end);
    if (!started.ok()) {
      init_ = started.status();
      LOG(ERROR) << "pull connector: " << init_.message();
      return;
    }
    sender_ = std::move(started).value();
  }
  if (o_.consumer) {
    cache->commit();  // pulls write fresh blocks all the time
    PullReceiverOptions r;
    r.transfer_timeout_ms = o_.transfer_timeout_ms;
    r.default_remote_tp = o_.remote_tp_size;
    r.default_remote_pp = o_.remote_pp_size;
    receiver_ = std::make_unique<PullReceiver>(r, cache, layer_begin, layer_end);
  }
}

common::Status PullWorker::start_load_kv(const std::vector<uint8_t>& metadata) {
  CP_RETURN_IF_ERROR(init_);
  CP_ASSIGN_OR_RETURN(PullStepMeta meta, decode_step_meta(metadata));
  if (sender_) sender_->add_leases(meta.new_leases);
  if (receiver_) receiver_->enqueue(std::move(meta.recvs));
  return {};
}

worker::FinishedTransfers PullWorker::get_finished(const std::vector<std::string>&) {
  worker::FinishedTransfers report;
  if (sender_) sender_->take_finished(&report.finished_sending, &report.stats);
  if (receiver_) receiver_->take_finished(&report);
  return report;
}

}  // namespace transfer
