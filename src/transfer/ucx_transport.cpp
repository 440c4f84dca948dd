// The UCX plugin: context, worker, registrations and endpoints (UcxTransport's implementation,
// built into libchunkpipe_ucx.so; nothing else links libucp).
#include "transfer/ucx_transport.h"

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

namespace transfer {
namespace {

common::Status ucx_error(const std::string& what, ucs_status_t s) {
  return common::Status(common::StatusCode::kInternal, "UCX " + what + ": " + ucs_status_string(s));
}

ucp_context_h ctx(void* p) {
  return static_cast<ucp_context_h>(p);
}
ucp_worker_h wrk(void* p) {
  return static_cast<ucp_worker_h>(p);
}

class UcxTransportImpl final : public UcxTransport {
 public:
  static common::Result<std::unique_ptr<UcxTransportImpl>> create();
  ~UcxTransportImpl() override;
  const std::vector<uint8_t>& address() const override { return address_; }
  common::Result<std::vector<uint8_t>> register_region(void* base, size_t length) override;
  void progress() override;
  int wait_fd() const override { return efd_; }
  bool arm() override;
  common::Result<int> connect(const std::vector<uint8_t>& address,
                              const std::vector<std::vector<uint8_t>>& rkeys) override;
  common::Status read(int peer, const std::vector<UcxRead>& reads, int64_t timeout_ms) override;
  void drop_peer(int peer) override;

 private:
  struct Region {
    ucp_mem_h memh = nullptr;
  };
  struct Peer {
    std::vector<uint8_t> address;
    ucp_ep_h ep = nullptr;
    std::vector<ucp_rkey_h> rkeys;
    bool failed = false;
    ucs_status_t error = UCS_OK;
  };
  void* context_ = nullptr;  // ucp_context_h
  void* worker_ = nullptr;   // ucp_worker_h
  std::vector<uint8_t> address_;
  int efd_ = -1;
  std::vector<std::unique_ptr<Region>> regions_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by handle; null once dropped
};

}  // namespace

common::Result<std::unique_ptr<UcxTransportImpl>> UcxTransportImpl::create() {
  std::unique_ptr<UcxTransportImpl> t(new UcxTransportImpl());
  ucp_config_t* config = nullptr;
  // KV blocks are read in runs of hundreds of KiB: TCP segments of 64 KiB instead of UCX's 8
  // KiB pulled 2-4x faster on loopback (bench/kv_pull_bench). A value in the environment wins
  // (setenv without overwrite, before UCX reads its configuration).
  setenv("UCX_TCP_TX_SEG_SIZE", "64k", /*overwrite=*/0);
  setenv("UCX_TCP_RX_SEG_SIZE", "64k", /*overwrite=*/0);
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return ucx_error("config", s);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) return ucx_error("init", s);
  t->context_ = context;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  s = ucp_worker_create(context, &wp, &worker);
  if (s != UCS_OK) return ucx_error("worker", s);
  t->worker_ = worker;
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  s = ucp_worker_get_address(worker, &addr, &len);
  if (s != UCS_OK) return ucx_error("worker address", s);
  const auto* bytes = reinterpret_cast<const uint8_t*>(addr);
  t->address_.assign(bytes, bytes + len);
  ucp_worker_release_address(worker, addr);
  if (ucp_worker_get_efd(worker, &t->efd_) != UCS_OK) t->efd_ = -1;
  return t;
}

UcxTransportImpl::~UcxTransportImpl() {
  for (size_t i = 0; i < peers_.size(); ++i) drop_peer(static_cast<int>(i));
  for (auto& r : regions_) ucp_mem_unmap(ctx(context_), r->memh);
  if (worker_ != nullptr) ucp_worker_destroy(wrk(worker_));
  if (context_ != nullptr) ucp_cleanup(ctx(context_));
}

common::Result<std::vector<uint8_t>> UcxTransportImpl::register_region(void* base, size_t length) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = base;
  mp.length = length;
  auto region = std::make_unique<Region>();
  ucs_status_t s = ucp_mem_map(ctx(context_), &mp, &region->memh);
  if (s != UCS_OK) return ucx_error("mem_map", s);
  void* packed = nullptr;
  size_t size = 0;
  s = ucp_rkey_pack(ctx(context_), region->memh, &packed, &size);
  if (s != UCS_OK) {
    ucp_mem_unmap(ctx(context_), region->memh);
    return ucx_error("rkey_pack", s);
  }
  std::vector<uint8_t> key(static_cast<uint8_t*>(packed), static_cast<uint8_t*>(packed) + size);
  ucp_rkey_buffer_release(packed);
  regions_.push_back(std::move(region));
  return key;
}

void UcxTransportImpl::progress() {
  while (ucp_worker_progress(wrk(worker_)) != 0) {
  }
}

bool UcxTransportImpl::arm() {
  return ucp_worker_arm(wrk(worker_)) == UCS_OK;
}

