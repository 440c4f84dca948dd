// DeepseekV3Model: the DeepSeek-V3 / V3.1 forward pass over a paged MLA latent cache
// (deepseek-v3-model.md §4-8). A forward is split into embed → run_layers(range) →
// final_norm → compute_logits so that a pipeline stage runs only its slice of layers.
// Const methods are safe to call from one thread at a time per cache (the cache is written).
#pragma once

#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace model {

// How a sequence's chunk attends to its context. kAuto picks the cheaper form by FLOP count:
// expanded (k/v per head recomputed from the latent; prefill) or absorbed (MQA over the latent
// with W_UK / W_UV folded into q and o; decode).
enum class AttentionMode { kAuto, kExpanded, kAbsorbed };

class DeepseekV3Model {
 public:
  DeepseekV3Model(ModelConfig config, ModelWeights weights);

  static common::Result<std::unique_ptr<DeepseekV3Model>> load(const std::string& model_dir,
                                                               const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  void set_attention_mode(AttentionMode mode) { attention_mode_ = mode; }

  // hidden[T, H] = embedding rows of every chunk's tokens, in batch order.
  void embed(const ForwardBatch& batch, float* hidden) const;

  // Runs decoder layers [layer_begin, layer_end) on hidden[T, H] in place, writing each
  // chunk's latent KV into `cache` at its positions first.
  void run_layers(const ForwardBatch& batch, int layer_begin, int layer_end, float* hidden,
                  LatentKvCache& cache, common::ThreadPool& pool) const;

  // normed[rows, H] = RMSNorm(hidden; model.norm). May alias.
  void final_norm(const float* hidden, int64_t rows, float* normed) const;
  // logits[rows, V] = normed · lm_headᵀ.
  void compute_logits(const float* normed, int64_t rows, float* logits,
                      common::ThreadPool& pool) const;

  // MTP module `k`: row i combines main_normed[i] (final hidden after model.norm) with the
  // embedding of next_token_ids[i] (the token after row i's token) and yields draft logits
  // [T, V] for the token after that. Runs MTP layer num_hidden_layers + k over `cache`.
  void mtp_logits(const ForwardBatch& batch, const float* main_normed,
                  std::span<const int32_t> next_token_ids, LatentKvCache& cache,
                  common::ThreadPool& pool, float* draft_logits, int k = 0) const;

 private:
  struct Layout;  // per-token positions and cache slots of a batch
  void decoder_layer(const DecoderLayerWeights& w, int cache_layer, const Layout& layout,
                     float* hidden, LatentKvCache& cache, common::ThreadPool& pool) const;
  void attention(const AttentionWeights& w, int cache_layer, const Layout& layout, const float* x,
                 float* out, LatentKvCache& cache, common::ThreadPool& pool) const;
  void feed_forward(const DecoderLayerWeights& w, int64_t num_tokens, const float* x, float* out,
                    common::ThreadPool& pool) const;
  void embed_rows(const tensor::WeightMatrix& table, std::span<const int32_t> ids,
                  float* out) const;

  ModelConfig config_;
  ModelWeights weights_;
  kernels::RopeParams rope_;
  AttentionMode attention_mode_ = AttentionMode::kAuto;
};

}  // namespace model
