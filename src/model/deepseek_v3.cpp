// DeepSeek-V3 forward. Activations are f32 rows [T, ·] for all chunks of a batch concatenated;
// attention (deepseek_v3_attention.cpp) is the only per-sequence step. Math follows
// deepseek-v3-model.md §4-8 exactly.
#include "model/deepseek_v3.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "common/check.h"
#include "common/timer.h"
#include "kernels/activation.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "model/forward_internal.h"

namespace model {

using forward::add_norm_bias;
using forward::Scratch;
using forward::scratch;

DeepseekV3Model::DeepseekV3Model(ModelConfig config, ModelWeights weights, TensorParallel tp,
                                 LmHeadParallel lmhead_tp, DataParallelExperts dp_experts)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      tp_(tp),
      lmhead_tp_(lmhead_tp),
      dp_experts_(dp_experts) {
  rope_ = kernels::compute_rope_params(config_.qk_rope_head_dim, config_.rope_theta,
                                       config_.qk_head_dim(), config_.yarn);
}

common::Result<std::unique_ptr<DeepseekV3Model>> DeepseekV3Model::load(const std::string& model_dir,
                                                                       const LoadOptions& options) {
  CP_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
  CP_ASSIGN_OR_RETURN(auto checkpoint, Checkpoint::open(model_dir));
  CP_ASSIGN_OR_RETURN(ModelWeights weights, load_weights(*checkpoint, config, options));
  return std::make_unique<DeepseekV3Model>(std::move(config), std::move(weights), options.tp,
                                           options.lmhead_tp, options.dp_experts);
}

common::Status DeepseekV3Model::all_reduce(float* data, int64_t count) const {
  if (!tp_.active()) return {};
  CHECK(group_ != nullptr) << "tensor parallel model without a process group";
  return group_->all_reduce(data, size_t(count), dist::ReduceOp::kSum);
}

common::Status DeepseekV3Model::embed_rows(const tensor::WeightMatrix& table,
                                           std::span<const int32_t> ids, float* out) const {
  CHECK(!table.empty()) << "embedding table not loaded on this stage";
  const int64_t h = table.cols();
  const int64_t first = table.rows() * tp_.rank;  // this rank's vocabulary shard
  for (size_t i = 0; i < ids.size(); ++i) {
    CHECK(ids[i] >= 0 && ids[i] < config_.vocab_size) << "token id " << ids[i] << " out of range";
    const int64_t row = ids[i] - first;
    if (row < 0 || row >= table.rows()) {
      std::fill(out + i * h, out + (i + 1) * h, 0.0f);  // another rank's row
    } else if (table.dtype() == tensor::DType::kBF16) {
      kernels::bf16_to_f32_row(table.view().bf16() + row * h, out + i * h, h);
    } else {
      std::memcpy(out + i * h, table.view().f32() + row * h, h * sizeof(float));
    }
  }
  return all_reduce(out, int64_t(ids.size()) * h);  // one rank's row plus zeros: exact
}

common::Status DeepseekV3Model::embed(const ForwardBatch& batch, float* hidden) const {
  std::vector<int32_t> ids;
  for (const SequenceChunk& s : batch.sequences)
    ids.insert(ids.end(), s.token_ids.begin(), s.token_ids.end());
  return embed_rows(weights_.embed_tokens, ids, hidden);
}

common::Status DeepseekV3Model::run_layers(const ForwardBatch& batch, int layer_begin,
                                           int layer_end, float* hidden, LatentKvCache& cache,
                                           common::ThreadPool& pool) const {
  const Layout layout(batch, cache.block_size());
  for (int l = layer_begin; l < layer_end; ++l) {
    CP_RETURN_IF_ERROR(decoder_layer(weights_.layers[l], l, layout, hidden, cache, pool));
  }
  return {};
}

common::Status DeepseekV3Model::decoder_layer(const DecoderLayerWeights& w, int cache_layer,
                                              const Layout& layout, float* hidden,
                                              LatentKvCache& cache,
                                              common::ThreadPool& pool) const {
  CHECK(!w.input_layernorm.empty()) << "decoder layer " << cache_layer << " not loaded";
  const int64_t T = layout.num_tokens, H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  float* x = scratch(Scratch::kNormed, size_t(T * H));
  float* delta = scratch(Scratch::kSublayer, size_t(T * H));
  kernels::rms_norm(hidden, T, H, H, w.input_layernorm.data(), eps, x, H);
  add_norm_bias(x, T, H, w.input_layernorm_bias);
  CP_RETURN_IF_ERROR(attention(w.attn, cache_layer, layout, x, delta, cache, pool));
  for (int64_t i = 0; i < T * H; ++i) hidden[i] += delta[i];
  kernels::rms_norm(hidden, T, H, H, w.post_attention_layernorm.data(), eps, x, H);
  add_norm_bias(x, T, H, w.post_attention_layernorm_bias);
  CP_RETURN_IF_ERROR(feed_forward(w, T, x, delta, pool));
  for (int64_t i = 0; i < T * H; ++i) hidden[i] += delta[i];
  return {};
}

common::Status DeepseekV3Model::feed_forward(const DecoderLayerWeights& w, int64_t T,
                                             const float* x, float* out,
                                             common::ThreadPool& pool) const {
  const int64_t H = config_.hidden_size;
  if (w.dense_mlp) {
    kernels::swiglu_mlp(x, T, w.dense_mlp->view(), out, pool);
    return all_reduce(out, T * H);  // down_proj is row-parallel
  }
  CHECK(w.moe.has_value()) << "layer has neither a dense MLP nor MoE weights";
  const MoeWeights& m = *w.moe;
  if ((tp_.active() && tp_.expert_parallel) || dp_experts_.active())
    return moe_expert_parallel(m, T, x, out, pool);
  const kernels::RouterParams rp = config_.router_params();
  std::vector<float> router_logits(T * rp.num_experts), topk_weights(T * rp.top_k);
  std::vector<int32_t> topk_ids(T * rp.top_k);
  kernels::linear(x, T, m.router.view(), router_logits.data(), pool);
  kernels::route_experts(router_logits.data(), T,
                         m.correction_bias.empty() ? nullptr : m.correction_bias.data(), rp,
                         topk_ids.data(), topk_weights.data());
  if (m.shared) {
    kernels::swiglu_mlp(x, T, m.shared->view(), out, pool);
  } else {
    std::fill(out, out + T * H, 0.0f);
  }
  kernels::moe_dispatch(x, T, H, topk_ids.data(), topk_weights.data(), rp.top_k, m.expert_views,
                        out, pool);
  return all_reduce(out, T * H);  // every expert's intermediate columns are split
}

// Expert parallelism. The expert group is the TP group, or, with experts over data-parallel
// ranks, every rank of every DP rank's TP group (vLLM's EP world, DP x TP). Every rank of a TP
// group holds the group's tokens (attention is TP), so each takes an equal slice of them (the
// last ones padded), routes it, and sends each (token, expert) pair to the rank that holds the
// expert: all-to-all of records [local expert id, weight, hidden row] over the expert group.
// The receiving rank runs its experts on what it got and sends the weighted rows back in the
// order they came (a second all-to-all). Each rank adds its tokens' returned rows in ascending
// expert order, after the shared experts (whole on every rank, run on its own slice), which is
// the order TP=1 adds them in. An all-gather of the slices over the TP group gives each of its
// ranks the whole output; without TP a rank's slice is all of its tokens, and its output its own.
common::Status DeepseekV3Model::moe_expert_parallel(const MoeWeights& m, int64_t T, const float* x,
                                                    float* out, common::ThreadPool& pool) const {
  const int64_t H = config_.hidden_size;
  const bool over_dp = dp_experts_.active();
  dist::ProcessGroup* group = over_dp ? expert_group_ : group_;
  CHECK(group != nullptr) << "expert parallel model without a process group";
  CHECK(!tp_.active() || group_ != nullptr) << "tensor parallel model without a process group";
  const int P = over_dp ? dp_experts_.size : tp_.size, me = over_dp ? dp_experts_.rank : tp_.rank;
  const int per_rank_experts = static_cast<int>(m.experts.size());
  const kernels::RouterParams rp = config_.router_params();
  const int k = rp.top_k;
  const double t_start = common::now_seconds();
  // This rank's slice of its TP group's tokens.
  const int64_t per = (T + tp_.size - 1) / tp_.size;
  const int64_t t0 = std::min(T, per * tp_.rank), t1 = std::min(T, t0 + per), n = t1 - t0;
  std::vector<float> router_logits(n * rp.num_experts), topk_weights(n * k);
  std::vector<int32_t> topk_ids(n * k);
  if (n > 0) {
    kernels::linear(x + t0 * H, n, m.router.view(), router_logits.data(), pool);
    kernels::route_experts(router_logits.data(), n,
                           m.correction_bias.empty() ? nullptr : m.correction_bias.data(), rp,
                           topk_ids.data(), topk_weights.data());
  }
  // Records to each destination, in (token, slot) order within a destination.
  const size_t record = sizeof(int32_t) + sizeof(float) + size_t(H) * sizeof(float);
  std::vector<std::vector<int64_t>> to(static_cast<size_t>(P));  // assignment indices
  for (int64_t a = 0; a < n * k; ++a) to[size_t(topk_ids[a] / per_rank_experts)].push_back(a);
  std::vector<size_t> send_bytes(static_cast<size_t>(P)), recv_bytes(static_cast<size_t>(P));
  std::vector<int64_t> counts(static_cast<size_t>(P)),
      all_counts(static_cast<size_t>(P) * static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) counts[size_t(p)] = int64_t(to[size_t(p)].size());
  CP_RETURN_IF_ERROR(
      group->all_gather(counts.data(), counts.size() * sizeof(int64_t), all_counts.data()));
  std::vector<uint8_t> send, recv;
  for (int p = 0; p < P; ++p) {
    send_bytes[size_t(p)] = size_t(counts[size_t(p)]) * record;
    recv_bytes[size_t(p)] =
        size_t(all_counts[size_t(p) * static_cast<size_t>(P) + size_t(me)]) * record;
    for (int64_t a : to[size_t(p)]) {
      const int32_t local = topk_ids[a] % per_rank_experts;
      const size_t at = send.size();
      send.resize(at + record);
      std::memcpy(send.data() + at, &local, sizeof(local));
      std::memcpy(send.data() + at + 4, &topk_weights[a], sizeof(float));
      std::memcpy(send.data() + at + 8, x + (t0 + a / k) * H, size_t(H) * sizeof(float));
    }
  }
  size_t received = 0;
  for (size_t b : recv_bytes) received += b;
  recv.resize(received);
  CP_RETURN_IF_ERROR(group->all_to_all_v(send.data(), send_bytes, recv.data(), recv_bytes));
  const double t_dispatched = common::now_seconds();
  // This rank's experts on every record it received (top_k 1: one expert per record).
  const int64_t rows = int64_t(received / record);
  std::vector<float> xr(rows * H), yr(rows * H, 0.0f), wr(rows);
  std::vector<int32_t> er(rows);
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* r = recv.data() + size_t(i) * record;
    std::memcpy(&er[i], r, 4);
    std::memcpy(&wr[i], r + 4, 4);
    CHECK(er[i] >= 0 && er[i] < per_rank_experts) << "expert record out of range";
    std::memcpy(xr.data() + i * H, r + 8, size_t(H) * sizeof(float));
  }
  if (rows > 0)
    kernels::moe_dispatch(xr.data(), rows, H, er.data(), wr.data(), 1, m.expert_views, yr.data(),
                          pool);
  const double t_computed = common::now_seconds();
  // Back to where the records came from, in the order they came.
  std::vector<size_t> back_send(static_cast<size_t>(P)), back_recv(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) {
    back_send[size_t(p)] = recv_bytes[size_t(p)] / record * size_t(H) * sizeof(float);
    back_recv[size_t(p)] = send_bytes[size_t(p)] / record * size_t(H) * sizeof(float);
  }
  std::vector<float> returned(size_t(n * k) * size_t(H));
  CP_RETURN_IF_ERROR(group->all_to_all_v(yr.data(), back_send, returned.data(), back_recv));
  // Combine: shared experts, then the routed rows in ascending expert order per token.
  std::vector<float> mine(size_t(per) * size_t(H), 0.0f);
  if (m.shared && n > 0) kernels::swiglu_mlp(x + t0 * H, n, m.shared->view(), mine.data(), pool);
  std::vector<int64_t> row_of(size_t(n * k));  // assignment -> row in `returned`
  int64_t next = 0;
  for (int p = 0; p < P; ++p)
    for (int64_t a : to[size_t(p)]) row_of[size_t(a)] = next++;
  std::vector<int> order(static_cast<size_t>(k));
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) order[size_t(j)] = j;
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return topk_ids[t * k + a] < topk_ids[t * k + b]; });
    float* o = mine.data() + t * H;
    for (int j : order) {
      const float* y = returned.data() + row_of[size_t(t * k + j)] * H;
      for (int64_t d = 0; d < H; ++d) o[d] += y[d];
    }
  }
  if (!tp_.active()) {
    std::copy(mine.begin(), mine.begin() + T * H, out);
  } else {
    std::vector<float> gathered(size_t(per) * static_cast<size_t>(tp_.size) * size_t(H));
    CP_RETURN_IF_ERROR(
        group_->all_gather(mine.data(), mine.size() * sizeof(float), gathered.data()));
    std::memcpy(out, gathered.data(), size_t(T * H) * sizeof(float));
  }
  const double t_end = common::now_seconds();
  moe_times_.dispatch_s += t_dispatched - t_start;
  moe_times_.experts_s += t_computed - t_dispatched;
  moe_times_.combine_s += t_end - t_computed;
  ++moe_times_.layers;
  return {};
}

