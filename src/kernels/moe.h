// Mixture-of-experts: router (expert selection and weights) and expert dispatch grouped by
// expert. Stateless; thread-safe for distinct outputs.
#pragma once

#include <cstdint>
#include <span>

#include "common/thread_pool.h"
#include "tensor/weight_matrix.h"

namespace kernels {

// Most tokens an expert may have for the one-expert-per-thread form of moe_dispatch (decode-sized
// batches), whose expert outputs are all held at once.
inline constexpr int64_t kExpertsPerThreadMaxTokens = 8;

enum class ScoringFunc { kSigmoid, kSoftmax };
enum class TopkMethod { kNoauxTc, kGreedy, kGroupLimitedGreedy };

struct RouterParams {
  int num_experts = 0;
  int top_k = 0;
  int num_groups = 1;     // n_group: contiguous groups of num_experts / num_groups
  int topk_groups = 1;    // topk_group: groups kept
  bool normalize = true;  // norm_topk_prob
  float routed_scaling_factor = 1.0f;
  ScoringFunc scoring = ScoringFunc::kSigmoid;
  TopkMethod method = TopkMethod::kNoauxTc;
};

// router_logits [T, E]; correction_bias [E] (noaux_tc only; may be null otherwise).
// Writes topk_ids [T, k] and topk_weights [T, k]. Selection uses biased scores (+ group
// limiting); weights use the unbiased scores, normalized then scaled.
void route_experts(const float* router_logits, int64_t num_tokens, const float* correction_bias,
                   const RouterParams& params, int32_t* topk_ids, float* topk_weights);

// One SwiGLU expert: fused [gate; up] rows [2·inter, H] and down [H, inter].
struct ExpertWeights {
  tensor::WeightView gate_up;
  tensor::WeightView down;
};

// out[T, H] += Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t]). Tokens are grouped per
// expert so each expert's weights are read once per call.
void moe_dispatch(const float* x, int64_t num_tokens, int64_t hidden, const int32_t* topk_ids,
                  const float* topk_weights, int top_k, std::span<const ExpertWeights> experts,
                  float* out, common::ThreadPool& pool);
// Reference: per token, per selected expert, naive linear layers.
void moe_dispatch_reference(const float* x, int64_t num_tokens, int64_t hidden,
                            const int32_t* topk_ids, const float* topk_weights, int top_k,
                            std::span<const ExpertWeights> experts, float* out);

// SwiGLU MLP on rows: out[T, H] = down(silu(gate(x)) ⊙ up(x)); out may not alias x.
void swiglu_mlp(const float* x, int64_t num_tokens, const ExpertWeights& weights, float* out,
                common::ThreadPool& pool);

}  // namespace kernels
