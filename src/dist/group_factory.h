// Making a ProcessGroup: the ranks publish where they run in the rendezvous store; a group
// whose ranks all share one host gets the shared-memory backend, any other gets gloo.
// A "host" is one kernel boot and one network namespace: ranks in different namespaces (the
// tests' stand-ins for hosts) talk over the network even though they could share memory.
// Thread-safety: make_process_group uses the store from the calling thread only.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "dist/process_group.h"
#include "dist/rendezvous_store.h"

namespace dist {

enum class GroupBackend { kAuto, kShm, kGloo };

// name: unique per group in the job ("tp.stage0").
struct GroupSpec : GroupOptions {
  GroupSpec() = default;
  GroupSpec(std::string group_name, int group_rank, int group_size) {
    name = std::move(group_name);
    rank = group_rank;
    size = group_size;
  }
  std::string address = "127.0.0.1";  // this rank's IP, for gloo
  GroupBackend backend = GroupBackend::kAuto;
  size_t shm_slot_bytes = 4 << 20;
};

// This process's host, as the groups compare it.
std::string host_identity();

common::Result<std::unique_ptr<ProcessGroup>> make_process_group(StoreClient& store,
                                                                 const GroupSpec& spec);

// An on_stuck for a rank process that cannot serve once its group is dead: logs `why` and ends
// the process with status 1 at once, the path a failed collective takes in such a process.
void exit_process_when_stuck(const std::string& why);

}  // namespace dist
