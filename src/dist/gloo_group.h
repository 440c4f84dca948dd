// GlooGroup: the collectives of ranks on different hosts, through gloo's TCP transport
// (Debian's libgloo-dev). Ranks meet in our rendezvous store, which gloo's full-mesh
// handshake uses through a small adapter. gloo reports failures by throwing; every call here
// catches and returns a Status, and a group that failed once stays failed (gloo's pairs are
// left in an unknown state). An op in flight is bounded by the group's timeout. A peer that
// dies resets its TCP connections, which ends most ops at once, but not a send gloo had
// already posted to that peer (its Pair::signalException skips unbound buffers in its send
// queue; Debian's gloo 5b14351): that op waits for the timeout. So the group also keeps a
// PeerLiveness mesh and a watcher thread: a peer's end fails every later op at once, and an op
// still blocked a second after it calls options.on_stuck.
// Thread-safety: as ProcessGroup.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dist/peer_liveness.h"
#include "dist/process_group.h"
#include "dist/rendezvous_store.h"

namespace gloo {
class Context;
}

namespace dist {

struct GlooGroupOptions : GroupOptions {
  std::string address;  // the IP (or host name) this rank listens on for its peers
};

class GlooGroup : public ProcessGroup {
 public:
  // Connects the full mesh; keys under `prefix` in the store.
  static common::Result<std::unique_ptr<GlooGroup>> create(StoreClient& store,
                                                           const std::string& prefix,
                                                           const GlooGroupOptions& options);
  ~GlooGroup() override;

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  const char* backend() const override { return "gloo"; }
  common::Status all_reduce(float* data, size_t count, ReduceOp op) override;
  common::Status all_reduce(int64_t* data, size_t count, ReduceOp op) override;
  common::Status all_gather(const void* in, size_t bytes, void* out) override;
  common::Status reduce_scatter(const float* in, float* out, size_t count) override;
  common::Status all_to_all_v(const void* in, const std::vector<size_t>& send_bytes, void* out,
                              const std::vector<size_t>& recv_bytes) override;
  common::Status broadcast(void* data, size_t bytes, int root) override;
  common::Status barrier() override;
  void abort(const std::string& why) override;

 private:
  explicit GlooGroup(GlooGroupOptions o) : o_(std::move(o)) {}
  // Runs one gloo call: a failure (gloo throws) fails this op and the group.
  template <typename F>
  common::Status run(const char* what, F&& call);
  template <typename T>
  common::Status reduce(T* data, size_t count, ReduceOp op);
  // The watcher thread: fails the group when a peer ends; calls on_stuck (once) when an op is
  // still blocked a second later.
  void watch_peers();

  GlooGroupOptions o_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<PeerLiveness> liveness_;
  std::thread watcher_;
  std::atomic<bool> stop_{false};
  std::atomic<double> op_since_{0};  // when the op in flight started (now_seconds); 0: none
  std::mutex mu_;                    // guards failed_
  std::string failed_;               // why the group is unusable; empty while it works
};

}  // namespace dist
