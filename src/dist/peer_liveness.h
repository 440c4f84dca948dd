// PeerLiveness: one idle TCP connection between this rank and every other rank of a group.
// Nothing is ever sent on them; when a peer's process ends (however it ends), its kernel
// closes them, so this side reads EOF at once. gloo alone does not always report that: see
// gloo_group.h. Thread-safety: wait_for_loss from one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "dist/rendezvous_store.h"

namespace dist {

class PeerLiveness {
 public:
  // Listens on `address` (port chosen by the OS), publishes it under prefix + rank, dials every
  // lower rank and accepts every higher one (each waits up to the store's timeout).
  static common::Result<std::unique_ptr<PeerLiveness>> connect(StoreClient& store,
                                                               const std::string& prefix, int rank,
                                                               int size,
                                                               const std::string& address);
  ~PeerLiveness();
  PeerLiveness(const PeerLiveness&) = delete;
  PeerLiveness& operator=(const PeerLiveness&) = delete;

  // Waits up to timeout_ms for a peer's connection to close; returns that peer's rank, or -1.
  // A closed peer is reported once.
  int wait_for_loss(int timeout_ms);

 private:
  PeerLiveness() = default;
  std::vector<int> fds_;  // by rank; -1 for this rank and for peers already reported
};

}  // namespace dist
