// GlooGroup: the collectives of ranks on different hosts, through gloo's TCP transport
// (Debian's libgloo-dev). Ranks meet in our rendezvous store, which gloo's full-mesh
// handshake uses through a small adapter. gloo reports failures by throwing; every call here
// catches and returns a Status, and a group that failed once stays failed (gloo's pairs are
// left in an unknown state). An op in flight is bounded by the group's timeout; a peer that
// dies resets its TCP connections, which ends the op at once.
// Thread-safety: as ProcessGroup.
#pragma once

#include <memory>
#include <mutex>
#include <string>

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

  GlooGroupOptions o_;
  std::shared_ptr<gloo::Context> context_;
  std::mutex mu_;       // guards failed_
  std::string failed_;  // why the group is unusable; empty while it works
};

}  // namespace dist
