// RequestStates: what a worker keeps of each request the scheduler has sent it (vLLM's
// CachedRequestState), built from SchedulerOutput's deltas: token ids, block table, sampling
// parameters and the request's generator. screen() holds back a request whose own data the
// model cannot run (token ids past the vocabulary): it fails alone. apply() checks every id
// that came from another process before it can index the cache, the embedding or the sampler;
// what it refuses is the engine's own bookkeeping, so the step must not run. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "model/forward_batch.h"
#include "sched/scheduler_output.h"

namespace worker {

// The model's attention mode for a form the scheduler chose (kAuto: the model decides).
model::AttentionMode attention_mode(sched::AttentionForm form);

struct CachedRequestState {
  std::vector<int32_t> token_ids;  // prompt, then outputs
  int64_t num_prompt_tokens = 0;
  std::vector<int32_t> block_ids;
  sched::SamplingParams sampling;
  std::mt19937_64 generator;  // one draw per sampled token seeds that token's sampling
  // This step's input when it runs drafts: its known tokens from num_computed_tokens, then the
  // drafts (speculative decoding); empty otherwise. Drafts never enter token_ids: the verified
  // ones come back as output tokens.
  std::vector<int32_t> step_input;

  std::span<const int32_t> prompt() const { return {token_ids.data(), size_t(num_prompt_tokens)}; }
  std::span<const int32_t> outputs() const {
    return std::span<const int32_t>(token_ids).subspan(size_t(num_prompt_tokens));
  }
};

// A step with the requests screen() held back taken out.
struct ScreenedStep {
  // Set only when screen() held some request back: the step without those requests, and
  // kept_index[j], the index in the original step of kept->scheduled[j].
  std::optional<sched::SchedulerOutput> kept;
  std::vector<size_t> kept_index;
  std::vector<sched::RejectedRequest> rejected;  // refused in this step, each with why
};

class RequestStates {
 public:
  RequestStates(int64_t vocab_size, int64_t num_blocks, int block_size)
      : vocab_size_(vocab_size), num_blocks_(num_blocks), block_size_(block_size) {}

  // Request data the workers cannot run fails that request alone: a new request whose prompt or
  // sampling ids lie outside the vocabulary is refused (listed in `rejected`, never given a
  // state), and it and any later delta for it stay out of every step until the engine lists it
  // in finished_req_ids. Every stage and rank of a step decides the same way.
  ScreenedStep screen(const sched::SchedulerOutput& output);

  // Drops the finished requests, applies each scheduled request's delta and sets (*states)[i]
  // to scheduled[i]'s state. `output` is a screened step (screen()'s `kept` when it is set). A
  // delta for an unknown request, an output or draft token or a block id out of range, or a
  // chunk beyond the known tokens or blocks is refused: those come from the engine's own
  // scheduler and sampler, so the step must not run.
  common::Status apply(const sched::SchedulerOutput& output,
                       std::vector<CachedRequestState*>* states);

  // The step's forward batch over the states apply() returned (which must outlive it).
  static model::ForwardBatch forward_batch(const sched::SchedulerOutput& output,
                                           const std::vector<CachedRequestState*>& states);

  size_t size() const { return states_.size(); }

 private:
  common::Status check_tokens(const std::vector<int32_t>& ids) const;
  common::Status check_blocks(const std::vector<int32_t>& ids) const;

  int64_t vocab_size_, num_blocks_;
  int block_size_;
  std::unordered_map<std::string, CachedRequestState> states_;
  std::unordered_set<std::string> rejected_;  // refused by screen(), not finished yet
};

}  // namespace worker
