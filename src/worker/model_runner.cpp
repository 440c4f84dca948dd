// One forward per step: all scheduled chunks batched, logits only for sampling rows.
#include "worker/model_runner.h"

#include <algorithm>

#include "common/timer.h"

namespace worker {

ModelRunner::ModelRunner(const model::DeepseekV3Model& model, int64_t num_blocks, int block_size,
                         int num_threads)
    : model_(model),
      cache_(model.config().num_total_layers(), 0, model.config().num_hidden_layers, num_blocks,
             block_size, model.config().kv_cache_row_dim()),
      pool_(num_threads) {}

int64_t ModelRunner::kv_bytes_per_block(const model::ModelConfig& c, int block_size) {
  return model::LatentKvCache::bytes_per_block(c.num_hidden_layers, block_size,
                                               c.kv_cache_row_dim());
}

double ModelRunner::profile_prefill_ms(int64_t num_tokens, int64_t max_tokens) {
  const model::ModelConfig& c = model_.config();
  const int64_t n = std::clamp<int64_t>(
      num_tokens, 1, std::min(max_tokens, cache_.num_blocks() * cache_.block_size()));
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i)
    ids[i] = static_cast<int32_t>((i * 7919 + 3) % std::min<int64_t>(c.vocab_size, 128000));
  std::vector<int32_t> table((n + cache_.block_size() - 1) / cache_.block_size());
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  model::ForwardBatch batch;
  batch.sequences.push_back({ids, 0, table});
  const double t0 = common::now_seconds();
  std::vector<float> hidden(n * c.hidden_size), logits(c.vocab_size);
  model_.embed(batch, hidden.data());
  model_.run_layers(batch, 0, c.num_hidden_layers, hidden.data(), cache_, pool_);
  model_.final_norm(hidden.data() + (n - 1) * c.hidden_size, 1, hidden.data());
  model_.compute_logits(hidden.data(), 1, logits.data(), pool_);
  return (common::now_seconds() - t0) * 1000.0;
}

std::vector<std::vector<float>> ModelRunner::execute(const sched::SchedulerOutput& output,
                                                     const kv::KvCacheManager& kv) {
  const model::ModelConfig& c = model_.config();
  std::vector<std::vector<int32_t>> chunk_ids(output.scheduled.size());
  model::ForwardBatch batch;
  std::vector<int64_t> sample_rows;
  int64_t row = 0;
  for (size_t i = 0; i < output.scheduled.size(); ++i) {
    const sched::ScheduledRequest& s = output.scheduled[i];
    for (int64_t t = 0; t < s.num_scheduled_tokens; ++t) {
      chunk_ids[i].push_back(s.request->token_at(s.num_computed_tokens + t));
    }
    batch.sequences.push_back(
        {chunk_ids[i], s.num_computed_tokens, kv.block_table(s.request->request_id)});
    row += s.num_scheduled_tokens;
    sample_rows.push_back(s.samples ? row - 1 : -1);
  }
  const int64_t T = batch.num_tokens(), H = c.hidden_size;
  std::vector<float> hidden(T * H);
  model_.embed(batch, hidden.data());
  model_.run_layers(batch, 0, c.num_hidden_layers, hidden.data(), cache_, pool_);
  std::vector<std::vector<float>> logits(output.scheduled.size());
  std::vector<float> rows;
  std::vector<int64_t> which;
  for (size_t i = 0; i < sample_rows.size(); ++i) {
    if (sample_rows[i] < 0) continue;
    rows.insert(rows.end(), hidden.begin() + sample_rows[i] * H,
                hidden.begin() + (sample_rows[i] + 1) * H);
    which.push_back(static_cast<int64_t>(i));
  }
  if (which.empty()) return logits;
  const int64_t n = static_cast<int64_t>(which.size());
  model_.final_norm(rows.data(), n, rows.data());
  std::vector<float> out(n * c.vocab_size);
  model_.compute_logits(rows.data(), n, out.data(), pool_);
  for (int64_t k = 0; k < n; ++k) {
    logits[which[k]].assign(out.begin() + k * c.vocab_size, out.begin() + (k + 1) * c.vocab_size);
  }
  return logits;
}

}  // namespace worker
