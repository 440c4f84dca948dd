// Layer partition and stage specs.
#include "worker/stage_plan.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace worker {

common::Result<std::vector<std::pair<int, int>>> partition_layers(int num_layers, int num_stages,
                                                                  const std::vector<int>& counts) {
  std::vector<std::pair<int, int>> ranges;
  if (!counts.empty()) {
    if (static_cast<int>(counts.size()) != num_stages) {
      return common::invalid_argument("the layer partition has " + std::to_string(counts.size()) +
                                      " entries for " + std::to_string(num_stages) +
                                      " pipeline stages");
    }
    int begin = 0, total = 0;
    for (int c : counts) {
      if (c <= 0) return common::invalid_argument("every pipeline stage needs at least one layer");
      total += c;
    }
    if (total != num_layers) {
      return common::invalid_argument("the layer partition covers " + std::to_string(total) +
                                      " layers but the model has " + std::to_string(num_layers));
    }
    for (int c : counts) {
      ranges.emplace_back(begin, begin + c);
      begin += c;
    }
    return ranges;
  }
  if (num_stages > num_layers) {
    return common::invalid_argument(std::to_string(num_stages) + " pipeline stages for " +
                                    std::to_string(num_layers) + " layers");
  }
  const int base = num_layers / num_stages, rem = num_layers % num_stages;
  int begin = 0;
  for (int s = 0; s < num_stages; ++s) {
    const int n = base + (s < rem ? 1 : 0);
    ranges.emplace_back(begin, begin + n);
    begin += n;
  }
  return ranges;
}

common::Result<std::vector<StageSpec>> stage_specs(const PipelineOptions& o,
                                                   const model::ModelConfig& config) {
  CP_ASSIGN_OR_RETURN(auto ranges,
                      partition_layers(config.num_hidden_layers, o.num_stages, o.layer_counts));
  PipelineTopology topo = o.topology;
  topo.num_stages = o.num_stages;
  topo.tp_size = o.tensor_parallel_size;
  CP_RETURN_IF_ERROR(validate_topology(topo));
  const std::vector<int> cpus = allowed_cpus();
  const int ncpu = static_cast<int>(cpus.size());
  std::vector<StageSpec> specs;
  for (int s = 0; s < o.num_stages; ++s) {
    StageSpec spec;
    spec.model_dir = o.model_dir;
    spec.stage = s;
    spec.num_stages = o.num_stages;
    spec.layer_begin = ranges[s].first;
    spec.layer_end = ranges[s].second;
    spec.threads = o.threads_per_stage;
    spec.num_blocks = o.num_blocks;
    spec.block_size = o.block_size;
    spec.expanded_kv_cache = o.expanded_kv_cache;
    spec.num_speculative_tokens = o.num_speculative_tokens;
    spec.lm_head_int8 = o.lm_head_int8;
    spec.bf16_activations = o.bf16_activations;
    spec.bf16_kv_cache = o.bf16_kv_cache;
    spec.kv_transfer_config = o.kv_transfer_config;
    spec.kv_dp_rank = o.kv_dp_rank;
    spec.tp_size = o.tensor_parallel_size;
    spec.expert_parallel = o.expert_parallel;
    spec.experts_dp_rank = o.experts_dp_rank;
    spec.experts_dp_size = o.experts_dp_size;
    spec.experts_store = o.experts_store;
    if (o.numa_bind) spec.numa_node = 0;  // the launcher picks each rank's node
    if (o.pin_stages ||
        o.numa_bind) {  // the node's k-th rank on cores [k·t, (k+1)·t), wrapping (the
      // launcher places each TP rank)
      const int k = (s * topo.tp_size) % (o.num_stages * topo.tp_size / topo.nnodes);
      for (int t = 0; t < o.threads_per_stage; ++t)
        spec.cpus.push_back(cpus[size_t((k * o.threads_per_stage + t) % ncpu)]);
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty()) {
    const int n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    for (int c = 0; c < n; ++c) cpus.push_back(c);
  }
  return cpus;
}

common::Result<std::vector<StageSpec>> plan_stages(const PipelineOptions& options) {
  CP_ASSIGN_OR_RETURN(model::ModelConfig config, model::load_model_config(options.model_dir));
  return stage_specs(options, config);
}

}  // namespace worker
