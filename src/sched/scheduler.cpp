// Token-budget scheduling in the vLLM v1 style: running requests first (oldest first, or in
// priority order), then waiting ones while budget, sequence slots and KV blocks last.
#include "sched/scheduler.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace sched {

Scheduler::Scheduler(const SchedulerConfig& config, kv::KvCacheManager* kv_cache)
    : config_(config), kv_(kv_cache) {}

void Scheduler::add_request(std::unique_ptr<Request> request) {
  Request* r = request.get();
  r->status = RequestStatus::kWaiting;
  CHECK(!requests_.count(r->request_id)) << "duplicate request id " << r->request_id;
  r->arrival_order = num_added_++;
  requests_[r->request_id] = std::move(request);
  enqueue_waiting(r, /*as_new=*/true);
  if (connector_ != nullptr) connector_->request_added(*r);
}

std::unique_ptr<Request> Scheduler::abort_request(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return nullptr;
  Request* r = it->second.get();
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  waiting_for_remote_kvs_.erase(
      std::remove(waiting_for_remote_kvs_.begin(), waiting_for_remote_kvs_.end(), r),
      waiting_for_remote_kvs_.end());
  r->finish_reason = FinishReason::kAbort;
  release(r);
  r->status = RequestStatus::kFinished;
  auto out = std::move(it->second);
  requests_.erase(it);
  return out;
}

void Scheduler::release(Request* r) {
  bool delay_free = false;
  if (connector_ != nullptr) {
    FinishedHandoff h = connector_->request_finished(*r, kv_->block_table(r->request_id));
    delay_free = h.delay_free;
    r->kv_handoff_params = std::move(h.kv_transfer_params);
  }
  // Its KV is still being loaded: the load may write into the blocks until it reports.
  if (r->status == RequestStatus::kWaitingForRemoteKvs) delay_free = true;
  if (delay_free) {
    delayed_free_.insert(r->request_id);  // freed when the connector reports it sent
  } else {
    kv_->free(r->request_id);
  }
  if (r->known_to_workers) finished_req_ids_.push_back(r->request_id);
  r->known_to_workers = false;
}

void Scheduler::update_kv_transfers(const KvTransferReport& report) {
  if (connector_ != nullptr) connector_->update_connector_output(report);
  for (const std::string& id : report.finished_sending) {
    if (delayed_free_.erase(id)) kv_->free(id);
  }
  auto take_waiting = [&](const std::string& id) -> Request* {
    // A request aborted while its KV was loading kept its blocks until now (the load could
    // still write into them).
    if (delayed_free_.erase(id)) kv_->free(id);
    auto it = std::find_if(waiting_for_remote_kvs_.begin(), waiting_for_remote_kvs_.end(),
                           [&](const Request* r) { return r->request_id == id; });
    if (it == waiting_for_remote_kvs_.end()) return nullptr;
    Request* r = *it;
    waiting_for_remote_kvs_.erase(it);
    return r;
  };
  for (const auto& [id, why] : report.failed_recving) {
    Request* r = take_waiting(id);
    if (r == nullptr) continue;
    r->num_external_tokens = 0;
    if (config_.recompute_kv_load_failures) {  // the local prefix hits stay; the rest runs here
      r->num_cached_tokens = r->num_computed_tokens;
      r->status = RequestStatus::kWaiting;
      enqueue_waiting(r, /*as_new=*/false);
      continue;
    }
    r->status = RequestStatus::kFinished;  // the load is over: the blocks may go now
    r->finish_reason = FinishReason::kAbort;
    release(r);
    auto it = requests_.find(id);
    load_failures_.emplace_back(std::move(it->second), why);
    requests_.erase(it);
  }
  for (const std::string& id : report.finished_recving) {
    Request* r = take_waiting(id);
    if (r == nullptr) continue;
    // The local prefix hits and what the connector loaded count as computed; at least the
    // last token is left to run, for the first output's logits.
    r->num_computed_tokens =
        std::min(r->num_computed_tokens + r->num_external_tokens, r->num_tokens() - 1);
    r->num_cached_tokens = r->num_computed_tokens;
    // Loaded blocks are prefix-cache hits from now on, as computed ones are (vLLM caches them
    // here too): a request with the same prompt, such as another choice of this one, finds them.
    const auto ids = r->all_token_ids();
    kv_->cache_full_blocks(r->request_id, ids, r->num_computed_tokens, r->cache_salt);
    r->status = RequestStatus::kWaiting;
    enqueue_waiting(r, /*as_new=*/false);
  }
}

