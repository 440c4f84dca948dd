// DeepseekV3Model: the DeepSeek-V3 / V3.1 forward pass over a paged MLA latent cache
// (deepseek-v3-model.md §4-8). A forward is split into embed → run_layers(range) →
// final_norm → compute_logits so that a pipeline stage runs only its slice of layers.
// With tensor parallelism each rank's model holds its shard (model/tensor_parallel.h) and
// meets the other ranks in `group` for the all-reduces and all-gathers the shards need; every
// rank of the group must run the same forward calls with the same batch.
// Const methods are safe to call from one thread at a time per cache (the cache is written).
#pragma once

#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "common/thread_pool.h"
#include "dist/process_group.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace model {

// Where the MoE layers' time went with expert parallelism (dispatch and combine are the
// all-to-alls and the gather of the token slices).
struct MoeTimes {
  double dispatch_s = 0, experts_s = 0, combine_s = 0;
  int64_t layers = 0;
};

// Sees the input of every attention projection (q_a, q_b or q, kv_a, o) during a forward,
// named by its weight ("model.layers.L.self_attn.o_proj.weight"): the calibration of static
// W8A8 activation ranges (`chunkpipe quantize --static-attention`). Called on the forward's
// thread.
class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  virtual void observe(const std::string& weight_name, const float* x, int64_t rows,
                       int64_t cols) = 0;
};

class DeepseekV3Model {
 public:
  // `weights` must be the shard of `tp` and `lmhead_tp` (load_weights with LoadOptions).
  DeepseekV3Model(ModelConfig config, ModelWeights weights, TensorParallel tp = {},
                  LmHeadParallel lmhead_tp = {}, DataParallelExperts dp_experts = {});

