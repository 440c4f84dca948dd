// ModelRunner: turns a SchedulerOutput into one forward over the worker's model and paged
// cache and returns, for every scheduled request that samples this step, its logits row.
// Owns the latent KV cache and the thread pool. Not thread-safe: one step at a time.
#pragma once

#include <memory>
#include <vector>

#include "common/thread_pool.h"
#include "kv/kv_cache_manager.h"
#include "model/deepseek_v3.h"
#include "sched/scheduler.h"
#include "worker/step_input.h"

namespace worker {

class ModelRunner {
 public:
  ModelRunner(const model::DeepseekV3Model& model, int64_t num_blocks, int block_size,
              int num_threads, bool expanded_kv_cache = false);

  // logits[i] is the row of the i-th scheduled request with `samples` set (empty otherwise).
  std::vector<std::vector<float>> execute(const sched::SchedulerOutput& output,
                                          const kv::KvCacheManager& kv);

  static int64_t kv_bytes_per_block(const model::ModelConfig& config, int block_size,
                                    bool expanded_kv_cache = false);

  // CPP startup profiling: wall-clock milliseconds of one from-scratch prefill of num_tokens
  // dummy tokens (clamped to [1, max_tokens]). Uses the first cache blocks as scratch, so it
  // must run before any request holds blocks.
  double profile_prefill_ms(int64_t num_tokens, int64_t max_tokens);

 private:
  std::vector<std::vector<float>> run(const StepInput& input);

  const model::DeepseekV3Model& model_;
  model::LatentKvCache cache_;
  common::ThreadPool pool_;
};

}  // namespace worker
