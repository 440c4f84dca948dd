// The chunk planner: for one prompt on S pipeline stages, the whole chunk sequence that
// minimises the predicted time to its last chunk leaving the last stage (TTFT), with the
// pipeline's fill, drain and in-flight limit counted, under a ChunkCostModel. Also the pipeline
// recurrence itself and the fixed-chunk plan, which the simulator and the benchmarks share.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "sched/chunk_cost_model.h"

namespace sched {

struct PlanOptions {
  int64_t prompt_tokens = 0;  // the whole prompt
  int64_t history = 0;        // tokens already computed (prefix-cache hits, earlier chunks)
  int64_t max_chunk = 0;      // the token budget B (--max-num-batched-tokens)
  int64_t min_chunk = 1;      // no chunk below this but the last
  int64_t align = 16;         // chunks round down to this (when at least this large)
  int num_stages = 2;
  // Stage-to-stage hop of one chunk: link_ms + link_ms_per_token · tokens (0 on one host).
  double link_ms = 0, link_ms_per_token = 0;
  int max_chunks = 256;  // the planner's search bound
  // best_plan keeps fixed chunks unless a plan predicts at least this fraction less TTFT: the
  // cost model's error on a whole prompt is a few percent (the cpp-sim validation), and a
  // prediction inside it is not worth more forwards.
  double min_predicted_gain = 0.03;
};

struct PlannedChunk {
  int64_t tokens = 0, history = 0;
  AttentionForm form = AttentionForm::kExpanded;
  double ms = 0;  // predicted per-stage time
};

struct ChunkPlan {
  std::vector<PlannedChunk> chunks;
  double chunk_ms = 0;  // the time each chunk may take (what the scheduler targets); 0: fixed
  double ttft_ms = 0;   // predicted, from the pipeline recurrence
  double work_ms = 0;   // one stage's busy time: the sum of the chunks' times
  // Idle fraction of the stages over the prompt: 1 - S·work / (S·ttft) (no link time).
  double bubble() const { return ttft_ms > 0 ? 1.0 - work_ms / ttft_ms : 0.0; }
};

// When the last of the chunks leaves the last stage, every stage taking chunk_ms[k] for chunk
// k, in order, with at most `num_stages` chunks in flight (the engine's batch queue): stage s
// starts chunk k once it finished chunk k-1 and chunk k arrived from stage s-1 (plus the
// hop), and stage 0 starts chunk k only after chunk k-S left the last stage.
double pipeline_ttft_ms(const std::vector<double>& chunk_ms, const std::vector<int64_t>& tokens,
                        const PlanOptions& options);

// The chunk a greedy plan takes at `history` with `remaining` prompt tokens: the largest that
// fits in chunk_ms, rounded down to `align`, floored at min_chunk, capped at max_chunk and the
// remainder. The scheduler calls this each step, so it reproduces the plan chunk by chunk.
int64_t planned_chunk_tokens(const ChunkCostModel& model, const PlanOptions& options,
                             int64_t history, int64_t remaining, double chunk_ms);

// Every chunk as large as chunk_ms allows, from options.history to the prompt's end.
ChunkPlan greedy_plan(const ChunkCostModel& model, const PlanOptions& options, double chunk_ms);
// Chunks of max_chunk tokens (vLLM's chunked prefill without CPP).
ChunkPlan fixed_plan(const ChunkCostModel& model, const PlanOptions& options);
// For each chunk count K, the smallest chunk time whose greedy plan has at most K chunks; the
// K whose plan has the least predicted TTFT wins (ties: fewer chunks), if it beats fixed
// chunks by options.min_predicted_gain; else the fixed plan.
ChunkPlan best_plan(const ChunkCostModel& model, const PlanOptions& options);

}  // namespace sched
