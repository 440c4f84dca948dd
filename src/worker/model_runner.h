// ModelRunner: one worker's slice of the model, decoder layers [layer_begin, layer_end) with the
// embedding on the first slice and the final norm and head on the last, its paged latent cache,
// its thread pool and the request states the SchedulerOutput deltas build (request_states.h).
// The same runner serves one process (the whole model) and each pipeline stage. The last slice
// samples and, with speculative decoding, verifies drafts and proposes the next ones with the
// MTP layers. A KV connector, if any, loads and saves KV around each forward (kv_connector.h).
// Not thread-safe: one step at a time.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/deepseek_v3.h"
#include "sched/scheduler_output.h"
#include "worker/kv_connector.h"
#include "worker/request_states.h"

namespace worker {

struct RunnerOptions {
  int layer_begin = 0;
  int layer_end = -1;  // -1: through the last decoder layer
  int64_t num_blocks = 0;
  int block_size = 16;
  int num_threads = 1;
  bool expanded_kv_cache = false;
  model::KvCacheDtype kv_cache_dtype = model::KvCacheDtype::kF32;
  std::shared_ptr<KvConnectorWorker> kv_connector;  // null: no KV connector
  // Data-parallel lock step: one cache block beyond num_blocks, which no request gets, for the
  // dummy batches a rank without work runs while other ranks have some.
  bool dummy_block = false;
  // Speculative decoding with the checkpoint's MTP layers (the last slice drafts): k drafts
  // per sampling request and step; 0: off. The cache then also holds the MTP layers.
  int num_speculative_tokens = 0;
};

struct StepResult {
  std::vector<float> hidden;  // not the last slice: for the next stage
  // The last slice, per scheduled request: its tokens (sched::ModelRunnerOutput::sampled) and
  // its drafts for the next step (speculative decoding).
  std::vector<std::vector<sched::SampledToken>> sampled;
  std::vector<std::vector<int32_t>> draft_token_ids;
  std::vector<std::vector<sched::SampledToken>> prompt_logprobs;  // ModelRunnerOutput's
  FinishedTransfers transfers;                                    // the KV connector's, if any
  // Requests held back for their own data (RequestStates::screen); their entries are empty.
  std::vector<sched::RejectedRequest> rejected;
};

class ModelRunner {
 public:
  // `model` (which must outlive the runner) holds at least the slice's weights.
  ModelRunner(const model::DeepseekV3Model& model, const RunnerOptions& options);

  bool first() const { return layer_begin_ == 0; }
  // The KV connector's start-up result (ok without one).
  common::Status init_status() const {
    return connector_ ? connector_->init_status() : common::Status{};
  }
  bool last() const { return layer_end_ == model_.config().num_hidden_layers; }
  bool pin_threads(const std::vector<int>& cpus) { return pool_.pin_threads(cpus); }
  size_t num_requests() const { return states_.size(); }

  // Applies the step's deltas and runs the slice. `hidden` is the previous stage's output (empty
  // on the first slice), over the step's requests less those screened out. A request whose own
  // data the model cannot run is held back and listed in StepResult::rejected, and the rest
  // run; a step the states refuse (request_states.h) returns the error.
  common::Result<StepResult> execute_model(const sched::SchedulerOutput& output,
                                           std::vector<float> hidden = {});

  // Data-parallel lock step: a one-token forward through every layer and, when the head is a
  // collective, the head, into the scratch block (RunnerOptions::dummy_block). Its output is
  // dropped; it exists so that this rank joins the collectives of ranks that have work.
  common::Status execute_dummy_batch();

  // CPP profiling: milliseconds of the slice's layers (and, on a drafting last slice, the MTP
  // layer that every prefill chunk also runs) on a prefill chunk of num_tokens dummy tokens
  // after `history` cached ones (both clamped to the cache), in the given attention form, zero
  // input on later slices. Uses the first cache blocks as scratch, so it must run while no
  // request holds blocks.
  double profile_ms(int64_t num_tokens, int64_t history = 0,
                    sched::AttentionForm form = sched::AttentionForm::kAuto);

  // Bytes of one cache block over the main layers, and the MTP layers when `with_mtp`.
  static int64_t kv_bytes_per_block(const model::ModelConfig& config, int block_size,
                                    bool expanded_kv_cache = false, bool with_mtp = false,
                                    model::KvCacheDtype dtype = model::KvCacheDtype::kF32);

 private:
  // execute_model() on a step with nothing left to hold back.
  common::Result<StepResult> execute_screened(const sched::SchedulerOutput& output,
                                              std::vector<float> hidden);
  // Runs the slice on `batch` (with the KV connector's per-layer hooks when `connected`).
  common::Result<std::vector<float>> run(const model::ForwardBatch& batch,
                                         std::vector<float> hidden, bool connected);
  // logits of `rows` of `hidden`, normed first unless `normed` says they already are.
  common::Result<std::vector<float>> logits_of_rows(const std::vector<float>& hidden,
                                                    const std::vector<int64_t>& rows,
                                                    bool normed = false);
  // Prompt logprobs (sched::ModelRunnerOutput::prompt_logprobs) of the requests that ask, from
  // the step's final hidden rows (`normed` as for logits_of_rows).
  common::Status score_prompts(const sched::SchedulerOutput& output,
                               const std::vector<CachedRequestState*>& states,
                               const std::vector<float>& hidden, bool normed, StepResult* result);
  // Rows of prompt logits per head call: bounds the logits held at once (32 x vocab floats).
  static constexpr int64_t kPromptRowsPerCall = 32;
  // The head calls score_prompts makes for `output`.
  static int64_t prompt_head_calls(const sched::SchedulerOutput& output,
                                   const std::vector<CachedRequestState*>& states);
  // `calls` head calls on no rows: this rank's part of a collective head's calls that other
  // ranks of its group make (score_prompts, dummy batches).
  common::Status join_head_calls(int64_t calls);
  // Verification of a request's rows (speculative_decoding.cpp): its accepted drafts and the
  // token after them, from `logits` [spec.size() + 1, V] (one row without drafts).
  std::vector<sched::SampledToken> sample_request(CachedRequestState& st,
                                                  const std::vector<int32_t>& spec,
                                                  const float* logits);
  // The drafter (speculative_decoding.cpp): MTP step 0 over every row of the step (its latent
  // KV for every scheduled position), then k - 1 steps that recycle the MTP hidden state, for
  // the requests that sampled. `normed` is the main model's final hidden after model.norm.
  common::Status propose_drafts(const sched::SchedulerOutput& output,
                                const std::vector<CachedRequestState*>& states,
                                const model::ForwardBatch& batch, const std::vector<float>& normed,
                                StepResult* result);

  const model::DeepseekV3Model& model_;
  int layer_begin_, layer_end_;
  model::LatentKvCache cache_;
  common::ThreadPool pool_;
  RequestStates states_;
  std::shared_ptr<KvConnectorWorker> connector_;
  int32_t dummy_block_ = -1;  // the scratch block of dummy batches (-1: none)
  int num_spec_ = 0;          // drafts per step (RunnerOptions::num_speculative_tokens)
};

}  // namespace worker