void Scheduler::enqueue_waiting(Request* r, bool as_new) {
  if (as_new && config_.policy == SchedulingPolicy::kFcfs) {
    waiting_.push_back(r);
    return;
  }
  const bool holds_blocks = !kv_->block_table(r->request_id).empty();
  const auto first_without_blocks = std::find_if(waiting_.begin(), waiting_.end(), [&](Request* w) {
    return kv_->block_table(w->request_id).empty();
  });
  const auto begin = holds_blocks ? waiting_.begin() : first_without_blocks;
  if (config_.policy == SchedulingPolicy::kFcfs) {
    waiting_.insert(begin, r);
    return;
  }
  const auto end = holds_blocks ? first_without_blocks : waiting_.end();
  waiting_.insert(std::upper_bound(begin, end, r, served_before), r);
}

void Scheduler::add_running(Request* r) {
  if (config_.policy == SchedulingPolicy::kFcfs) {
    running_.push_back(r);
    return;
  }
  running_.insert(std::upper_bound(running_.begin(), running_.end(), r, served_before), r);
}

ScheduledRequest Scheduler::make_entry(Request* r, int64_t n) {
  ScheduledRequest s;
  s.req_id = r->request_id;
  s.num_computed_tokens = r->num_computed_tokens;
  s.num_scheduled_tokens = n;
  s.samples = r->num_computed_tokens + n >= r->num_tokens();
  // Drafts ride in the chunk's tail: those that fit in n (the budget or max_model_len may cut
  // them). Unscheduled ones are dropped: a step consumes its request's drafts.
  const int64_t num_spec = std::max<int64_t>(0, r->num_computed_tokens + n - r->num_tokens());
  s.spec_token_ids.assign(r->spec_token_ids.begin(), r->spec_token_ids.begin() + num_spec);
  r->spec_token_ids.clear();
  const std::vector<kv::BlockId>& table = kv_->block_table(r->request_id);
  if (!r->known_to_workers) {
    s.new_request = NewRequestData{r->prompt_token_ids, r->sampling};
    s.new_request->sampling.stop.clear();  // stop strings are the engine's business
    s.new_token_ids = r->output_token_ids;
    s.new_block_ids.assign(table.begin(), table.end());
    r->known_to_workers = true;
  } else {
    s.resumed_from_preemption = r->resumed;
    const size_t from = r->resumed ? 0 : r->num_blocks_sent;
    s.new_block_ids.assign(table.begin() + static_cast<std::ptrdiff_t>(from), table.end());
    s.new_token_ids.assign(
        r->output_token_ids.begin() + (r->num_tokens_sent - r->num_prompt_tokens()),
        r->output_token_ids.end());
  }
  r->resumed = false;
  r->num_blocks_sent = table.size();
  r->num_tokens_sent = r->num_tokens();
  return s;
}

void Scheduler::preempt(Request* r) {
  kv_->free(r->request_id);
  r->num_computed_tokens = 0;
  r->cpp_chunk_ms = -1;  // planned again from wherever it resumes
  r->spec_token_ids.clear();
  r->status = RequestStatus::kPreempted;
  ++r->num_preemptions;
  r->resumed = r->known_to_workers;
  r->num_blocks_sent = 0;
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  enqueue_waiting(r, /*as_new=*/false);  // FCFS: first in line, behind the loaded requests
  ++num_preemptions_;
}

void Scheduler::recompute(Request* r) {
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  release(r);
  r->status = RequestStatus::kFinished;
  r->finish_reason = FinishReason::kStop;
  auto it = requests_.find(r->request_id);
  recomputed_.push_back(std::move(it->second));
  requests_.erase(it);
}

