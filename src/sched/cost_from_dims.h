// A ChunkCostModel from a DeepSeek-V3-class model's dimensions and a stage's compute rates:
// FLOPs per term (the same terms the engine's probes fit) divided by the rate, for the slowest
// pipeline stage of vLLM's layer partition. The scale simulator (`chunkpipe cpp-sim`) uses it
// for machines it cannot measure. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "sched/chunk_cost_model.h"

namespace sched {

struct ModelDims {
  int64_t hidden = 0, layers = 0, dense_layers = 0, heads = 0;
  int64_t q_lora_rank = 0;  // 0: a plain q_proj
  int64_t kv_lora_rank = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  int64_t routed_experts = 0, experts_per_token = 0, shared_experts = 0;
  int64_t moe_inter = 0, inter = 0, vocab = 0;
};

// DeepSeek-V3 / V3.1 (config.json of the released checkpoints).
ModelDims deepseek_v3_dims();

struct StageRates {
  int num_stages = 1;
  int tensor_parallel = 1;      // devices per stage; every term divides evenly over them
  double linear_tflops = 1;     // effective per device: projections, MLPs, re-expansion
  double attention_tflops = 1;  // effective per device: scores and weighted sums
  double overhead_ms = 0;       // per forward (launches, collectives, weight streaming)
};

// Layers of each stage, as vLLM's get_pp_indices splits them (remainder to the first stages).
std::vector<int64_t> stage_layer_counts(int64_t layers, int num_stages);

// FLOPs of each term for the layers [first, first + count) (dense layers come first).
struct TermFlops {
  double per_token = 0, per_history = 0, per_pair = 0;  // expanded form
  double absorbed_per_token = 0, absorbed_per_pair = 0;
};
TermFlops term_flops(const ModelDims& dims, int64_t first_layer, int64_t num_layers);

// The slowest stage's cost model (by its per-token work), both forms.
ChunkCostModel cost_model_from_dims(const ModelDims& dims, const StageRates& rates);

}  // namespace sched
