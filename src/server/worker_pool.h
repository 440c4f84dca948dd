// WorkerPool: a fixed set of threads for the API server's CPU work (parsing, tokenizing,
// formatting engine outputs), and serial queues on it: tasks posted to one Serial run one at a
// time, in order. Thread-safe; the destructor waits for the tasks already posted.
#pragma once

#include <functional>
#include <memory>

namespace server {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void post(std::function<void()> task);

  class Serial {
   public:
    virtual ~Serial() = default;
    virtual void post(std::function<void()> task) = 0;
  };
  std::shared_ptr<Serial> make_serial();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace server
