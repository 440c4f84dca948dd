// StepInput: one scheduler step as a worker executes it, in self-contained copies (token ids,
// block tables, sampling flags) so the scheduler can move on while the step is in flight; and
// the helpers every executor shares to run it. Plain data and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/thread_pool.h"
#include "kv/kv_cache_manager.h"
#include "model/deepseek_v3.h"
#include "sched/scheduler.h"
#include "worker/sampler.h"

namespace worker {

struct StepInput {
  struct Sequence {
    std::vector<int32_t> token_ids;
    int64_t num_computed_tokens = 0;
    std::vector<int32_t> block_table;
    bool samples = false;
    SampleSpec sample;  // when `samples`: how the last stage picks the token
  };
  std::vector<Sequence> sequences;
  int64_t step_id = 0;
  double predicted_ms = 0;  // CPP's predicted time of the step's prefill chunks (0: none)
};

StepInput make_step_input(const sched::SchedulerOutput& output, const kv::KvCacheManager& kv);

// One from-scratch prefill of `num_tokens` dummy tokens over blocks 0.. (CPP profiling).
StepInput dummy_prefill(int64_t num_tokens, int64_t vocab_size, int block_size);

// A ForwardBatch viewing `input` (which must outlive it).
model::ForwardBatch to_forward_batch(const StepInput& input);

// Final norm and logits for the last row of each sequence that samples; entry i is empty for a
// sequence that does not. `hidden` holds the step's rows after the last decoder layer.
std::vector<std::vector<float>> logits_for_samples(const model::DeepseekV3Model& model,
                                                   const StepInput& input, const float* hidden,
                                                   common::ThreadPool& pool);

// The last stage's sampling: entry i holds the token of the i-th sequence if it samples.
std::vector<std::optional<SampledToken>> sample_step(const model::DeepseekV3Model& model,
                                                     const StepInput& input, const float* hidden,
                                                     common::ThreadPool& pool);

}  // namespace worker
