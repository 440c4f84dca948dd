// gloo behind ProcessGroup: the store adapter, the full-mesh connect, and one gloo call per
// collective.
#include "dist/gloo_group.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <vector>

#include "common/timer.h"

namespace dist {
namespace {

// gloo's rendezvous store interface over our store, with keys under one prefix. gloo calls it
// only from the thread that connects the group.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(StoreClient& store, std::string prefix)
      : store_(store), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    const common::Status st = store_.set(prefix_ + key, Bytes(data.begin(), data.end()));
    if (!st.ok()) throw std::runtime_error(st.message());
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_.get(prefix_ + key);
    if (!value.ok()) throw std::runtime_error(value.status().message());
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const std::string& key : keys) get(key);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    wait(keys);  // the store's own timeout bounds each key
  }

 private:
  StoreClient& store_;
  std::string prefix_;
};

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

common::Result<std::unique_ptr<GlooGroup>> GlooGroup::create(StoreClient& store,
                                                             const std::string& prefix,
                                                             const GlooGroupOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size)
    return common::invalid_argument(options.name + ": rank " + std::to_string(options.rank) +
                                    " of " + std::to_string(options.size) + " is out of range");
  std::unique_ptr<GlooGroup> g(new GlooGroup(options));
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(millis(options.timeout_s));
    StoreAdapter adapter(store, prefix);
    context->connectFullMesh(adapter, device);
    g->context_ = context;
  } catch (const std::exception& e) {
    return common::unavailable(options.name + ": rank " + std::to_string(options.rank) +
                               " could not connect to its peers through gloo (listening on '" +
                               options.address + "'): " + e.what());
  }
  auto liveness = PeerLiveness::connect(store, prefix + "liveness/", options.rank, options.size,
                                        options.address);
  if (!liveness.ok())
    return common::unavailable(options.name + ": rank " + std::to_string(options.rank) + ": " +
                               liveness.status().message());
  g->liveness_ = std::move(*liveness);
  g->watcher_ = std::thread([p = g.get()] { p->watch_peers(); });
  return g;
}

GlooGroup::~GlooGroup() {
  stop_ = true;
  if (watcher_.joinable()) watcher_.join();
}

void GlooGroup::watch_peers() {
  // Longer than a live peer's lag inside one collective; short against the group's timeout.
  constexpr double kStuckAfterLoss_s = 1.0;
  double lost_at = 0;
  std::string why;
  bool reported = false;
  while (!stop_) {
    if (lost_at == 0) {
      const int peer = liveness_->wait_for_loss(100);
      if (peer < 0) continue;
      lost_at = common::now_seconds();
      why = o_.name + ": rank " + std::to_string(peer) +
            "'s process ended (its connection to rank " + std::to_string(o_.rank) + " closed)";
      abort(why);
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double since = op_since_.load(), now = common::now_seconds();
    if (!reported && o_.on_stuck && since > 0 &&
        now - std::max(since, lost_at) >= kStuckAfterLoss_s) {
      reported = true;
      o_.on_stuck(why + "; rank " + std::to_string(o_.rank) +
                  " is still blocked in a collective that gloo does not end");
    }
  }
}

void GlooGroup::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.empty()) failed_ = why;
}

template <typename F>
common::Status GlooGroup::run(const char* what, F&& call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.empty())
      return common::unavailable(o_.name + ": " + what + " on rank " + std::to_string(o_.rank) +
                                 ": the group failed earlier: " + failed_);
  }
  try {
    op_since_ = common::now_seconds();
    call();
    op_since_ = 0;
    return {};
  } catch (const std::exception& e) {
    op_since_ = 0;
    const std::string why = e.what();
    abort(why);
    const bool timed_out =
        why.find("Timed out") != std::string::npos || why.find("timed out") != std::string::npos;
    const std::string message =
        o_.name + ": " + what + " failed on rank " + std::to_string(o_.rank) + ": " + why;
    return timed_out ? common::deadline_exceeded(message) : common::unavailable(message);
  }
}

template <typename T>
common::Status GlooGroup::reduce(T* data, size_t count, ReduceOp op) {
  if (count == 0) return {};
  return run("all_reduce", [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    using Fn = void (*)(void*, const void*, const void*, size_t);
    opts.setReduceFunction(op == ReduceOp::kSum ? Fn(&gloo::sum<T>) : Fn(&gloo::max<T>));
    opts.setTimeout(millis(o_.timeout_s));
    gloo::allreduce(opts);
  });
}

common::Status GlooGroup::all_reduce(float* data, size_t count, ReduceOp op) {
  return reduce(data, count, op);
}

common::Status GlooGroup::all_reduce(int64_t* data, size_t count, ReduceOp op) {
  return reduce(data, count, op);
}

common::Status GlooGroup::all_gather(const void* in, size_t bytes, void* out) {
  if (bytes == 0) return {};
  return run("all_gather", [&] {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
    opts.setOutput(static_cast<uint8_t*>(out), bytes * size_t(o_.size));
    opts.setTimeout(millis(o_.timeout_s));
    gloo::allgather(opts);
  });
}

// gloo 0.5 has no reduce-scatter call outside its old algorithm classes: an all-reduce of
// the whole input, then this rank's slice (twice the traffic of a true reduce-scatter; TP
// uses all-reduce, so this is not on a hot path).
common::Status GlooGroup::reduce_scatter(const float* in, float* out, size_t count) {
  std::vector<float> all(in, in + count * size_t(o_.size));
  CP_RETURN_IF_ERROR(reduce(all.data(), all.size(), ReduceOp::kSum));
  std::copy(all.begin() + std::ptrdiff_t(count) * o_.rank,
            all.begin() + std::ptrdiff_t(count) * (o_.rank + 1), out);
  return {};
}

common::Status GlooGroup::all_to_all_v(const void* in, const std::vector<size_t>& send_bytes,
                                       void* out, const std::vector<size_t>& recv_bytes) {
  if (send_bytes.size() != size_t(o_.size) || recv_bytes.size() != size_t(o_.size))
    return common::invalid_argument(o_.name + ": all_to_all_v needs one count per rank");
  // gloo wants a non-null buffer even when this rank sends or receives nothing.
  uint8_t dummy = 0;
  auto* src = const_cast<uint8_t*>(static_cast<const uint8_t*>(in));
  auto* dst = static_cast<uint8_t*>(out);
  return run("all_to_all_v", [&] {
    gloo::AlltoallvOptions opts(context_);
    opts.setInput(src != nullptr ? src : &dummy,
                  std::vector<int64_t>(send_bytes.begin(), send_bytes.end()));
    opts.setOutput(dst != nullptr ? dst : &dummy,
                   std::vector<int64_t>(recv_bytes.begin(), recv_bytes.end()));
    opts.setTimeout(millis(o_.timeout_s));
    gloo::alltoallv(opts);
  });
}

common::Status GlooGroup::broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= o_.size)
    return common::invalid_argument(o_.name + ": broadcast root " + std::to_string(root) +
                                    " is not a rank");
  if (bytes == 0) return {};
  return run("broadcast", [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTimeout(millis(o_.timeout_s));
    gloo::broadcast(opts);
  });
}

common::Status GlooGroup::barrier() {
  return run("barrier", [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(millis(o_.timeout_s));
    gloo::barrier(opts);
  });
}

}  // namespace dist
