// Futex waits and wakes on 32-bit words that may live in memory shared between processes
// (hence the non-private futex operations). Thread-safe.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <ctime>

namespace dist {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

// Sleeps while *word == expected, at most timeout_ms (callers re-check their conditions).
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  timespec timeout{timeout_ms / 1000, (timeout_ms % 1000) * 1000L * 1000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace dist
