// One forward per step: all scheduled chunks batched, logits only for sampling rows.
#include "worker/model_runner.h"

#include <algorithm>

#include "common/timer.h"

namespace worker {

ModelRunner::ModelRunner(const model::DeepseekV3Model& model, int64_t num_blocks, int block_size,
                         int num_threads, bool expanded_kv_cache)
    : model_(model),
      cache_(model.config().num_total_layers(), 0, model.config().num_hidden_layers, num_blocks,
             block_size, model.config().kv_cache_row_dim(),
             expanded_kv_cache ? model.config().expanded_kv_row_dim() : 0),
      pool_(num_threads) {}

int64_t ModelRunner::kv_bytes_per_block(const model::ModelConfig& c, int block_size,
                                        bool expanded_kv_cache) {
  return model::LatentKvCache::bytes_per_block(c.num_hidden_layers, block_size,
                                               c.kv_cache_row_dim(),
                                               expanded_kv_cache ? c.expanded_kv_row_dim() : 0);
}

double ModelRunner::profile_prefill_ms(int64_t num_tokens, int64_t max_tokens) {
  const int64_t n = std::clamp<int64_t>(
      num_tokens, 1, std::min(max_tokens, cache_.num_blocks() * cache_.block_size()));
  const StepInput in = dummy_prefill(n, model_.config().vocab_size, cache_.block_size());
  const double t0 = common::now_seconds();
  run(in);
  return (common::now_seconds() - t0) * 1000.0;
}

std::vector<std::vector<float>> ModelRunner::execute(const sched::SchedulerOutput& output,
                                                     const kv::KvCacheManager& kv) {
  return run(make_step_input(output, kv));
}

std::vector<std::vector<float>> ModelRunner::run(const StepInput& input) {
  const model::ModelConfig& c = model_.config();
  const model::ForwardBatch batch = to_forward_batch(input);
  std::vector<float> hidden(batch.num_tokens() * c.hidden_size);
  model_.embed(batch, hidden.data());
  model_.run_layers(batch, 0, c.num_hidden_layers, hidden.data(), cache_, pool_);
  return logits_for_samples(model_, input, hidden.data(), pool_);
}

}  // namespace worker
