// profiling_chunk_config: the CPP settings of --additional-config
// '{"scheduler_config": {"profiling_chunk_config": {...}}}' (or the deprecated top-level key),
// with vllm-ascend's defaults, validation messages and min_chunk clamping. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace sched {

struct ProfilingChunkConfig {
  // "planned" (chunkpipe's default): startup probes at zero and non-zero history in both
  // attention forms fit a ChunkCostModel, and each prompt's chunks come from the plan with the
  // least predicted TTFT (sched/chunk_planner.h). "upstream": vllm-ascend's exact behaviour (the
  // from-scratch quadratic fit, T = f(B) - f(0), online history model, chunk-by-chunk solve).
  enum Mode { kPlanned, kUpstream };
  Mode mode = kPlanned;
  bool enabled = false;
  double smooth_factor = 1.0;
  int64_t min_chunk = 4096;
  bool need_timing = false;  // defaults to `enabled`
  int max_fit_chunk = 30;
  // chunkpipe extension: which stage's time feeds profiling and calibration. "last" is
  // vllm-ascend's behaviour; "max" times every stage and uses the slowest, which is the one
  // that sets the pipeline's pace when the partition is uneven. Default: "max" in planned mode,
  // "last" in upstream mode.
  std::string timing_stage = "max";
  // chunkpipe extension: a prompt remainder of at most this many tokens after a predicted chunk
  // is folded into that chunk (when the token budget allows) instead of costing its own
  // pipeline round; the fitted model sees no per-forward cost in it (c cancels). 0, the
  // default, is vllm-ascend's behaviour.
  int64_t merge_tail = 0;
  // chunkpipe extension: size a prompt's chunks for the least TTFT counting the fitted
  // per-forward cost c (see ChunkSizePredictor::request_target_ms) rather than at the time of
  // a base chunk. false, the default, is vllm-ascend's behaviour.
  bool overhead_aware = false;
  // chunkpipe extension: predicted chunk sizes round up to a multiple of this many tokens
  // instead of max(block_size, 64) (vllm-ascend's NPU-friendly alignment). Finer steps let
  // late, history-heavy chunks match T more closely. 0, the default, is upstream's.
  int64_t chunk_align = 0;
  // Planned mode: fixed chunks stay unless a plan predicts at least this fraction less TTFT
  // (PlanOptions::min_predicted_gain); 0 takes any predicted gain.
  double min_predicted_gain = 0.03;
};

// Reads and validates the config from the whole --additional-config object. `warnings`
// receives the messages vllm-ascend logs as warnings (clamping, forced need_timing).
common::Result<ProfilingChunkConfig> parse_profiling_chunk_config(
    const nlohmann::json& additional_config, int pipeline_parallel_size,
    int64_t max_num_batched_tokens, std::vector<std::string>* warnings);

}  // namespace sched
