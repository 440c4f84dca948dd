// UcxTransport: one-sided reads of registered memory over UCX (libucx, Debian's libucx-dev),
// the data path of the pull connector. The serving side registers regions and publishes its
// worker address and packed remote keys; the reading side connects to that address and reads
// byte ranges straight into its own memory. Over TCP UCX emulates the read, so the serving side
// must keep its worker progressing (progress / wait_fd). One transport object per thread: UCX
// runs in single-thread mode, and every call on an object must come from the same thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace transfer {

// One read: `length` bytes at `remote_addr` (inside region `region` of the peer) into `local`.
struct UcxRead {
  void* local = nullptr;
  uint64_t remote_addr = 0;
  size_t length = 0;
  int region = 0;
};

class UcxTransport {
 public:
  static common::Result<std::unique_ptr<UcxTransport>> create();
  ~UcxTransport();
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // This worker's address, for a peer's connect().
  const std::vector<uint8_t>& address() const { return address_; }

  // Serving side. Registers [base, base + length) and returns its packed remote key.
  common::Result<std::vector<uint8_t>> register_region(void* base, size_t length);
  // Runs pending communication; call whenever wait_fd() is readable, then arm() before waiting.
  void progress();
  // A file descriptor that becomes readable when there is work; -1 if UCX offers none (then
  // progress() must be called periodically).
  int wait_fd() const { return efd_; }
  // True: safe to sleep on wait_fd(); false: more work is pending, progress() again first.
  bool arm();

  // Reading side. Opens (or reuses) the endpoint to the peer at `address` with its regions'
  // packed keys; returns a handle for read(). A peer that fails is forgotten (drop_peer).
  common::Result<int> connect(const std::vector<uint8_t>& address,
                              const std::vector<std::vector<uint8_t>>& rkeys);
  // Issues every read and waits for all of them; fails on a peer error or after timeout_ms
  // (outstanding reads are cancelled, and the destination bytes are then undefined).
  common::Status read(int peer, const std::vector<UcxRead>& reads, int64_t timeout_ms);
  void drop_peer(int peer);

 private:
  struct Peer;
  struct Region;
  UcxTransport() = default;

  void* context_ = nullptr;  // ucp_context_h
  void* worker_ = nullptr;   // ucp_worker_h
  std::vector<uint8_t> address_;
  int efd_ = -1;
  std::vector<std::unique_ptr<Region>> regions_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by handle; null once dropped
};

}  // namespace transfer
