// The prefill worker's side-channel thread and its block leases.
#include "transfer/pull_sender.h"

#include <random>

#include "common/logging.h"
#include "common/timer.h"
#include "dist/request_channel.h"
#include "transfer/ucx_transport.h"

namespace transfer {

common::Result<std::unique_ptr<PullSender>> PullSender::start(PullSenderOptions options,
                                                              model::LatentKvCache* cache,
                                                              int layer_begin, int layer_end) {
  std::unique_ptr<PullSender> s(new PullSender(std::move(options)));
  CP_ASSIGN_OR_RETURN(s->ucx_, UcxTransport::create());
  AgentMetadata meta;
  meta.engine_id = s->options_.engine_id;
  meta.incarnation = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  meta.ucx_address = s->ucx_->address();
  meta.block_size = cache->block_size();
  meta.row_dim = cache->row_dim();
  meta.value_bytes = static_cast<int32_t>(cache->value_bytes());
  meta.num_blocks = cache->num_blocks();
  meta.layer_begin = layer_begin;
  meta.layer_end = layer_end;
  const size_t layer_bytes = size_t(meta.num_blocks) * size_t(meta.block_bytes());
  for (int l = layer_begin; l < layer_end; ++l) {
    CP_ASSIGN_OR_RETURN(Bytes key, s->ucx_->register_region(cache->layer_bytes(l), layer_bytes));
    meta.layer_base.push_back(reinterpret_cast<uint64_t>(cache->layer_bytes(l)));
    meta.rkeys.push_back(std::move(key));
  }
  s->metadata_ = encode_metadata(meta);
  CP_ASSIGN_OR_RETURN(s->server_, dist::RequestServer::bind(s->options_.bind_host, s->options_.port,
                                                            "the KV side channel (kv_port)"));
  LOG(INFO) << "KV side channel on " << s->server_->endpoint() << " serving layers [" << layer_begin
            << ", " << layer_end << ")";
  // The thread owns the UCX worker and the socket from here on.
  s->thread_ = std::thread([p = s.get()] { p->serve_loop(); });
  return s;
}

PullSender::~PullSender() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

void PullSender::serve_loop() {
  bool busy = false;
  while (!stopping_) {
    // Side-channel requests and UCX take turns: a busy UCX worker never starves GET_META.
    const int wait_ms = busy ? 0 : (ucx_->wait_fd() >= 0 ? 50 : 1);
    server_->serve(wait_ms, ucx_->wait_fd(), [this](const Bytes& r) { return handle(r); });
    // Over TCP, UCX serves a peer's read from this side: progress what is there, then arm the
    // wakeup fd before sleeping on it (arm() fails while more work is pending).
    ucx_->progress();
    busy = ucx_->wait_fd() >= 0 && !ucx_->arm();
  }
}

Bytes PullSender::handle(const Bytes& request) {
  SideRequest kind;
  std::string id;
  uint64_t token = 0;
  if (!decode_side_request(request, &kind, &id, &token)) return {};
  if (kind == SideRequest::kGetMeta) return metadata_;
  std::lock_guard<std::mutex> lock(mu_);
  if (!leases_.done(id, token, common::now_seconds())) {
    LOG(WARNING) << "DONE for request " << id << " after its blocks were freed";
    ++late_releases_;
    const std::string text = kExpired;
    return Bytes(text.begin(), text.end());
  }
  const std::string text = kAck;
  return Bytes(text.begin(), text.end());
}

void PullSender::add_leases(const std::vector<std::string>& request_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  leases_.add(request_ids, common::now_seconds());
}

void PullSender::take_finished(std::vector<std::string>* finished, sched::KvTransferStats* stats) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : leases_.expire(common::now_seconds())) {
    LOG(WARNING) << "Force freed expired request " << id << ": no decoder sent DONE within "
                 << options_.lease_seconds << " s";
    ++leases_expired_;
  }
  for (std::string& id : leases_.take_ended()) finished->push_back(std::move(id));
  stats->leases_expired += leases_expired_;
  stats->late_releases += late_releases_;
  leases_expired_ = late_releases_ = 0;
}

}  // namespace transfer
