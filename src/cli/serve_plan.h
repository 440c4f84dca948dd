// The serve command's flags and its plan: vLLM's `vllm serve` flags declared on an ArgParser,
// then parsed and validated into the server's, engine's, pipeline's, data-parallel and KV
// transfer configs. Flags whose feature is not built yet are errors that say so (kUnimplemented);
// a bad value is an invalid-argument error in argparse's words. Starts nothing. Thread-compatible.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/arg_parser.h"
#include "cli/data_parallel.h"
#include "cli/speculative_config.h"
#include "common/status.h"
#include "engine/engine_core.h"
#include "server/api_server.h"
#include "transfer/kv_connector_factory.h"
#include "transfer/kv_transfer_config.h"
#include "worker/stage_launcher.h"

namespace cli {

// What `serve` runs, from its flags.
struct ServePlan {
  std::string model_dir;
  server::ServerConfig server;
  engine::EngineConfig engine;
  int64_t kv_cache_bytes = -1;
  std::optional<int64_t> num_blocks_override;  // --num-gpu-blocks-override
  double memory_utilization = 0.9;
  std::string chat_template_file;
  std::string tokenizer_dir;
  int pipeline_parallel_size = 1;
  int tensor_parallel_size = 1;         // processes per pipeline stage
  bool expert_parallel = false;         // --enable-expert-parallel with tensor_parallel_size > 1
  bool numa_bind = false;               // --numa-bind: each rank on a NUMA node of its host
  int lmhead_tensor_parallel_size = 0;  // additional_config.finegrained_tp_config
  std::vector<int> layer_partition;     // empty: even split
  std::optional<SpeculativeConfig> speculative;  // --speculative-config (MTP)
  bool lm_head_int8 = false;                     // additional_config.lm_head_int8
  bool bf16_activations = false;                 // --dtype bfloat16
  bool log_stats = true;                         // the periodic stats line (--disable-log-stats)
  worker::PipelineTopology topology;             // hosts of a multi-node pipeline
  bool headless = false;                         // this node runs stages only (node_rank > 0)
  std::string kv_transfer_config;                // --kv-transfer-config as given (empty: none)
  transfer::KvTransferConfig kv_transfer;
  int data_parallel_rank = 0;  // --data-parallel-rank (the pull connector's port offset)
  DataParallelPlan dp;
  std::vector<std::string> serve_args;  // "serve" and every argument, for engine processes
  nlohmann::json generation_overrides = nlohmann::json::object();  // --override-generation-config
};

// Declares every serve flag and alias on `p`.
void add_serve_flags(ArgParser& p);

// Parses and validates the flags `p` holds into `plan` (serve_args is the caller's).
common::Status plan_serve(const ArgParser& p, ServePlan* plan);

// --max-model-len, which also accepts vLLM's 1k / 2K / 1m suffixes.
common::Result<int64_t> max_model_len_value(const ArgParser& p);

// Where this process's KV connector sits: its data-parallel rank, the pipeline and TP sizes.
transfer::ConnectorPlacement connector_placement(const ServePlan& plan);

}  // namespace cli
