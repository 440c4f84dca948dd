// FLOP counts of a DeepSeek-V3 layer per term (2 FLOPs per multiply-add), as the engine
// computes it: the expanded form re-expands k_nope ‖ v of every context token from the latent;
// the absorbed form folds W_UK into q and W_UV into o and attends over the latent.
#include "sched/cost_from_dims.h"

#include <algorithm>

namespace sched {

ModelDims deepseek_v3_dims() {
  ModelDims d;
  d.hidden = 7168;
  d.layers = 61;
  d.dense_layers = 3;
  d.heads = 128;
  d.q_lora_rank = 1536;
  d.kv_lora_rank = 512;
  d.qk_nope = 128;
  d.qk_rope = 64;
  d.v_head = 128;
  d.routed_experts = 256;
  d.experts_per_token = 8;
  d.shared_experts = 1;
  d.moe_inter = 2048;
  d.inter = 18432;
  d.vocab = 129280;
  return d;
}

std::vector<int64_t> stage_layer_counts(int64_t layers, int num_stages) {
  const int S = std::max(1, num_stages);
  std::vector<int64_t> counts(S, layers / S);
  for (int64_t i = 0; i < layers % S; ++i) ++counts[i];
  return counts;
}

TermFlops term_flops(const ModelDims& d, int64_t first_layer, int64_t num_layers) {
  const double H = double(d.hidden), nh = double(d.heads), r = double(d.kv_lora_rank),
               dn = double(d.qk_nope), dr = double(d.qk_rope), dv = double(d.v_head);
  const double q_proj = d.q_lora_rank > 0
                            ? H * double(d.q_lora_rank) + double(d.q_lora_rank) * nh * (dn + dr)
                            : H * nh * (dn + dr);
  const double projections = q_proj + H * (r + dr) + nh * dv * H;  // q, kv_a, o
  const double expand = r * nh * (dn + dv);                        // one token's k_nope ‖ v
  const double dense_mlp = 3 * H * double(d.inter);
  const double moe_mlp =
      3 * H * double(d.moe_inter) * double(d.experts_per_token + d.shared_experts) +
      H * double(d.routed_experts);
  TermFlops t;
  for (int64_t l = first_layer; l < first_layer + num_layers; ++l) {
    const double mlp = l < d.dense_layers ? dense_mlp : moe_mlp;
    t.per_token += 2 * (projections + mlp + expand);
    t.per_history += 2 * expand;
    t.per_pair += 2 * nh * (dn + dr + dv);
    t.absorbed_per_token += 2 * (projections + mlp + nh * r * (dn + dv));
    t.absorbed_per_pair += 2 * nh * (2 * r + dr);
  }
  return t;
}

ChunkCostModel cost_model_from_dims(const ModelDims& dims, const StageRates& rates) {
  const auto counts = stage_layer_counts(dims.layers, rates.num_stages);
  TermFlops slowest;
  for (int64_t s = 0, first = 0; s < static_cast<int64_t>(counts.size()); first += counts[s++]) {
    const TermFlops t = term_flops(dims, first, counts[s]);
    if (t.per_token + t.per_pair * 4096 > slowest.per_token + slowest.per_pair * 4096) slowest = t;
  }
  const double tp = std::max(1, rates.tensor_parallel);
  const double linear = 1e9 * rates.linear_tflops * tp;  // FLOPs per ms
  const double attention = 1e9 * rates.attention_tflops * tp;
  const FormCoefficients expanded{true, rates.overhead_ms, slowest.per_token / linear,
                                  slowest.per_history / linear, slowest.per_pair / attention};
  const FormCoefficients absorbed{true, rates.overhead_ms, slowest.absorbed_per_token / linear, 0.0,
                                  slowest.absorbed_per_pair / attention};
  return ChunkCostModel(expanded, absorbed);
}

}  // namespace sched
