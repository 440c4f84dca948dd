// Per-request counting of the stages' KV transfer reports.
#include "engine/kv_output_aggregator.h"

namespace engine {

sched::KvTransferReport KvOutputAggregator::aggregate(const sched::KvTransferReport& reports) {
  sched::KvTransferReport out;
  out.stats = reports.stats;
  for (const std::string& id : reports.finished_sending) {
    if (++sending_[id] < num_workers_) continue;
    sending_.erase(id);
    out.finished_sending.push_back(id);
  }
  auto recv = [&](const std::string& id, const std::string* error) {
    Pending& p = recving_[id];
    if (error != nullptr && p.error.empty()) p.error = *error;
    if (++p.count < num_workers_) return;
    if (p.error.empty()) {
      out.finished_recving.push_back(id);
    } else {
      out.failed_recving.emplace_back(id, p.error);
    }
    recving_.erase(id);
  };
  for (const std::string& id : reports.finished_recving) recv(id, nullptr);
  for (const auto& [id, why] : reports.failed_recving) recv(id, &why);
  return out;
}

}  // namespace engine
