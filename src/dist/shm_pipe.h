// ShmPipe: a one-way byte stream through a ring in shared memory (a memfd), for one writer and
// one reader in the same or in different processes (the fd is inherited across exec). Blocking
// waits use futexes on the shared counters, with a periodic wake-up so a close is seen promptly.
// Thread-safety: one writer thread and one reader thread at a time; close() from any thread.
// Invariant: 0 <= written - read <= capacity.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace dist {

class ShmPipe {
 public:
  // A new ring of `capacity` bytes (rounded up to pages). The fd is close-on-exec; a launcher
  // clears that flag in the child that should inherit it.
  static common::Result<ShmPipe> create(size_t capacity);
  // Maps the ring behind an fd made by create() (e.g. inherited from the parent).
  static common::Result<ShmPipe> attach(int fd);

  ShmPipe(ShmPipe&& other) noexcept;
  ShmPipe& operator=(ShmPipe&& other) noexcept;
  ShmPipe(const ShmPipe&) = delete;
  ShmPipe& operator=(const ShmPipe&) = delete;
  ~ShmPipe();

  int fd() const { return fd_; }
  // Blocks until all n bytes are in the ring; fails once the pipe is closed.
  common::Status write(const void* data, size_t n);
  // Blocks until n bytes were read; fails when the pipe is closed and nothing is left to read.
  common::Status read(void* data, size_t n);
  // Marks the pipe closed for both ends and wakes them. Idempotent.
  void close();
  bool closed() const;

 private:
  struct Header;
  ShmPipe() = default;
  Header* header_ = nullptr;
  uint8_t* ring_ = nullptr;
  size_t map_bytes_ = 0;
  int fd_ = -1;
};

}  // namespace dist
