// WorkerPool over asio's thread_pool; a Serial is an asio strand on it.
#include "server/worker_pool.h"

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>

namespace server {

namespace net = boost::asio;

struct WorkerPool::Impl {
  explicit Impl(int threads) : pool(static_cast<size_t>(std::max(1, threads))) {}
  net::thread_pool pool;
};

namespace {

class StrandSerial final : public WorkerPool::Serial {
 public:
  explicit StrandSerial(net::thread_pool& pool) : strand_(net::make_strand(pool)) {}
  void post(std::function<void()> task) override { net::post(strand_, std::move(task)); }

 private:
  net::strand<net::thread_pool::executor_type> strand_;
};

}  // namespace

WorkerPool::WorkerPool(int threads) : impl_(std::make_unique<Impl>(threads)) {}

WorkerPool::~WorkerPool() {
  impl_->pool.join();
}

void WorkerPool::post(std::function<void()> task) {
  net::post(impl_->pool, std::move(task));
}

std::shared_ptr<WorkerPool::Serial> WorkerPool::make_serial() {
  return std::make_shared<StrandSerial>(impl_->pool);
}

}  // namespace server
