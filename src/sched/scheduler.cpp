// Token-budget scheduling in the vLLM v1 style: running requests first (oldest first), then
// waiting ones while budget, sequence slots and KV blocks last.
#include "sched/scheduler.h"

#include <algorithm>

#include "common/check.h"

namespace sched {

Scheduler::Scheduler(const SchedulerConfig& config, kv::KvCacheManager* kv_cache)
    : config_(config), kv_(kv_cache) {}

void Scheduler::add_request(std::unique_ptr<Request> request) {
  Request* r = request.get();
  r->status = RequestStatus::kWaiting;
  CHECK(!requests_.count(r->request_id)) << "duplicate request id " << r->request_id;
  requests_[r->request_id] = std::move(request);
  waiting_.push_back(r);
}

std::unique_ptr<Request> Scheduler::abort_request(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return nullptr;
  Request* r = it->second.get();
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  kv_->free(request_id);
  r->status = RequestStatus::kFinished;
  r->finish_reason = FinishReason::kAbort;
  auto out = std::move(it->second);
  requests_.erase(it);
  return out;
}

void Scheduler::preempt(Request* r) {
  kv_->free(r->request_id);
  r->num_computed_tokens = 0;
  r->status = RequestStatus::kPreempted;
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  waiting_.push_front(r);
  ++num_preemptions_;
}

SchedulerOutput Scheduler::schedule() {
  // There is no "prefill phase" or "decode phase": each request has num_computed_tokens and
  // num_tokens, and each step grants min(needed, remaining budget).
  SchedulerOutput out;
  int64_t budget = config_.max_num_batched_tokens;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    const int64_t needed = r->num_tokens() - r->num_computed_tokens;
    const int64_t n = std::min(needed, budget);
    if (n <= 0) {
      ++i;
      continue;
    }
    bool fits = kv_->allocate_slots(r->request_id, r->num_computed_tokens + n);
    while (!fits) {
      Request* victim = running_.back();  // newest running request
      const bool self = victim == r;
      // A victim scheduled earlier this step keeps its slot in `out`; only unscheduled ones go.
      bool already_scheduled = false;
      for (const auto& s : out.scheduled) already_scheduled |= s.request == victim;
      if (already_scheduled) break;
      preempt(victim);
      ++out.num_preempted;
      if (self) break;
      fits = kv_->allocate_slots(r->request_id, r->num_computed_tokens + n);
    }
    if (!fits) {
      if (std::find(running_.begin(), running_.end(), r) == running_.end()) continue;  // preempted
      ++i;
      continue;
    }
    out.scheduled.push_back(
        {r, r->num_computed_tokens, n, r->num_computed_tokens + n == r->num_tokens()});
    budget -= n;
    ++i;
  }
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
    Request* r = waiting_.front();
    if (r->num_computed_tokens == 0 && kv_->block_table(r->request_id).empty()) {
      const auto ids = r->all_token_ids();
      r->num_computed_tokens = kv_->acquire_cached_prefix(r->request_id, ids);
    }
    const int64_t n = std::min(r->num_tokens() - r->num_computed_tokens, budget);
    if (!kv_->allocate_slots(r->request_id, r->num_computed_tokens + n)) break;  // wait for blocks
    waiting_.pop_front();
    r->status = RequestStatus::kRunning;
    running_.push_back(r);
    out.scheduled.push_back(
        {r, r->num_computed_tokens, n, r->num_computed_tokens + n == r->num_tokens()});
    budget -= n;
  }
  for (const auto& s : out.scheduled) out.total_num_scheduled_tokens += s.num_scheduled_tokens;
  return out;
}

void Scheduler::update(const SchedulerOutput& output, const std::vector<int32_t>& sampled) {
  CHECK(sampled.size() == output.scheduled.size()) << "one sampled entry per scheduled request";
  for (size_t i = 0; i < output.scheduled.size(); ++i) {
    const ScheduledRequest& s = output.scheduled[i];
    Request* r = s.request;
    if (r->status != RequestStatus::kRunning) continue;  // aborted meanwhile
    r->num_computed_tokens = s.num_computed_tokens + s.num_scheduled_tokens;
    if (s.samples && sampled[i] >= 0) r->output_token_ids.push_back(sampled[i]);
    const auto ids = r->all_token_ids();
    kv_->cache_full_blocks(r->request_id, ids, r->num_computed_tokens);
  }
}

std::unique_ptr<Request> Scheduler::finish_request(const std::string& request_id,
                                                   FinishReason reason) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return nullptr;
  Request* r = it->second.get();
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  kv_->free(request_id);
  r->status = RequestStatus::kFinished;
  r->finish_reason = reason;
  auto out = std::move(it->second);
  requests_.erase(it);
  return out;
}

SchedulerStats Scheduler::stats() const {
  return {static_cast<int32_t>(running_.size()), static_cast<int32_t>(waiting_.size()),
          num_preemptions_};
}

}  // namespace sched
