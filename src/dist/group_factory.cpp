// Backend choice for a new group, from the hosts its ranks publish.
#include "dist/group_factory.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "common/logging.h"
#include "dist/gloo_group.h"
#include "dist/shm_group.h"

namespace dist {

std::string host_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[128] = {0};
  const ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  return boot + "/" + (n > 0 ? std::string(ns, size_t(n)) : std::string("?"));
}

common::Result<std::unique_ptr<ProcessGroup>> make_process_group(StoreClient& store,
                                                                 const GroupSpec& spec) {
  if (spec.size < 1 || spec.rank < 0 || spec.rank >= spec.size)
    return common::invalid_argument(spec.name + ": rank " + std::to_string(spec.rank) + " of " +
                                    std::to_string(spec.size) + " is out of range");
  const std::string me = host_identity();
  CP_RETURN_IF_ERROR(
      store.set(spec.name + "/host/" + std::to_string(spec.rank), Bytes(me.begin(), me.end())));
  bool one_host = true;
  for (int r = 0; r < spec.size; ++r) {
    CP_ASSIGN_OR_RETURN(Bytes host, store.get(spec.name + "/host/" + std::to_string(r)));
    one_host = one_host && std::string(host.begin(), host.end()) == me;
  }
  const bool shm =
      spec.backend == GroupBackend::kShm || (spec.backend == GroupBackend::kAuto && one_host);
  if (shm) {
    if (!one_host)
      return common::invalid_argument(spec.name +
                                      ": the shared-memory backend needs every rank on one host");
    ShmGroupOptions o;
    static_cast<GroupOptions&>(o) = spec;
    o.slot_bytes = spec.shm_slot_bytes;
    CP_ASSIGN_OR_RETURN(auto g, ShmGroup::create(store, spec.name + "/shm", o));
    return std::unique_ptr<ProcessGroup>(std::move(g));
  }
  GlooGroupOptions o;
  static_cast<GroupOptions&>(o) = spec;
  o.address = spec.address;
  CP_ASSIGN_OR_RETURN(auto g, GlooGroup::create(store, spec.name + "/gloo/", o));
  return std::unique_ptr<ProcessGroup>(std::move(g));
}

void exit_process_when_stuck(const std::string& why) {
  LOG(ERROR) << why << ": exiting";
  std::fflush(nullptr);
  std::_Exit(1);
}

}  // namespace dist
