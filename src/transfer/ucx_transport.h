// UcxTransport: one-sided reads of registered memory over UCX (libucx, Debian's libucx-dev),
// the data path of the pull connector. The serving side registers regions and publishes its
// worker address and packed remote keys; the reading side connects to that address and reads
// byte ranges straight into its own memory. Over TCP UCX emulates the read, so the serving side
// must keep its worker progressing (progress / wait_fd). One transport object per thread: UCX
// runs in single-thread mode, and every call on an object must come from the same thread. The
// implementation (ucx_transport.cpp) is built as a plugin; ucx_loader.cpp loads it.
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
  // Loads the UCX plugin (libchunkpipe_ucx.so, beside the binary) on first use, so a process
  // that never moves KV never maps UCX, whose memory hooks (libucm) patch mmap and madvise for
  // the whole process. Fails naming the plugin when it cannot be loaded.
  static common::Result<std::unique_ptr<UcxTransport>> create();
  virtual ~UcxTransport() = default;

  // This worker's address, for a peer's connect().
  virtual const std::vector<uint8_t>& address() const = 0;

  // Serving side. Registers [base, base + length) and returns its packed remote key.
  virtual common::Result<std::vector<uint8_t>> register_region(void* base, size_t length) = 0;
  // Runs pending communication; call whenever wait_fd() is readable, then arm() before waiting.
  virtual void progress() = 0;
  // A file descriptor that becomes readable when there is work; -1 if UCX offers none (then
  // progress() must be called periodically).
  virtual int wait_fd() const = 0;
  // True: safe to sleep on wait_fd(); false: more work is pending, progress() again first.
  virtual bool arm() = 0;

  // Reading side. Opens (or reuses) the endpoint to the peer at `address` with its regions'
  // packed keys; returns a handle for read(). A peer that fails is forgotten (drop_peer).
  virtual common::Result<int> connect(const std::vector<uint8_t>& address,
                                      const std::vector<std::vector<uint8_t>>& rkeys) = 0;
  // Issues every read and waits for all of them; fails on a peer error or after timeout_ms
  // (outstanding reads are cancelled, and the destination bytes are then undefined).
  virtual common::Status read(int peer, const std::vector<UcxRead>& reads, int64_t timeout_ms) = 0;
  virtual void drop_peer(int peer) = 0;
};

// The plugin's entry point (extern "C" so that the loader finds it by name): a new transport,
// or null with *error set.
using UcxTransportFactory = UcxTransport* (*)(std::string* error);
inline constexpr const char* kUcxFactorySymbol = "chunkpipe_ucx_transport_create";

}  // namespace transfer
