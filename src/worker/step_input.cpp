// StepInput construction and the shared last-stage logits step.
#include "worker/step_input.h"

#include <algorithm>

namespace worker {

StepInput make_step_input(const sched::SchedulerOutput& output, const kv::KvCacheManager& kv) {
  StepInput in;
  for (const sched::ScheduledRequest& s : output.scheduled) {
    StepInput::Sequence seq;
    for (int64_t t = 0; t < s.num_scheduled_tokens; ++t)
      seq.token_ids.push_back(s.request->token_at(s.num_computed_tokens + t));
    seq.num_computed_tokens = s.num_computed_tokens;
    seq.block_table = kv.block_table(s.request->request_id);
    seq.samples = s.samples;
    in.sequences.push_back(std::move(seq));
  }
  return in;
}

StepInput dummy_prefill(int64_t num_tokens, int64_t vocab_size, int block_size) {
  StepInput in;
  StepInput::Sequence seq;
  const int64_t vocab = std::min<int64_t>(vocab_size, 128000);
  for (int64_t i = 0; i < num_tokens; ++i)
    seq.token_ids.push_back(static_cast<int32_t>((i * 7919 + 3) % vocab));
  for (int64_t b = 0; b < (num_tokens + block_size - 1) / block_size; ++b)
    seq.block_table.push_back(static_cast<int32_t>(b));
  seq.samples = true;
  in.sequences.push_back(std::move(seq));
  return in;
}

model::ForwardBatch to_forward_batch(const StepInput& input) {
  model::ForwardBatch batch;
  for (const auto& seq : input.sequences)
    batch.sequences.push_back({seq.token_ids, seq.num_computed_tokens, seq.block_table});
  return batch;
}

std::vector<std::vector<float>> logits_for_samples(const model::DeepseekV3Model& model,
                                                   const StepInput& input, const float* hidden,
                                                   common::ThreadPool& pool) {
  const model::ModelConfig& c = model.config();
  const int64_t H = c.hidden_size;
  std::vector<std::vector<float>> logits(input.sequences.size());
  std::vector<float> rows;
  std::vector<size_t> which;
  int64_t row = 0;
  for (size_t i = 0; i < input.sequences.size(); ++i) {
    row += static_cast<int64_t>(input.sequences[i].token_ids.size());
    if (!input.sequences[i].samples) continue;
    rows.insert(rows.end(), hidden + (row - 1) * H, hidden + row * H);
    which.push_back(i);
  }
  if (which.empty()) return logits;
  const int64_t n = static_cast<int64_t>(which.size());
  model.final_norm(rows.data(), n, rows.data());
  std::vector<float> out(n * c.vocab_size);
  model.compute_logits(rows.data(), n, out.data(), pool);
  for (int64_t k = 0; k < n; ++k)
    logits[which[k]].assign(out.begin() + k * c.vocab_size, out.begin() + (k + 1) * c.vocab_size);
  return logits;
}

std::vector<std::optional<SampledToken>> sample_step(const model::DeepseekV3Model& model,
                                                     const StepInput& input, const float* hidden,
                                                     common::ThreadPool& pool) {
  auto logits = logits_for_samples(model, input, hidden, pool);
  std::vector<std::optional<SampledToken>> out(input.sequences.size());
  for (size_t i = 0; i < input.sequences.size(); ++i) {
    if (input.sequences[i].samples) out[i] = sample_with_spec(logits[i], input.sequences[i].sample);
  }
  return out;
}

}  // namespace worker
