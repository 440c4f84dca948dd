// One forward per step over the worker's slice: all scheduled chunks batched, logits and
// sampling only for the rows that sample, and the prompt rows of requests with prompt_logprobs.
#include "worker/model_runner.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "common/check.h"
#include "common/timer.h"
#include "worker/sampler.h"

namespace worker {

namespace {

// The cache's layers end after the MTP layers on a last slice that drafts.
int cache_layer_end(const model::ModelConfig& c, int layer_end, int num_speculative_tokens) {
  return layer_end == c.num_hidden_layers && num_speculative_tokens > 0 ? c.num_total_layers()
                                                                        : layer_end;
}

// The chunk's positions [begin, end) whose next token is a prompt token (the prompt's last
// position samples): the rows score_prompts scores.
std::pair<int64_t, int64_t> scored_positions(const sched::ScheduledRequest& s,
                                             const CachedRequestState& st) {
  const int64_t begin = s.num_computed_tokens;
  return {begin, std::min(begin + s.num_scheduled_tokens, st.num_prompt_tokens - 1)};
}

}  // namespace

ModelRunner::ModelRunner(const model::DeepseekV3Model& model, const RunnerOptions& o)
    : model_(model),
      layer_begin_(o.layer_begin),
      layer_end_(o.layer_end < 0 ? model.config().num_hidden_layers : o.layer_end),
      cache_(model.config().num_total_layers(), layer_begin_,
             cache_layer_end(model.config(), layer_end_, o.num_speculative_tokens),
             o.num_blocks + (o.dummy_block ? 1 : 0), o.block_size,
             model.config().kv_cache_row_dim(),
             o.expanded_kv_cache ? model.expanded_kv_row_dim() : 0, o.kv_cache_dtype),
      pool_(o.num_threads),
      states_(model.config().vocab_size, o.num_blocks, o.block_size),
      connector_(o.kv_connector) {
  if (last() && o.num_speculative_tokens > 0) {
    CHECK(model.num_mtp_layers() > 0) << "speculative decoding without MTP weights";
    num_spec_ = o.num_speculative_tokens;
  }
  // The MTP layers' KV moves with the rest (vllm-ascend's Mooncake connector does the same).
  if (connector_)
    connector_->register_kv_cache(&cache_, layer_begin_,
                                  cache_layer_end(model.config(), layer_end_, num_spec_));
  if (o.dummy_block) dummy_block_ = static_cast<int32_t>(o.num_blocks);
}

int64_t ModelRunner::kv_bytes_per_block(const model::ModelConfig& c, int block_size,
                                        bool expanded_kv_cache, bool with_mtp,
                                        model::KvCacheDtype dtype) {
  return model::LatentKvCache::bytes_per_block(
      with_mtp ? c.num_total_layers() : c.num_hidden_layers, block_size, c.kv_cache_row_dim(),
      expanded_kv_cache ? c.expanded_kv_row_dim() : 0, dtype);
}

common::Result<std::vector<float>> ModelRunner::run(const model::ForwardBatch& batch,
                                                    std::vector<float> hidden, bool connected) {
  const int64_t H = model_.config().hidden_size;
  const int64_t rows = batch.num_tokens();
  if (first()) {
    hidden.assign(rows * H, 0.0f);
    CP_RETURN_IF_ERROR(model_.embed(batch, hidden.data()));
  } else if (static_cast<int64_t>(hidden.size()) != rows * H) {
    return common::data_loss("layers [" + std::to_string(layer_begin_) + ", " +
                             std::to_string(layer_end_) + ") received " +
                             std::to_string(hidden.size()) + " hidden values for " +
                             std::to_string(rows) + " tokens");
  }
  if (!connected) {
    CP_RETURN_IF_ERROR(
        model_.run_layers(batch, layer_begin_, layer_end_, hidden.data(), cache_, pool_));
    return hidden;
  }
  for (int l = layer_begin_; l < layer_end_; ++l) {  // one layer at a time, for the hooks
    connector_->wait_for_layer_load(l);
    CP_RETURN_IF_ERROR(model_.run_layers(batch, l, l + 1, hidden.data(), cache_, pool_));
    CP_RETURN_IF_ERROR(connector_->save_kv_layer(l));
  }
  CP_RETURN_IF_ERROR(connector_->wait_for_save());
  return hidden;
}

common::Result<std::vector<float>> ModelRunner::logits_of_rows(const std::vector<float>& hidden,
                                                               const std::vector<int64_t>& rows,
                                                               bool normed) {
  const model::ModelConfig& c = model_.config();
  const int64_t H = c.hidden_size;
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<float> picked;
  picked.reserve(n * H);
  for (int64_t row : rows)
    picked.insert(picked.end(), hidden.begin() + row * H, hidden.begin() + (row + 1) * H);
  if (!normed) model_.final_norm(picked.data(), n, picked.data());
  std::vector<float> logits(n * c.vocab_size);
  // A collective head (the lm_head group) runs even with no rows: the group's other ranks may
  // have some.
  if (n > 0 || model_.head_is_collective())
    CP_RETURN_IF_ERROR(model_.compute_logits(picked.data(), n, logits.data(), pool_));
  return logits;
}

namespace {

// Moves entry j of `v` (one per kept request) to kept_index[j] of a vector of `n` entries.
template <typename T>
void spread(const std::vector<size_t>& kept_index, size_t n, std::vector<T>* v) {
  std::vector<T> full(n);
  for (size_t j = 0; j < kept_index.size() && j < v->size(); ++j)
    full[kept_index[j]] = std::move((*v)[j]);
  *v = std::move(full);
}

}  // namespace

common::Result<StepResult> ModelRunner::execute_model(const sched::SchedulerOutput& output,
                                                      std::vector<float> hidden) {
  ScreenedStep screened = states_.screen(output);
  if (!screened.kept) return execute_screened(output, std::move(hidden));
  // Some requests were held back: the rest run, and each result goes back to its request's
  // place in `output`.
  CP_ASSIGN_OR_RETURN(StepResult result, execute_screened(*screened.kept, std::move(hidden)));
  // A lock-step rank whose whole step was held back still joins the collectives of the ranks
  // that compute (the engine decided on the step before the workers screened it).
  if (screened.kept->empty() && !output.empty() && model_.needs_lockstep())
    CP_RETURN_IF_ERROR(execute_dummy_batch());
  const size_t n = output.scheduled.size();
  spread(screened.kept_index, n, &result.sampled);
  spread(screened.kept_index, n, &result.draft_token_ids);
  spread(screened.kept_index, n, &result.prompt_logprobs);
  result.rejected = std::move(screened.rejected);
  return result;
}

common::Result<StepResult> ModelRunner::execute_screened(const sched::SchedulerOutput& output,
                                                         std::vector<float> hidden) {
  std::vector<CachedRequestState*> states;
  CP_RETURN_IF_ERROR(states_.apply(output, &states));
  StepResult result;
  if (connector_) CP_RETURN_IF_ERROR(connector_->start_load_kv(output.kv_connector_metadata));
  if (output.empty()) {  // a kv_connector_poll step, or nothing at all
    if (connector_) result.transfers = connector_->get_finished(output.finished_req_ids);
    return result;
  }
  const model::ForwardBatch batch = RequestStates::forward_batch(output, states);
  CP_ASSIGN_OR_RETURN(hidden, run(batch, std::move(hidden), connector_ != nullptr));
  if (connector_) result.transfers = connector_->get_finished(output.finished_req_ids);
  if (!last()) {
    result.hidden = std::move(hidden);
    return result;
  }
  // Rows with logits: the last of each sampling chunk, and its drafts' rows before it.
  std::vector<int64_t> rows;
  int64_t row = 0;
  for (const auto& s : output.scheduled) {
    row += s.num_scheduled_tokens;
    if (!s.samples) continue;
    for (int64_t j = static_cast<int64_t>(s.spec_token_ids.size()); j >= 0; --j)
      rows.push_back(row - 1 - j);
  }
  std::vector<float> normed;  // every row's final hidden, for the drafter
  if (num_spec_ > 0) {
    normed.resize(hidden.size());
    model_.final_norm(hidden.data(), batch.num_tokens(), normed.data());
  }
  CP_ASSIGN_OR_RETURN(
      const std::vector<float> logits,
      num_spec_ > 0 ? logits_of_rows(normed, rows, /*normed=*/true) : logits_of_rows(hidden, rows));
  const int64_t V = model_.config().vocab_size;
  result.sampled.resize(output.scheduled.size());
  result.draft_token_ids.resize(output.scheduled.size());
  // Each request samples its own rows with its own generator, so the pool's threads take the
  // requests in turn: a draw over DeepSeek-V3's 129k-token vocabulary costs about a millisecond,
  // which a step of hundreds of decoding requests would otherwise pay on one thread.
  std::vector<std::pair<size_t, int64_t>> sampling;  // (request, its first row of logits)
  for (size_t i = 0, k = 0; i < output.scheduled.size(); ++i) {
    const sched::ScheduledRequest& s = output.scheduled[i];
    if (!s.samples) continue;
    sampling.emplace_back(i, static_cast<int64_t>(k));
    k += s.spec_token_ids.size() + 1;
  }
  pool_.parallel_for_dynamic(
      static_cast<int64_t>(sampling.size()), 1, [&](int64_t begin, int64_t end, int) {
        for (int64_t j = begin; j < end; ++j) {
          const auto [i, k] = sampling[static_cast<size_t>(j)];
          result.sampled[i] =
              sample_request(*states[i], output.scheduled[i].spec_token_ids, logits.data() + k * V);
        }
      });
  const bool use_normed = num_spec_ > 0;
  CP_RETURN_IF_ERROR(
      score_prompts(output, states, use_normed ? normed : hidden, use_normed, &result));
  if (num_spec_ > 0) CP_RETURN_IF_ERROR(propose_drafts(output, states, batch, normed, &result));
  return result;
}

common::Status ModelRunner::score_prompts(const sched::SchedulerOutput& output,
                                          const std::vector<CachedRequestState*>& states,
                                          const std::vector<float>& hidden, bool normed,
                                          StepResult* result) {
  // With a collective head, every rank of the lm_head group makes as many calls as the busiest.
  int64_t calls = 0, agreed = 0;
  if (model_.head_is_collective()) {
    CP_ASSIGN_OR_RETURN(agreed, model_.most_head_calls(prompt_head_calls(output, states)));
  }
  const int64_t V = model_.config().vocab_size;
  result->prompt_logprobs.resize(output.scheduled.size());
  int64_t first_row = 0;
  for (size_t i = 0; i < output.scheduled.size(); ++i) {
    const sched::ScheduledRequest& s = output.scheduled[i];
    const CachedRequestState& st = *states[i];
    const int64_t chunk_row = first_row;
    first_row += s.num_scheduled_tokens;
    if (!st.sampling.prompt_logprobs) continue;
    const auto [begin, end] = scored_positions(s, st);
    std::vector<sched::SampledToken>& entries = result->prompt_logprobs[i];
    for (int64_t p = begin; p < end; p += kPromptRowsPerCall) {
      const int64_t n = std::min(kPromptRowsPerCall, end - p);
      std::vector<int64_t> rows(static_cast<size_t>(n));
      std::iota(rows.begin(), rows.end(), chunk_row + (p - begin));
      CP_ASSIGN_OR_RETURN(const std::vector<float> logits, logits_of_rows(hidden, rows, normed));
      ++calls;
      for (int64_t j = 0; j < n; ++j) {
        entries.push_back(score_token({logits.data() + j * V, static_cast<size_t>(V)},
                                      st.token_ids[p + j + 1], *st.sampling.prompt_logprobs));
      }
    }
  }
  return join_head_calls(agreed - calls);
}

common::Status ModelRunner::join_head_calls(int64_t calls) {
  for (int64_t i = 0; i < calls; ++i) CP_RETURN_IF_ERROR(logits_of_rows({}, {}).status());
  return {};
}

int64_t ModelRunner::prompt_head_calls(const sched::SchedulerOutput& output,
                                       const std::vector<CachedRequestState*>& states) {
  int64_t calls = 0;
  for (size_t i = 0; i < output.scheduled.size(); ++i) {
    const sched::ScheduledRequest& s = output.scheduled[i];
    const CachedRequestState& st = *states[i];
    if (!st.sampling.prompt_logprobs) continue;
    const auto [begin, end] = scored_positions(s, st);
    if (end > begin) calls += (end - begin + kPromptRowsPerCall - 1) / kPromptRowsPerCall;
  }
  return calls;
}

common::Status ModelRunner::execute_dummy_batch() {
  CHECK(dummy_block_ >= 0) << "a dummy batch without RunnerOptions::dummy_block";
  const int32_t token = 0, block = dummy_block_;
  model::ForwardBatch batch;
  batch.sequences.push_back({{&token, 1}, 0, {&block, 1}});
  std::vector<float> hidden(first() ? 0 : model_.config().hidden_size, 0.0f);
  CP_ASSIGN_OR_RETURN(hidden, run(batch, std::move(hidden), /*connected=*/false));
  if (!last() || !model_.needs_lockstep()) return {};
  if (model_.head_is_collective()) {
    // The head's calls that ranks with work make: the sampled rows, then score_prompts'. Only
    // a collective head needs them here; a rank's own head (a whole vocabulary row at real
    // dimensions) would be read for nothing.
    CP_RETURN_IF_ERROR(logits_of_rows(hidden, {0}).status());
    CP_ASSIGN_OR_RETURN(const int64_t prompt_calls, model_.most_head_calls(0));
    CP_RETURN_IF_ERROR(join_head_calls(prompt_calls));
  }
  if (num_spec_ == 0) return {};
  // The drafter's collectives too, on a row that samples nothing.
  sched::SchedulerOutput output;
  output.scheduled.push_back({});
  output.scheduled[0].num_scheduled_tokens = 1;
  CachedRequestState state;
  state.token_ids = {token, token};
  state.block_ids = {block};
  std::vector<float> normed(hidden.size());
  model_.final_norm(hidden.data(), 1, normed.data());
  StepResult result;
  result.sampled.resize(1);
  result.draft_token_ids.resize(1);
  return propose_drafts(output, {&state}, batch, normed, &result);
}

double ModelRunner::profile_ms(int64_t num_tokens, int64_t history, sched::AttentionForm form) {
  // The chunk and its history must fit the cache; the history attends to whatever the blocks
  // hold (the timing does not depend on the values). Nothing else runs during profiling.
  const int64_t capacity = cache_.num_blocks() * cache_.block_size();
  const int64_t n = std::clamp<int64_t>(num_tokens, 1, capacity);
  const int64_t L = std::clamp<int64_t>(history, 0, capacity - n);
  const model::ModelConfig& c = model_.config();
  std::vector<int32_t> tokens(n), blocks((L + n + cache_.block_size() - 1) / cache_.block_size());
  const int64_t vocab = std::min<int64_t>(c.vocab_size, 128000);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 3) % vocab);
  for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = static_cast<int32_t>(b);
  model::ForwardBatch batch;
  batch.sequences.push_back({tokens, L, blocks, attention_mode(form)});
  std::vector<float> hidden(first() ? 0 : n * c.hidden_size, 0.0f);
  const double t0 = common::now_seconds();
  // The head is not timed: a step computes logits only for a prompt's last chunk, and
  // vllm-ascend's dummy run times the layers alone. A drafting last slice also runs MTP step 0
  // on every prefill chunk (its KV), so that layer is timed with the rest.
  auto out = run(batch, std::move(hidden), /*connected=*/false);
  if (out.ok() && num_spec_ > 0) {
    std::vector<float> normed(out->size()), mtp_hidden(out->size());
    model_.final_norm(out->data(), n, normed.data());
    (void)model_.mtp_forward(batch, normed.data(), /*from_main=*/true, tokens, cache_, pool_,
                             mtp_hidden.data(), 0);
  }
  return (common::now_seconds() - t0) * 1000.0;
}

}  // namespace worker