void DeepseekV3Model::final_norm(const float* hidden, int64_t rows, float* normed) const {
  CHECK(!weights_.norm.empty()) << "final norm not loaded on this stage";
  const int64_t H = config_.hidden_size;
  kernels::rms_norm(hidden, rows, H, H, weights_.norm.data(),
                    static_cast<float>(config_.rms_norm_eps), normed, H);
}

namespace {

// logits[rows, V] from `parts` vocabulary shards of `per` columns each; shard p's row r is at
// shards[(p * stride + r) * per] (the last shard's padding columns are dropped).
void assemble_vocab_shards(const float* shards, int parts, int64_t stride, int64_t rows,
                           int64_t per, int64_t V, float* logits) {
  for (int p = 0; p < parts; ++p) {
    const int64_t v0 = per * p, width = std::min(per, V - v0);
    if (width <= 0) continue;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(logits + r * V + v0, shards + (int64_t(p) * stride + r) * per,
                  size_t(width) * sizeof(float));
  }
}

}  // namespace

common::Status DeepseekV3Model::head_logits(const tensor::WeightMatrix& head, const float* normed,
                                            int64_t rows, float* logits,
                                            common::ThreadPool& pool) const {
  CHECK(!head.empty()) << "lm_head not loaded on this stage";
  const int64_t V = config_.vocab_size;
  if (lmhead_tp_.active()) {
    // vllm-ascend's lm_head TP: gather every rank's rows (padded to the longest), multiply
    // this rank's vocabulary shard, and send each rank its rows' logits (all-to-all).
    CHECK(lmhead_group_ != nullptr) << "lmhead_tensor_parallel_size without its group";
    const int g = lmhead_tp_.size;
    const int64_t H = config_.hidden_size, per = head.rows();
    std::vector<int64_t> counts(static_cast<size_t>(g));
    int64_t mine = rows;
    CP_RETURN_IF_ERROR(lmhead_group_->all_gather(&mine, sizeof(mine), counts.data()));
    const int64_t R = *std::max_element(counts.begin(), counts.end());
    if (R == 0) return {};
    std::vector<float> padded(size_t(R * H), 0.0f), all_rows(size_t(g) * size_t(R * H));
    std::copy(normed, normed + rows * H, padded.begin());
    CP_RETURN_IF_ERROR(
        lmhead_group_->all_gather(padded.data(), padded.size() * sizeof(float), all_rows.data()));
    std::vector<float> local(size_t(g) * size_t(R * per)), back(local.size());
    kernels::linear(all_rows.data(), g * R, head.view(), local.data(), pool);
    const std::vector<size_t> block(static_cast<size_t>(g), size_t(R * per) * sizeof(float));
    CP_RETURN_IF_ERROR(lmhead_group_->all_to_all_v(local.data(), block, back.data(), block));
    assemble_vocab_shards(back.data(), g, R, rows, per, V, logits);
    return {};
  }
  if (!tp_.active()) {
    kernels::linear(normed, rows, head.view(), logits, pool);
    return {};
  }
  // Vocabulary-parallel: this rank's [rows, per] shard, gathered into [rows, V].
  const int64_t per = head.rows();
  std::vector<float> local(size_t(rows * per)), all(size_t(rows * per) * size_t(tp_.size));
  kernels::linear(normed, rows, head.view(), local.data(), pool);
  CP_RETURN_IF_ERROR(group_->all_gather(local.data(), local.size() * sizeof(float), all.data()));
  assemble_vocab_shards(all.data(), tp_.size, rows, rows, per, V, logits);
  return {};
}