  static common::Result<std::unique_ptr<DeepseekV3Model>> load(const std::string& model_dir,
                                                               const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // Hands the weights over (the model is unusable after): quantizing a loaded model.
  ModelWeights take_weights() && { return std::move(weights_); }
  // Not owned; null (the default) observes nothing.
  void set_activation_observer(ActivationObserver* observer) { observer_ = observer; }
  void set_attention_mode(AttentionMode mode) { attention_mode_ = mode; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  // The group of this model's TP ranks (required when tp.size > 1); not owned.
  void set_process_group(dist::ProcessGroup* group) { group_ = group; }
  // The lm_head group (lmhead_tp.size > 1): ranks that each bring their own rows; not owned.
  void set_lmhead_group(dist::ProcessGroup* group) { lmhead_group_ = group; }
  // The DP x TP group the routed experts are split over (dp_experts.size > 1); not owned.
  // Every rank must then run a forward (a dummy one when it has no work) in lock step.
  void set_expert_group(dist::ProcessGroup* group) { expert_group_ = group; }
  const DataParallelExperts& dp_experts() const { return dp_experts_; }
  // True when a forward's layers or head are collectives over ranks that hold other tokens
  // (DP expert parallelism, the lm_head group): every rank must call them in every step.
  bool needs_lockstep() const { return dp_experts_.active() || lmhead_tp_.active(); }
  // True when the head is a collective over ranks that hold other tokens (the lm_head group):
  // every rank of the group must make the same calls of compute_logits in every step.
  bool head_is_collective() const { return lmhead_tp_.active(); }
  // With a collective head, the most calls of it any rank of the lm_head group will make
  // (an all-reduce of `mine` over the group); `mine` otherwise.
  common::Result<int64_t> most_head_calls(int64_t mine) const;
  // Per-token width of this rank's expanded KV cache rows (its heads' k_nope ‖ v).
  int64_t expanded_kv_row_dim() const { return config_.expanded_kv_row_dim() / tp_.size; }
  const MoeTimes& moe_times() const { return moe_times_; }

  // hidden[T, H] = embedding rows of every chunk's tokens, in batch order. The forward calls
  // fail only when a collective of the TP group fails (a rank died, a timeout).
  common::Status embed(const ForwardBatch& batch, float* hidden) const;

  // Runs decoder layers [layer_begin, layer_end) on hidden[T, H] in place, writing each
  // chunk's latent KV into `cache` at its positions first.
  common::Status run_layers(const ForwardBatch& batch, int layer_begin, int layer_end,
                            float* hidden, LatentKvCache& cache, common::ThreadPool& pool) const;

  // normed[rows, H] = RMSNorm(hidden; model.norm). May alias.
  void final_norm(const float* hidden, int64_t rows, float* normed) const;
  // logits[rows, V] = normed · lm_headᵀ.
  common::Status compute_logits(const float* normed, int64_t rows, float* logits,
                                common::ThreadPool& pool) const;

  // MTP module `k` (layer num_hidden_layers + k) over `batch`: row i combines prev_hidden[i]
  // with the embedding of next_token_ids[i] (the token after row i's token) and writes the
  // module's hidden state after shared_head.norm to mtp_hidden[T, H]. prev_hidden is the main
  // model's final hidden after model.norm (`from_main`: rotated first when the checkpoint is
  // QuaRot) or, for later draft steps, an earlier mtp_hidden (recycled as is). Writes the MTP
  // layer's latent KV into `cache` at the batch's positions.
  common::Status mtp_forward(const ForwardBatch& batch, const float* prev_hidden, bool from_main,
                             std::span<const int32_t> next_token_ids, LatentKvCache& cache,
                             common::ThreadPool& pool, float* mtp_hidden, int k = 0) const;
  // Draft logits[rows, V] of MTP module k from rows of mtp_hidden (shared_head.head).
  common::Status mtp_head_logits(const float* mtp_hidden, int64_t rows, float* logits,
                                 common::ThreadPool& pool, int k = 0) const;
  // mtp_forward then mtp_head_logits on every row: draft logits [T, V] for the token after
  // next_token_ids[i], from main_normed (the final hidden after model.norm).
  common::Status mtp_logits(const ForwardBatch& batch, const float* main_normed,
                            std::span<const int32_t> next_token_ids, LatentKvCache& cache,
                            common::ThreadPool& pool, float* draft_logits, int k = 0) const;
  int num_mtp_layers() const { return static_cast<int>(weights_.mtp.size()); }

 private:
  struct Layout;  // per-token positions and cache slots of a batch
  common::Status decoder_layer(const DecoderLayerWeights& w, int cache_layer, const Layout& layout,
                               float* hidden, LatentKvCache& cache, common::ThreadPool& pool) const;
  common::Status attention(const AttentionWeights& w, int cache_layer, const Layout& layout,
                           const float* x, float* out, LatentKvCache& cache,
                           common::ThreadPool& pool) const;
  common::Status feed_forward(const DecoderLayerWeights& w, int64_t num_tokens, const float* x,
                              float* out, common::ThreadPool& pool) const;
  // Expert parallelism: this rank's slice of its TP group's tokens (all of them at TP 1) goes
  // to the experts' ranks (the TP group, or DP x TP) and back.
  common::Status moe_expert_parallel(const MoeWeights& m, int64_t num_tokens, const float* x,
                                     float* out, common::ThreadPool& pool) const;
  // Embedding rows of `ids` from this rank's vocabulary shard of `table`, summed over ranks.
  common::Status embed_rows(const tensor::WeightMatrix& table, std::span<const int32_t> ids,
                            float* out) const;
  // logits[rows, V] from this rank's vocabulary shard of `head`, gathered over ranks (the TP
  // group, or the lm_head group, whose ranks each bring their own rows).
  common::Status head_logits(const tensor::WeightMatrix& head, const float* normed, int64_t rows,
                             float* logits, common::ThreadPool& pool) const;
  // Sum over the TP group (nothing without TP).
  common::Status all_reduce(float* data, int64_t count) const;

  ModelConfig config_;
  ModelWeights weights_;
  TensorParallel tp_;
  LmHeadParallel lmhead_tp_;
  dist::ProcessGroup* group_ = nullptr;
  dist::ProcessGroup* lmhead_group_ = nullptr;
  DataParallelExperts dp_experts_;
  dist::ProcessGroup* expert_group_ = nullptr;
  kernels::RopeParams rope_;
  AttentionMode attention_mode_ = AttentionMode::kAuto;
  ActivationObserver* observer_ = nullptr;
  mutable MoeTimes moe_times_;
};

}  // namespace model
