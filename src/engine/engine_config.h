// EngineConfig: how an EngineCore schedules and what its KV cache and workers look like. Plain
// data, validated by the caller (cli/serve_command.cpp plans it from the flags).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dist/process_group.h"
#include "sched/kv_connector.h"
#include "sched/profiling_chunk_config.h"
#include "sched/sampling_params.h"
#include "sched/scheduler.h"

namespace engine {

struct EngineConfig {
  sched::SchedulerConfig scheduler;
  int block_size = 16;
  int64_t num_kv_blocks = 0;
  bool enable_prefix_caching = true;
  int num_threads = 1;
  uint64_t seed = 0;
  // --logprobs-mode: what every request's generated-token logprobs hold.
  sched::LogprobsMode logprobs_mode = sched::LogprobsMode::kRawLogprobs;
  // --enable-log-requests: a line when the engine takes a request (prompt, parameters, ids) and
  // one when it finishes (counts, timings); log_outputs adds the output text and ids.
  bool log_requests = false;
  bool log_outputs = false;
  int64_t max_log_len = -1;  // characters / ids of text and id lists in those lines (< 0: all)
  // config.json's eos_token_id: the stop token when the tokenizer names no EOS.
  int32_t model_eos_token_id = -1;
  // config.json's vocab_size: a request whose prompt or sampling ids reach past it is refused
  // at intake, alone (sched/token_id_checks.h); 0: the workers' own check is the only one.
  int64_t model_vocab_size = 0;
  // CPP: dynamic chunk sizing (startup profiling, online calibration); see
  // sched/profiling_chunk_config.h. Validated by the caller.
  std::optional<sched::ProfilingChunkConfig> profiling_chunk;
  std::string trace_file;  // pipeline: Chrome trace of every (step, stage), written at shutdown
  // Keep each token's expanded k_nope ‖ v beside the latent (model/kv_cache.h): more memory per
  // block, no per-chunk re-expansion of the history. chunkpipe extension, off by default.
  bool expanded_kv_cache = false;
  // --kv-cache-dtype bfloat16: the latent cache holds bf16 (model::KvCacheDtype::kBf16), else f32.
  bool bf16_kv_cache = false;
  // The scheduler side of a KV connector (sched/kv_connector.h); null: none.
  std::shared_ptr<sched::KvConnectorScheduler> kv_connector;
  // Data-parallel lock step (MoE experts or the lm_head split over DP ranks): the DP group
  // whose ranks step together, every rank running a forward (a dummy one without work) while
  // any rank has work. Not owned; null: this engine steps on its own.
  dist::ProcessGroup* dp_group = nullptr;
  // vllm-ascend's balance scheduling (with dp_group): while any rank of the group runs
  // max_num_seqs requests, no rank admits a waiting one, so the load gap stops widening.
  bool balance_scheduling = false;
  int engine_index = 0;  // the data-parallel rank: the `engine` label of its metrics
  // Called once, from the engine thread, if the engine fails (a pipeline stage died): every
  // request has then been finished with the error, and the engine accepts no more work.
  std::function<void(const std::string&)> on_fatal;
};

}  // namespace engine
