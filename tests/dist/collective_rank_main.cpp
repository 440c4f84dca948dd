// A rank process for the collectives tests: `collective_rank PORT RANK SIZE shm|gloo MODE`
// joins group "dead" through the store at 127.0.0.1:PORT, then runs MODE: "exit" passes one
// barrier (so that every rank has finished connecting) and leaves with status 3 (a rank that
// dies); "allreduce" sums rank+1 and prints it.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dist/group_factory.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: collective_rank PORT RANK SIZE shm|gloo exit|allreduce\n");
    return 2;
  }
  dist::StoreClient store("127.0.0.1", std::atoi(argv[1]), 30);
  dist::GroupSpec spec("dead", std::atoi(argv[2]), std::atoi(argv[3]));
  spec.backend =
      std::string(argv[4]) == "shm" ? dist::GroupBackend::kShm : dist::GroupBackend::kGloo;
  auto group = dist::make_process_group(store, spec);
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", group.status().message().c_str());
    return 1;
  }
  const std::string mode = argv[5];
  if (mode == "exit") {
    if (!(*group)->barrier().ok()) return 1;
    std::_Exit(3);
  }
  float x = float(spec.rank + 1);
  const common::Status st = (*group)->all_reduce(&x, 1, dist::ReduceOp::kSum);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  std::printf("%g\n", x);
  return 0;
}
