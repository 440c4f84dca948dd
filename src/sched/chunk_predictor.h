// Dynamic chunk sizing for chunked pipeline-parallel prefill (CPP), vllm-ascend's semantics
// (shared/docs/cpp-design.md §4-7): a quadratic latency model f(l) = a·l² + b·l + c fitted on a
// startup profile, the target T = f(B) - f(0), chunk sizes solving cost(L, x) = T, a
// history-aware model refitted online, and the per-step time budget charge (predict_time).
// In chunkpipe's planned mode the same interface runs on a ChunkCostModel instead (chunk cost
// with history re-expansion, attention and per-forward terms, per attention form) and each
// prompt gets the chunk time of its best whole-sequence plan (sched/chunk_planner.h).
// Not thread-safe: owned by the scheduler thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sched/chunk_cost_model.h"
#include "sched/chunk_planner.h"

namespace sched {

// Least-squares solution of X·θ ≈ y for a tall X (rows × 3), by Householder QR (well
// conditioned even with l² ~ 1e9 columns). Empty when X is rank deficient.
std::vector<double> least_squares3(const std::vector<std::array<double, 3>>& x,
                                   const std::vector<double>& y);

class ChunkSizePredictor {
 public:
  static constexpr int kMinProfileSamples = 8;
  static constexpr int kMinHistorySamples = 5;
  static constexpr int kTargetSteps = 3;  // zero-history steps that (re)set T online

  ChunkSizePredictor(int64_t base_chunk, int page_size, double smooth_factor, int64_t min_chunk,
                     int max_fit_chunk);

  // The startup schedule: B, B - B/64, ..., B/64 after one warm-up of B (index 0).
  static std::vector<int64_t> profile_chunk_sizes(int64_t base_chunk, int num_samples = 64);

  // Fits f on (tokens, ms) samples and sets T. False when fewer than kMinProfileSamples.
  // `log` receives the [ProfilingChunk] lines.
  bool fit_profile(const std::vector<std::pair<int64_t, double>>& samples,
                   std::vector<std::string>* log);

  bool ready() const { return ready_; }
  // The from-scratch model f(l) = a·l² + b·l + c; in planned mode, the cost model's expanded
  // form at zero history (a = α/2, b = β + α/2, c), so /metrics means the same in both modes.
  double a() const { return planned_ ? cost_model_.expanded().per_pair_ms / 2 : a_; }
  double b() const {
    return planned_ ? cost_model_.expanded().per_token_ms + cost_model_.expanded().per_pair_ms / 2
                    : b_;
  }
  double c() const { return planned_ ? cost_model_.expanded().overhead_ms : c_; }
  double target_ms() const { return target_ms_; }
  bool history_model_ready() const { return with_history_ready_; }
  bool need_timing() const { return need_timing_; }
  void set_need_timing(bool on) { need_timing_ = on; }
  // Remainders of at most this many tokens merge into the chunk before them (0: never).
  int64_t merge_tail() const { return merge_tail_; }
  void set_merge_tail(int64_t tokens) { merge_tail_ = tokens; }
  // Predicted chunks round up to a multiple of this (0: upstream's max(page_size, 64)).
  void set_chunk_align(int64_t tokens) { chunk_align_ = tokens; }

  // chunkpipe extension (profiling_chunk_config.overhead_aware): with S pipeline stages and
  // equal-time chunks of t ms, one prompt's TTFT is about W + K·c + (S-1)·t, where W is its
  // chunk work, K = W / (t - c) its chunk count and c the per-forward overhead the upstream
  // model cancels. The best chunk time solves d/dK = 0: t - c = sqrt(W·c / (S-1)).
  // request_target_ms returns that time (in the active model's terms: without c for the
  // profiled model, with c for the history model), capped at T; T itself when the option is
  // off (num_stages < 2) or the fit has no positive c.
  void set_overhead_aware(int num_stages) { overhead_stages_ = num_stages; }
  double request_target_ms(int64_t prompt_tokens) const;

  // Raw positive root of cost(history, x) = target (basic or history model); nullopt when
  // there is none (a == 0, negative discriminant, x <= 0).
  std::optional<double> solve(int64_t history, double target_ms) const;
  // Chunk size after smoothing toward B, the min_chunk floor and aligning up to
  // max(page_size, 64). target_ms <= 0 uses T.
  std::optional<int64_t> predict(int64_t history, double target_ms = 0) const;
  // Predicted milliseconds of a chunk of `chunk` tokens after `history`; 0 when not ready.
  double predict_time(int64_t chunk, int64_t history) const;

  // Online calibration: one executed step of (chunk, history) pairs and its measured time.
  void record_step(const std::vector<std::pair<int64_t, int64_t>>& chunks, double elapsed_ms,
                   std::vector<std::string>* log);

  // --- chunkpipe's planned mode (profiling_chunk_config.mode "planned") ---
  // Switches to the cost model; `plan` carries the stages, min_chunk, alignment and B used to
  // plan each prompt (prompt_tokens and history are filled per call).
  void set_planned(const PlanOptions& plan) {
    planned_ = true;
    plan_ = plan;
  }
  bool planned() const { return planned_; }
  const PlanOptions& plan_options() const { return plan_; }
  // Fits the cost model on startup probes and sets T to a base chunk's predicted time.
  bool fit_cost_model(const std::vector<CostSample>& samples, std::vector<std::string>* log);
  const ChunkCostModel& cost_model() const { return cost_model_; }
  // The chunk time of the best plan for a prompt of prompt_tokens from `history`; 0 when the
  // plan is fixed chunks of B (nothing to gain from resizing).
  double plan_chunk_ms(int64_t prompt_tokens, int64_t history) const;
  // The attention form the cost model predicts cheaper for a chunk (kAuto outside planned mode).
  AttentionForm attention_form(int64_t chunk, int64_t history) const;
  // Online refinement in planned mode: a step whose chunks all used one form, and its time.
  // Samples beyond max_fit_chunk stop the timing.
  void record_planned_step(const std::vector<std::pair<int64_t, int64_t>>& chunks,
                           AttentionForm form, double elapsed_ms, std::vector<std::string>* log);

 private:
  int64_t base_chunk_;
  int page_size_;
  double smooth_factor_;
  int64_t min_chunk_;
  int64_t merge_tail_ = 0;
  int64_t chunk_align_ = 0;
  int overhead_stages_ = 0;
  int max_fit_chunk_;
  bool ready_ = false;
  double a_ = 0, b_ = 0, c_ = 0, target_ms_ = 0;
  // History model t(C, H) = ah·C·(C+H) + bh·(C+H) + ch.
  bool with_history_ready_ = false;
  bool history_fitted_ = false;
  double ah_ = 0, bh_ = 0, ch_ = 0;
  std::vector<std::array<double, 4>> history_samples_;  // x1, x2, x3, ms
  int target_steps_ = 0;
  bool need_timing_ = true;
  // Planned mode.
  bool planned_ = false;
  PlanOptions plan_;
  ChunkCostModel cost_model_;
  std::vector<CostSample> profile_samples_, online_samples_;
};

// vllm-ascend's chunks for one prompt on a cost model, for the simulator: the quadratic fitted
// on the model's from-scratch times at the startup schedule, T = f(B) - f(0), each chunk
// solving cost(L, x) = T (smoothing, min_chunk, aligning up to max(page_size, 64)), each
// chunk then timed by the cost model and the plan by the pipeline recurrence.
ChunkPlan upstream_plan(const ChunkCostModel& model, const PlanOptions& options, int page_size,
                        double smooth_factor);

}  // namespace sched
