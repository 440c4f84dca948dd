// KvOutputAggregator, after vLLM's KVOutputAggregator: every pipeline stage's KV connector
// reports the transfers of its own layers, and a request is done only once all stages have
// reported it (failed if any stage failed), because until then some stage may still be reading
// or writing its blocks. Used by one thread (the executor's consumer).
#pragma once

#include <string>
#include <unordered_map>

#include "sched/scheduler_output.h"

namespace engine {

class KvOutputAggregator {
 public:
  explicit KvOutputAggregator(int num_workers) : num_workers_(num_workers) {}
  // `reports` lists what each stage reported this step (the same id once per stage); the
  // result lists the requests every stage has now reported. Stats are summed.
  sched::KvTransferReport aggregate(const sched::KvTransferReport& reports);

 private:
  struct Pending {
    int count = 0;
    std::string error;  // the first stage's failure, if any
  };
  int num_workers_;
  std::unordered_map<std::string, int> sending_;
  std::unordered_map<std::string, Pending> recving_;
};

}  // namespace engine
