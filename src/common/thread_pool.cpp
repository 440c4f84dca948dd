// ThreadPool implementation: workers spin briefly on a generation counter (cheap hand-off for
// the many small parallel regions of a decode step), then sleep in atomic::wait.
#include "common/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <vector>

namespace common {
namespace {

// ~10-30 us of spinning before sleeping: long enough to bridge the gaps between the small
// parallel regions of one forward, short enough not to starve other processes on a busy host.
constexpr int kSpinIterations = 2000;

inline void cpu_relax() {
  __builtin_ia32_pause();
}

// Contiguous split of [0, n) into `parts` ranges; returns range `i`.
inline std::pair<int64_t, int64_t> split_range(int64_t n, int parts, int i) {
  int64_t base = n / parts, rem = n % parts;
  int64_t begin = i * base + std::min<int64_t>(i, rem);
  return {begin, begin + base + (i < rem ? 1 : 0)};
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const RangeFn& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int parts = static_cast<int>(std::min<int64_t>(num_threads_, (n + grain - 1) / grain));
  if (parts <= 1) {
    fn(0, n, 0);
    return;
  }
  task_ = &fn;
  task_n_ = n;
  task_parts_ = parts;
  // Every worker acknowledges every generation, so none can read the parameters of a later task
  // while still working on an earlier one.
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  auto [b, e] = split_range(n, parts, 0);
  fn(b, e, 0);
  int spins = 0;
  for (int left; (left = pending_.load(std::memory_order_acquire)) != 0;) {
    if (++spins < kSpinIterations) {
      cpu_relax();
    } else {
      pending_.wait(left, std::memory_order_acquire);
    }
  }
  task_ = nullptr;
}

void ThreadPool::parallel_for_dynamic(int64_t n, int64_t piece, const RangeFn& fn) {
  if (n <= 0) return;
  piece = std::max<int64_t>(1, piece);
  // Each thread owns a contiguous share of the pieces and takes them in order, so that a GEMV
  // split this way reads one continuous stream per thread (pieces handed out round-robin made
  // every piece a new stream for the hardware prefetcher: 2-thread decode GEMVs of 1-4 MB read
  // 7-25% slower on a 2-core Zen 5). A thread done with its share then takes the pieces left in
  // the others', from their fronts, with the same counters, so each piece runs exactly once.
  struct alignas(64) Share {
    std::atomic<int64_t> next;
    int64_t end;
  };
  const int64_t pieces = (n + piece - 1) / piece;
  const int parts = static_cast<int>(std::min<int64_t>(pieces, num_threads_));
  std::vector<Share> shares(static_cast<size_t>(parts));
  for (int t = 0; t < parts; ++t) {
    shares[size_t(t)].next.store(pieces * t / parts * piece, std::memory_order_relaxed);
    shares[size_t(t)].end = std::min(n, pieces * (t + 1) / parts * piece);
  }
  parallel_for(parts, 1, [&](int64_t, int64_t, int thread) {
    for (int k = 0; k < parts; ++k) {
      Share& share = shares[size_t((thread + k) % parts)];
      for (int64_t begin;
           (begin = share.next.fetch_add(piece, std::memory_order_relaxed)) < share.end;)
        fn(begin, std::min(share.end, begin + piece), thread);
    }
  });
}

bool ThreadPool::pin_threads(const std::vector<int>& cpus) {
  if (cpus.empty()) return true;
  std::atomic<bool> ok{true};
  parallel_for(num_threads_, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[static_cast<size_t>(i) % cpus.size()], &set);
      if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) ok = false;
    }
  });
  return ok;
}

void ThreadPool::worker_loop(int thread_index) {
  uint32_t seen = 0;  // generation at construction; a late-starting thread still sees task 1
  while (true) {
    int spins = 0;
    uint32_t gen;
    while ((gen = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < kSpinIterations) {
        cpu_relax();
      } else {
        generation_.wait(seen);
      }
    }
    seen = gen;
    if (stop_.load()) return;
    if (thread_index < task_parts_) {
      auto [b, e] = split_range(task_n_, task_parts_, thread_index);
      (*task_)(b, e, thread_index);
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace common
