// Stage planning for pipeline parallelism: which decoder layers each stage runs and the
// StageSpec every stage process starts with (shared by the engine's node and --headless
// nodes). Pure functions of the options and the model's config.json.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/config.h"
#include "worker/stage_launcher.h"

namespace worker {

// Layer ranges [begin, end) per stage: explicit counts, or near-equal with the remainder given
// to the first stages. Errors name the problem (counts that do not add up, empty stages).
common::Result<std::vector<std::pair<int, int>>> partition_layers(int num_layers, int num_stages,
                                                                  const std::vector<int>& counts);

struct PipelineOptions {
  std::string model_dir;
  int num_stages = 2;
  std::vector<int> layer_counts;  // empty: even split
  int threads_per_stage = 1;
  int64_t num_blocks = 0;
  int block_size = 16;
  bool pin_stages = false;  // stage s on cores [s·t, (s+1)·t) of its host
  bool numa_bind = false;   // each rank on a NUMA node of its host (worker/numa_binding.h)
  bool expanded_kv_cache = false;
  int num_speculative_tokens = 0;  // MTP drafts per step, on the last stage (0: off)
  bool lm_head_int8 = false;       // the last stage's lm_head in int8 (model::LoadOptions)
  bool bf16_activations = false;   // kernels::ActivationPrecision::kBf16 in every stage
  bool bf16_kv_cache = false;      // model::KvCacheDtype::kBf16 (serve's --kv-cache-dtype)
  std::string kv_transfer_config;  // passed to every stage (empty: no KV connector)
  int kv_dp_rank = 0;              // the instance's data-parallel rank, for the connector
  int tensor_parallel_size = 1;    // processes per stage
  bool expert_parallel = false;    // experts split over each stage's TP ranks
  // Experts over data-parallel ranks (DP x TP, with expert_parallel): this instance's DP rank
  // and the DP size (1: off), and the DP group's rendezvous store, "HOST:PORT".
  int experts_dp_rank = 0;
  int experts_dp_size = 1;
  std::string experts_store;
  PipelineTopology topology;       // num_stages is copied from above
  std::string worker_binary;       // empty: this binary
  double startup_timeout_s = 900;  // all stages (also remote ones) must be up by then
};

// Stage s's StageSpec under `options`, for a model with `config`.
// The cores this process may run on (its affinity mask: taskset, a container's cpuset), in
// order; every core when the mask cannot be read. Pinned ranks are placed on these.
std::vector<int> allowed_cpus();

common::Result<std::vector<StageSpec>> stage_specs(const PipelineOptions& options,
                                                   const model::ModelConfig& config);

// The stage specs of `options.model_dir`'s model (reads its config.json).
common::Result<std::vector<StageSpec>> plan_stages(const PipelineOptions& options);

}  // namespace worker