std::optional<int64_t> Scheduler::dynamic_chunk(Request& r, int64_t history, int64_t n,
                                                double* time_budget, double target) const {
  if (predictor_ == nullptr || !predictor_->ready()) return n;
  const bool first_prefill = *time_budget == target;
  if (predictor_->planned()) {
    // Chunk sizes follow the prompt's plan: the first prefill of a step takes its plan's chunk
    // and that time becomes the step's budget; later prefills share what is left.
    if (first_prefill) {
      if (r.cpp_chunk_ms < 0)
        r.cpp_chunk_ms = predictor_->plan_chunk_ms(r.num_prompt_tokens(), history);
      if (r.cpp_chunk_ms == 0) return n;  // the plan is fixed chunks
      *time_budget = r.cpp_chunk_ms;
    }
    if (auto p = predictor_->predict(history, *time_budget)) return std::min(n, *p);
    return first_prefill ? std::optional<int64_t>(n) : std::nullopt;
  }
  // The first chunk of a fresh request keeps the full budget while calibrating, so the
  // measured target is a B-token step (cpp-design.md §6.2).
  if (r.num_computed_tokens == 0 && predictor_->need_timing()) return n;
  // The step's first prefill may have its own, smaller target (overhead_aware extension).
  double budget = *time_budget;
  if (first_prefill)
    budget = std::min(budget, predictor_->request_target_ms(r.num_prompt_tokens()));
  if (auto p = predictor_->predict(history, budget)) {
    // Fold a small final remainder into this chunk when n already reaches the prompt's end.
    const bool whole_rest = n == r.num_tokens() - history;
    if (whole_rest && *p < n && n - *p <= predictor_->merge_tail()) return n;
    return std::min(n, *p);
  }
  if (predictor_->need_timing()) return n;  // calibration stage: long requests are better
  if (first_prefill) return n;              // first prefill this step: degrade to fixed chunks
  return std::nullopt;                      // no time left for another prefill chunk
}

int64_t Scheduler::slots_for(const Request& r, int64_t end) const {
  // A chunk that reaches the last token samples, and the drafter then writes up to k - 1
  // positions past its accepted tokens: reserve k lookahead slots, within max_model_len.
  if (config_.num_lookahead_tokens == 0 || end < r.num_tokens()) return end;
  return std::max(end, std::min(end + config_.num_lookahead_tokens, config_.max_model_len));
}

