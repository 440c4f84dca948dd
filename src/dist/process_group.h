// ProcessGroup: one rank's handle on a group of ranks (a TP group, an EP group, a DP group) and
// the collectives among them. Every rank of a group calls the same collectives in the same
// order; each call blocks until the group has done its part, an error, or the group's timeout.
// Results are bitwise identical on every rank (reductions add in rank order).
// Thread-safety: one thread at a time calls collectives; abort() may come from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace dist {

enum class ReduceOp { kSum, kMax };

// What a group is made with, whatever its backend.
struct GroupOptions {
  std::string name;  // names the group in errors ("tp.stage0")
  int rank = 0;
  int size = 1;
  double timeout_s = 300;  // a collective that waits longer fails the group
  // Called (from a watcher thread) when this rank has been blocked in a collective for a
  // second after a peer's process was seen to end, where the backend cannot end the call
  // itself (gloo, gloo_group.h). Empty: the call waits for timeout_s. A worker process whose
  // group is dead sets it to log and exit.
  std::function<void(const std::string& why)> on_stuck;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "shm" (ranks on one host) or "gloo" (TCP, across hosts).
  virtual const char* backend() const = 0;

  // In place: every rank ends with the elementwise reduction over the ranks' `data`.
  virtual common::Status all_reduce(float* data, size_t count, ReduceOp op) = 0;
  virtual common::Status all_reduce(int64_t* data, size_t count, ReduceOp op) = 0;
  // out (size() * bytes) receives every rank's `in`, in rank order.
  virtual common::Status all_gather(const void* in, size_t bytes, void* out) = 0;
  // in holds size() slices of `count` floats; rank r's out is the sum of every rank's slice r.
  virtual common::Status reduce_scatter(const float* in, float* out, size_t count) = 0;
  // Rank r sends send_bytes[p] bytes to rank p, the parts laid out in `in` in rank order; it
  // receives recv_bytes[q] bytes from each rank q into `out`, in rank order. The counts must
  // agree pairwise (r's send_bytes[p] is p's recv_bytes[r]).
  virtual common::Status all_to_all_v(const void* in, const std::vector<size_t>& send_bytes,
                                      void* out, const std::vector<size_t>& recv_bytes) = 0;
  // root's `bytes` bytes at data reach every rank's data.
  virtual common::Status broadcast(void* data, size_t bytes, int root) = 0;
  virtual common::Status barrier() = 0;

  // Fails the collective in progress on this rank (and, where the backend can, on the others)
  // and every later one with `why`.
  virtual void abort(const std::string& why) = 0;
};

}  // namespace dist
