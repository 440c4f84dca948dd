// ThreadPool: a fixed set of worker threads for fork-join data parallelism inside one forward.
// parallel_for splits [0, n) into one contiguous range per thread; the caller runs range 0.
// parallel_for_dynamic hands out fixed-size pieces instead: each thread's own share first.
// Not reentrant: one parallel_for at a time per pool (the owning worker thread calls it).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace common {

class ThreadPool {
 public:
  // Range body: fn(begin, end, thread_index).
  using RangeFn = std::function<void(int64_t, int64_t, int)>;

  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Pins thread i of the pool (the caller is thread 0) to cpus[i % cpus.size()]. Call from the
  // thread that will use the pool. Returns false if the OS refused.
  bool pin_threads(const std::vector<int>& cpus);

  // Runs fn over [0, n) split into at most num_threads() ranges of at least `grain` items.
  void parallel_for(int64_t n, int64_t grain, const RangeFn& fn);
  // Runs fn over [0, n) in pieces of `piece` items (the last may be shorter, every other starts
  // on a multiple of `piece`). Each thread takes the pieces of its own contiguous share in order,
  // then those still left in the others' shares, so that a thread slowed down (a busy core, a
  // slower share of the memory bandwidth) is helped instead of holding the others at the join.
  // fn runs once per piece, possibly many times on one thread.
  void parallel_for_dynamic(int64_t n, int64_t piece, const RangeFn& fn);

 private:
  void worker_loop(int thread_index);

  int num_threads_;
  std::vector<std::thread> workers_;
  const RangeFn* task_ = nullptr;
  int64_t task_n_ = 0;
  int task_parts_ = 0;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace common