SchedulerOutput Scheduler::schedule(bool allow_poll, bool admit_waiting) {
  // There is no "prefill phase" or "decode phase": each request has num_computed_tokens and
  // num_tokens, and each step grants min(needed, remaining budget). With a chunk predictor
  // (CPP), prefill chunks are also sized to spend a per-step time budget of T milliseconds.
  SchedulerOutput out;
  int64_t budget = config_.max_num_batched_tokens;
  const bool cpp = predictor_ != nullptr && predictor_->ready();
  const double target = cpp ? predictor_->target_ms() : 0.0;
  double time_budget = cpp ? target : INFINITY;
  std::vector<Request*> scheduled;  // out.scheduled's requests
  std::vector<int32_t> epochs;
  // A request's tokens this step, before the budget: at most --long-prefill-token-threshold.
  auto capped = [&](int64_t needed) {
    const int64_t cap = config_.long_prefill_token_threshold;
    return cap > 0 ? std::min(needed, cap) : needed;
  };
  auto emit = [&](Request* r, int64_t n, int64_t charged_history) {
    const int64_t before = r->num_computed_tokens;
    const bool in_prefill = before < r->num_prompt_tokens();
    out.scheduled.push_back(make_entry(r, n));
    if (cpp && in_prefill)
      out.scheduled.back().attention_form = predictor_->attention_form(n, before);
    scheduled.push_back(r);
    epochs.push_back(r->num_preemptions);
    r->num_computed_tokens = before + n;  // advanced now: the next chunk may follow at once
    budget -= n;
    if (cpp && in_prefill) time_budget -= predictor_->predict_time(n, charged_history);
  };
  for (size_t i = 0; i < running_.size() && budget > 0 && time_budget > 0;) {
    Request* r = running_[i];
    const int64_t num_tokens_with_spec =
        r->num_tokens() + static_cast<int64_t>(r->spec_token_ids.size());
    int64_t n = std::min({capped(num_tokens_with_spec - r->num_computed_tokens), budget,
                          config_.max_model_len - r->num_computed_tokens});
    if (n <= 0) {
      ++i;
      continue;
    }
    if (r->num_computed_tokens < r->num_prompt_tokens()) {
      auto sized = dynamic_chunk(*r, r->num_computed_tokens, n, &time_budget, target);
      if (!sized) break;
      n = *sized;
    }
    bool fits = kv_->allocate_slots(r->request_id, slots_for(*r, r->num_computed_tokens + n));
    while (!fits) {
      // The newest running request, or the one served last under the priority policy (vLLM
      // takes the same one: the largest (priority, arrival)).
      Request* victim = running_.back();
      const bool self = victim == r;
      // A victim scheduled earlier this step keeps its slot in `out`; only unscheduled ones go.
      if (std::find(scheduled.begin(), scheduled.end(), victim) != scheduled.end()) break;
      if (config_.recompute_scheduler_enable && victim->recomputable) {
        recompute(victim);
        ++out.num_recomputed;
      } else {
        preempt(victim);
        ++out.num_preempted;
      }
      if (self) break;
      fits = kv_->allocate_slots(r->request_id, slots_for(*r, r->num_computed_tokens + n));
    }
    if (!fits) {
      if (std::find(running_.begin(), running_.end(), r) == running_.end()) continue;  // preempted
      ++i;
      continue;
    }
    emit(r, n, r->num_computed_tokens);
    ++i;
  }
  std::vector<Request*> skipped;  // waiting requests a connector asked to come back later
  while (admit_waiting && out.num_preempted == 0 && out.num_recomputed == 0 && !waiting_.empty() &&
         budget > 0 && time_budget > 0 &&
         static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
    Request* r = waiting_.front();
    int64_t hits = r->num_computed_tokens;
    int64_t external = 0;  // tokens a KV connector provides past the local hits
    bool load_async = false;
    const bool fresh = r->num_computed_tokens == 0 && kv_->block_table(r->request_id).empty();
    // A fresh request that cannot start now gives its prefix hits back and looks them up again
    // next time; kept, they would make it look resumed and recompute from token 0 over blocks
    // that others share.
    auto stay_waiting = [&] {
      if (fresh) kv_->free(r->request_id);
    };
    if (fresh) {
      const auto ids = r->all_token_ids();
      // Prompt logprobs need every position's logits: no prefix hits (vLLM v1 does the same).
      if (!r->sampling.prompt_logprobs)
        hits = kv_->acquire_cached_prefix(r->request_id, ids, r->cache_salt);
      if (connector_ != nullptr) {
        const auto matched = connector_->get_num_new_matched_tokens(*r, hits);
        if (!matched) {  // the connector asks us to come back later: the others may go first
          stay_waiting();
          waiting_.pop_front();
          skipped.push_back(r);
          continue;
        }
        if (!matched->share_from.empty() && hits == 0 && !r->sampling.prompt_logprobs)
          hits = kv_->share_prefix(r->request_id, matched->share_from, r->num_tokens() - 1);
        // At least the last token is computed here: it produces the first output. Prompt
        // logprobs need every position computed here, so nothing is loaded for them.
        external = r->sampling.prompt_logprobs
                       ? 0
                       : std::clamp<int64_t>(matched->num_tokens, 0, r->num_tokens() - 1 - hits);
        load_async = matched->load_async && external > 0;
      }
    }
    if (load_async) {  // the blocks now, the KV over later steps
      // Slots for every token, the last included (and the drafts' lookahead): once the KV is
      // in, the request must run without needing another block, or loaded requests could hold
      // the whole cache while none of them can start.
      if (!kv_->allocate_slots(r->request_id, slots_for(*r, r->num_tokens()))) {
        stay_waiting();
        break;
      }
      waiting_.pop_front();
      r->num_computed_tokens = hits;  // what a failed load falls back to
      connector_->update_state_after_alloc(*r, kv_->block_table(r->request_id), external);
      r->status = RequestStatus::kWaitingForRemoteKvs;
      r->num_external_tokens = external;
      waiting_for_remote_kvs_.push_back(r);
      continue;
    }
    hits += external;
    int64_t n = std::min(capped(r->num_tokens() - hits), budget);
    // Prediction counts prefix hits as history; the predicate sees the request's own counter.
    auto sized = dynamic_chunk(*r, hits, n, &time_budget, target);
    if (!sized || !kv_->allocate_slots(r->request_id, slots_for(*r, hits + *sized))) {
      stay_waiting();  // no time budget left this step, or no blocks yet
      break;
    }
    n = *sized;
    waiting_.pop_front();
    if (fresh && connector_ != nullptr) {
      connector_->update_state_after_alloc(*r, kv_->block_table(r->request_id), external);
      r->num_external_tokens = external;
    }
    r->status = RequestStatus::kRunning;
    add_running(r);
    r->num_computed_tokens = hits;
    r->num_cached_tokens = hits;
    emit(r, n, config_.charge_prefix_hits ? hits : 0);
  }
  if (config_.policy == SchedulingPolicy::kFcfs) {
    waiting_.insert(waiting_.begin(), skipped.begin(), skipped.end());  // in their order, first
  } else {
    for (Request* r : skipped) enqueue_waiting(r, /*as_new=*/true);
  }
  for (const auto& s : out.scheduled) out.total_num_scheduled_tokens += s.num_scheduled_tokens;
  // Nothing runs, but transfers are pending: a step for the connectors only.
  out.kv_connector_poll = allow_poll && out.empty() && connector_ != nullptr &&
                          (!waiting_for_remote_kvs_.empty() || !delayed_free_.empty());
  if (!out.empty() || out.kv_connector_poll) {
    if (connector_ != nullptr)
      out.kv_connector_metadata = connector_->build_connector_meta(out, *kv_);
    out.finished_req_ids.swap(finished_req_ids_);
    in_flight_epochs_.push_back(std::move(epochs));
  }
  return out;
}