common::Result<int> UcxTransportImpl::connect(const std::vector<uint8_t>& address,
                                              const std::vector<std::vector<uint8_t>>& rkeys) {
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i] && !peers_[i]->failed && peers_[i]->address == address &&
        peers_[i]->rkeys.size() == rkeys.size())
      return static_cast<int>(i);
  }
  auto peer = std::make_unique<Peer>();
  peer->address = address;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer->address.data());
  // Peer error handling: a dead peer fails its reads instead of hanging them (UCX then picks
  // only transports that can detect it).
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
    auto* p = static_cast<Peer*>(arg);
    p->failed = true;
    p->error = status;
  };
  ep.err_handler.arg = peer.get();
  ucs_status_t s = ucp_ep_create(wrk(worker_), &ep, &peer->ep);
  if (s != UCS_OK) return ucx_error("ep_create", s);
  for (const auto& key : rkeys) {
    ucp_rkey_h rkey = nullptr;
    s = ucp_ep_rkey_unpack(peer->ep, key.data(), &rkey);
    if (s != UCS_OK) {
      peers_.push_back(std::move(peer));
      drop_peer(static_cast<int>(peers_.size()) - 1);
      return ucx_error("rkey_unpack", s);
    }
    peer->rkeys.push_back(rkey);
  }
  peers_.push_back(std::move(peer));
  return static_cast<int>(peers_.size()) - 1;
}

common::Status UcxTransportImpl::read(int handle, const std::vector<UcxRead>& reads,
                                      int64_t timeout_ms) {
  if (handle < 0 || handle >= static_cast<int>(peers_.size()) || !peers_[handle])
    return common::invalid_argument("UCX read: no such peer");
  Peer& peer = *peers_[handle];
  std::vector<void*> pending;
  common::Status status;
  for (const UcxRead& r : reads) {
    if (r.region < 0 || r.region >= static_cast<int>(peer.rkeys.size())) {
      status = common::invalid_argument("UCX read: region " + std::to_string(r.region));
      break;
    }
    ucp_request_param_t p{};
    ucs_status_ptr_t req =
        ucp_get_nbx(peer.ep, r.local, r.length, r.remote_addr, peer.rkeys[r.region], &p);
    if (UCS_PTR_IS_ERR(req)) {
      status = ucx_error("get", UCS_PTR_STATUS(req));
      break;
    }
    if (req != nullptr) pending.push_back(req);
  }
  // Flush: the reads of one endpoint complete in any order; wait for each.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!pending.empty()) {
    ucp_worker_progress(wrk(worker_));
    for (size_t i = 0; i < pending.size();) {
      const ucs_status_t s = ucp_request_check_status(pending[i]);
      if (s == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      if (s != UCS_OK && status.ok()) status = ucx_error("get", s);
      ucp_request_free(pending[i]);
      pending[i] = pending.back();
      pending.pop_back();
    }
    if (peer.failed && status.ok()) status = ucx_error("peer", peer.error);
    if ((status.ok() && std::chrono::steady_clock::now() > deadline) ||
        (!status.ok() && !pending.empty())) {
      if (status.ok())
        status = common::Status(common::StatusCode::kInternal,
                                "UCX read timed out after " + std::to_string(timeout_ms) + " ms");
      for (void* req : pending) ucp_request_cancel(wrk(worker_), req);
      // Cancelled requests still complete (with UCS_ERR_CANCELED); collect them for a while.
      // Any left are released to complete on their own, and drop_peer's forced close then
      // fails them, so no late read lands in memory the caller reuses.
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (!pending.empty() && std::chrono::steady_clock::now() < give_up) {
        ucp_worker_progress(wrk(worker_));
        for (size_t i = 0; i < pending.size();) {
          if (ucp_request_check_status(pending[i]) == UCS_INPROGRESS) {
            ++i;
            continue;
          }
          ucp_request_free(pending[i]);
          pending[i] = pending.back();
          pending.pop_back();
        }
      }
      for (void* req : pending) ucp_request_free(req);
      pending.clear();
    }
  }
  if (!status.ok()) drop_peer(handle);
  return status;
}

void UcxTransportImpl::drop_peer(int handle) {
  if (handle < 0 || handle >= static_cast<int>(peers_.size()) || !peers_[handle]) return;
  Peer& peer = *peers_[handle];
  for (ucp_rkey_h k : peer.rkeys) ucp_rkey_destroy(k);
  if (peer.ep != nullptr) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t req = ucp_ep_close_nbx(peer.ep, &p);
    if (UCS_PTR_IS_PTR(req)) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(wrk(worker_));
      ucp_request_free(req);
    }
  }
  peers_[handle].reset();
}

}  // namespace transfer

extern "C" transfer::UcxTransport* chunkpipe_ucx_transport_create(std::string* error) {
  auto t = transfer::UcxTransportImpl::create();
  if (!t.ok()) {
    *error = t.status().message();
    return nullptr;
  }
  return std::move(t).value().release();
}
