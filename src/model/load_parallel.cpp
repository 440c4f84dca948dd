// Splits a copy's rows over std::threads started per call: a load makes a few hundred such
// copies of 32 MiB or more, so starting threads costs far less than the copies themselves.
#include "model/load_parallel.h"

#include <sched.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace model {
namespace {
thread_local bool t_in_parallel_load = false;
}  // namespace

int load_threads() {
  // The cores this process may run on (a --numa-bind rank, taskset, a cpuset), else all.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ParallelLoadScope::ParallelLoadScope() : outer_(t_in_parallel_load) {
  t_in_parallel_load = true;
}
ParallelLoadScope::~ParallelLoadScope() {
  t_in_parallel_load = outer_;
}

void for_each_row_range(int64_t rows, int64_t row_bytes,
                        const std::function<void(int64_t, int64_t)>& fn) {
  const int threads = static_cast<int>(std::min<int64_t>(load_threads(), rows));
  if (t_in_parallel_load || threads <= 1 || rows * row_bytes < kParallelCopyBytes) {
    if (rows > 0) fn(0, rows);
    return;
  }
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) {
    workers.emplace_back([&, t] {
      ParallelLoadScope scope;
      fn(rows * t / threads, rows * (t + 1) / threads);
    });
  }
  {
    ParallelLoadScope scope;
    fn(0, rows / threads);
  }
  for (std::thread& w : workers) w.join();
}

}  // namespace model
