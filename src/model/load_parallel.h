// Row-parallel copying for the weight loader: a large tensor's rows are split over every
// hardware thread, so a copy out of the page cache runs at memory speed rather than one core's.
// A thread already working for a parallel load (one expert per thread) copies alone, so the
// machine is never oversubscribed. Thread-safe: the nesting mark is per thread.
#pragma once

#include <cstdint>
#include <functional>

namespace model {

// Runs fn(row_begin, row_end) over disjoint ranges covering [0, rows): on every hardware thread
// when the rows hold at least kParallelCopyBytes and this thread is not inside a
// ParallelLoadScope, else once on the calling thread.
inline constexpr int64_t kParallelCopyBytes = int64_t{32} << 20;
void for_each_row_range(int64_t rows, int64_t row_bytes,
                        const std::function<void(int64_t, int64_t)>& fn);

// The number of threads a parallel load uses: every core this process may run on, at least 1.
int load_threads();

// Marks the calling thread as a worker of a parallel load while the scope lives.
class ParallelLoadScope {
 public:
  ParallelLoadScope();
  ~ParallelLoadScope();
  ParallelLoadScope(const ParallelLoadScope&) = delete;
  ParallelLoadScope& operator=(const ParallelLoadScope&) = delete;

 private:
  bool outer_;
};

}  // namespace model