std::vector<bool> Scheduler::update(const SchedulerOutput& output,
                                    const std::vector<int32_t>& sampled) {
  CHECK(sampled.size() == output.scheduled.size()) << "one sampled entry per scheduled request";
  std::vector<std::vector<int32_t>> tokens(sampled.size());
  for (size_t i = 0; i < sampled.size(); ++i)
    if (sampled[i] >= 0) tokens[i].push_back(sampled[i]);
  const std::vector<int32_t> appended =
      update(output, tokens, std::vector<std::vector<int32_t>>(sampled.size()));
  return std::vector<bool>(appended.begin(), appended.end());
}

std::vector<int32_t> Scheduler::update(const SchedulerOutput& output,
                                       const std::vector<std::vector<int32_t>>& sampled,
                                       const std::vector<std::vector<int32_t>>& draft_token_ids) {
  CHECK(sampled.size() == output.scheduled.size() &&
        draft_token_ids.size() == output.scheduled.size())
      << "one sampled entry per scheduled request";
  CHECK(!in_flight_epochs_.empty()) << "update without a scheduled step";
  const std::vector<int32_t> epochs = std::move(in_flight_epochs_.front());
  in_flight_epochs_.pop_front();
  CHECK(epochs.size() == output.scheduled.size()) << "steps updated out of order";
  std::vector<int32_t> appended(output.scheduled.size(), 0);
  for (size_t i = 0; i < output.scheduled.size(); ++i) {
    const ScheduledRequest& s = output.scheduled[i];
    Request* r = find_request(s.req_id);
    // Finished, aborted or preempted (and maybe resumed) while the step was in flight.
    if (r == nullptr || r->status != RequestStatus::kRunning || r->num_preemptions != epochs[i])
      continue;
    const std::vector<int32_t>& tokens = sampled[i];
    const int64_t num_spec = static_cast<int64_t>(s.spec_token_ids.size());
    int64_t verified_end = s.num_computed_tokens + s.num_scheduled_tokens;  // of this step
    if (s.samples && !tokens.empty()) {
      CHECK(static_cast<int64_t>(tokens.size()) <= num_spec + 1)
          << "more tokens than drafts + 1 for " << s.req_id;
      // The drafts after the first rejection were computed for nothing: their slots are
      // overwritten later (vLLM keeps the blocks too).
      const int64_t rejected = num_spec - (static_cast<int64_t>(tokens.size()) - 1);
      r->num_computed_tokens -= rejected;
      verified_end -= rejected;
      r->output_token_ids.insert(r->output_token_ids.end(), tokens.begin(), tokens.end());
      appended[i] = static_cast<int32_t>(tokens.size());
      r->spec_token_ids = draft_token_ids[i];
    }
    // The blocks this step filled with verified tokens; not those of a later chunk already in
    // flight (pipeline parallelism), nor rejected drafts. Other decode steps skip copying the
    // token ids (the whole prompt).
    const int bs = kv_->block_size();
    if (verified_end / bs > s.num_computed_tokens / bs) {
      const auto ids = r->all_token_ids();
      kv_->cache_full_blocks(r->request_id, ids, verified_end, r->cache_salt);
    }
  }
  return appended;
}

void Scheduler::truncate_output(const std::string& request_id, size_t num_output_tokens) {
  Request* r = find_request(request_id);
  if (r == nullptr || r->output_token_ids.size() <= num_output_tokens) return;
  r->output_token_ids.resize(num_output_tokens);
  r->num_computed_tokens = std::min(r->num_computed_tokens, r->num_tokens() - 1);
  r->spec_token_ids.clear();
}

Request* Scheduler::find_request(const std::string& request_id) const {
  auto it = requests_.find(request_id);
  return it == requests_.end() ? nullptr : it->second.get();
}

std::unique_ptr<Request> Scheduler::finish_request(const std::string& request_id,
                                                   FinishReason reason) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return nullptr;
  Request* r = it->second.get();
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  r->finish_reason = reason;  // the connector's request_finished reads it
  release(r);
  r->status = RequestStatus::kFinished;
  auto out = std::move(it->second);
  requests_.erase(it);
  return out;
}

SchedulerStats Scheduler::stats() const {
  return {static_cast<int32_t>(running_.size()), static_cast<int32_t>(waiting_.size()),
          num_preemptions_};
}

}  // namespace sched
