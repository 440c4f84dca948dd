// ShmGroup: the collectives of ranks on one host, through one shared-memory segment, as
// vLLM's and SGLang's CPU backends do it (no library does this well for a handful of
// processes on one host: gloo would go through the kernel's TCP stack). Each rank owns a slot
// in each of two slot sets; a collective copies into its slot, meets the others at a barrier
// (a shared counter with futex waits), and reads the slots it needs. Ops alternate between the
// sets, so one barrier per round suffices. A dead peer, a timeout or abort() fails the whole
// group. Thread-safety: as ProcessGroup.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "dist/process_group.h"
#include "dist/rendezvous_store.h"

namespace dist {

struct ShmGroupOptions : GroupOptions {
  size_t slot_bytes = 4 << 20;  // per rank and set; larger collectives run in rounds
};

class ShmGroup : public ProcessGroup {
 public:
  static constexpr int kMaxRanks = 64;
  // Rank 0 creates the segment and publishes its name under `key` in the store; the others
  // attach. Returns once every rank has attached.
  static common::Result<std::unique_ptr<ShmGroup>> create(StoreClient& store,
                                                          const std::string& key,
                                                          const ShmGroupOptions& options);
  ~ShmGroup() override;
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  const char* backend() const override { return "shm"; }
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
  struct Header;
  explicit ShmGroup(ShmGroupOptions o) : o_(std::move(o)) {}
  common::Status map(int fd, bool init);
  // The barrier that ends one round: every rank has written its slot of the current set.
  common::Status sync(const char* what);
  // This rank's slot, and rank p's, in the set the next sync() publishes / the last one did.
  uint8_t* my_next_slot() const;
  const uint8_t* slot(int p) const;
  template <typename T>
  common::Status reduce(T* data, size_t count, ReduceOp op);
  std::string dead_peer() const;
  std::string abort_reason() const;

  ShmGroupOptions o_;
  Header* header_ = nullptr;
  uint8_t* slots_ = nullptr;
  size_t map_bytes_ = 0;
  std::string shm_name_;  // rank 0 until it unlinks the name
  uint32_t epoch_ = 0;    // syncs done
};

}  // namespace dist