common::Result<int64_t> DeepseekV3Model::most_head_calls(int64_t mine) const {
  if (!head_is_collective()) return mine;
  CHECK(lmhead_group_ != nullptr) << "lmhead_tensor_parallel_size without its group";
  CP_RETURN_IF_ERROR(lmhead_group_->all_reduce(&mine, 1, dist::ReduceOp::kMax));
  return mine;
}

common::Status DeepseekV3Model::compute_logits(const float* normed, int64_t rows, float* logits,
                                               common::ThreadPool& pool) const {
  return head_logits(weights_.lm_head, normed, rows, logits, pool);
}

common::Status DeepseekV3Model::mtp_forward(const ForwardBatch& batch, const float* prev_hidden,
                                            bool from_main, std::span<const int32_t> next_token_ids,
                                            LatentKvCache& cache, common::ThreadPool& pool,
                                            float* mtp_hidden, int k) const {
  CHECK(k >= 0 && k < num_mtp_layers()) << "MTP layer " << k << " not loaded";
  const MtpWeights& m = weights_.mtp[k];
  const Layout layout(batch, cache.block_size());
  const int64_t T = layout.num_tokens, H = config_.hidden_size;
  CHECK(static_cast<int64_t>(next_token_ids.size()) == T) << "one next token per row";
  const float eps = static_cast<float>(config_.rms_norm_eps);
  std::vector<float> e(T * H), cat(T * 2 * H);
  CP_RETURN_IF_ERROR(embed_rows(m.embed_tokens.empty() ? weights_.embed_tokens : m.embed_tokens,
                                next_token_ids, e.data()));
  // Embedding first, hidden state second (vLLM / SGLang order).
  kernels::rms_norm(e.data(), T, H, H, m.enorm.data(), eps, cat.data(), 2 * H);
  if (!from_main || weights_.mtp_rotation.empty()) {
    kernels::rms_norm(prev_hidden, T, H, H, m.hnorm.data(), eps, cat.data() + H, 2 * H);
  } else {
    // QuaRot: the main model's hidden state is rotated; the MTP layer is not.
    std::vector<float> unrotated(T * H);
    kernels::linear(prev_hidden, T, weights_.mtp_rotation.view(), unrotated.data(), pool);
    kernels::rms_norm(unrotated.data(), T, H, H, m.hnorm.data(), eps, cat.data() + H, 2 * H);
  }
  kernels::linear(cat.data(), T, m.eh_proj.view(), mtp_hidden, pool);
  CP_RETURN_IF_ERROR(
      decoder_layer(m.layer, config_.num_hidden_layers + k, layout, mtp_hidden, cache, pool));
  kernels::rms_norm(mtp_hidden, T, H, H, m.shared_head_norm.data(), eps, mtp_hidden, H);
  return {};
}

common::Status DeepseekV3Model::mtp_head_logits(const float* mtp_hidden, int64_t rows,
                                                float* logits, common::ThreadPool& pool,
                                                int k) const {
  CHECK(k >= 0 && k < num_mtp_layers()) << "MTP layer " << k << " not loaded";
  const MtpWeights& m = weights_.mtp[k];
  const tensor::WeightMatrix& head =
      m.shared_head_head.empty() ? weights_.lm_head : m.shared_head_head;
  return head_logits(head, mtp_hidden, rows, logits, pool);
}

common::Status DeepseekV3Model::mtp_logits(const ForwardBatch& batch, const float* main_normed,
                                           std::span<const int32_t> next_token_ids,
                                           LatentKvCache& cache, common::ThreadPool& pool,
                                           float* draft_logits, int k) const {
  const int64_t T = batch.num_tokens();
  std::vector<float> h(T * config_.hidden_size);
  CP_RETURN_IF_ERROR(mtp_forward(batch, main_normed, /*from_main=*/true, next_token_ids, cache,
                                 pool, h.data(), k));
  return mtp_head_logits(h.data(), T, draft_logits, pool, k);
}

}  // namespace model
