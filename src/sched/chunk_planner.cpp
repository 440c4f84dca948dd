// Chunk planning: the pipeline recurrence, greedy plans at a chunk time, and the search over
// the chunk count.
#include "sched/chunk_planner.h"

#include <algorithm>
#include <cmath>

namespace sched {

double pipeline_ttft_ms(const std::vector<double>& chunk_ms, const std::vector<int64_t>& tokens,
                        const PlanOptions& options) {
  const int S = std::max(1, options.num_stages);
  const size_t K = chunk_ms.size();
  if (K == 0) return 0;
  // finish[s][k]: when stage s finishes chunk k.
  std::vector<std::vector<double>> finish(S, std::vector<double>(K, 0.0));
  for (size_t k = 0; k < K; ++k) {
    const double hop = options.link_ms + options.link_ms_per_token * static_cast<double>(tokens[k]);
    for (int s = 0; s < S; ++s) {
      double start = k > 0 ? finish[s][k - 1] : 0.0;
      if (s > 0) start = std::max(start, finish[s - 1][k] + hop);
      if (s == 0 && k >= static_cast<size_t>(S)) start = std::max(start, finish[S - 1][k - S]);
      finish[s][k] = start + chunk_ms[k];
    }
  }
  return finish[S - 1][K - 1];
}

int64_t planned_chunk_tokens(const ChunkCostModel& model, const PlanOptions& options,
                             int64_t history, int64_t remaining, double chunk_ms) {
  int64_t x = model.max_tokens_within(chunk_ms, history);
  if (options.align > 1 && x >= options.align) x = x / options.align * options.align;
  x = std::max(x, options.min_chunk);
  if (options.max_chunk > 0) x = std::min(x, options.max_chunk);
  return std::max<int64_t>(1, std::min(x, remaining));
}

namespace {

ChunkPlan finish_plan(ChunkPlan plan, const PlanOptions& options) {
  std::vector<double> ms;
  std::vector<int64_t> tokens;
  for (const PlannedChunk& c : plan.chunks) {
    ms.push_back(c.ms);
    tokens.push_back(c.tokens);
    plan.work_ms += c.ms;
  }
  plan.ttft_ms = pipeline_ttft_ms(ms, tokens, options);
  return plan;
}

PlannedChunk make_chunk(const ChunkCostModel& model, int64_t tokens, int64_t history) {
  const AttentionForm form = model.cheaper_form(tokens, history);
  return {tokens, history, form, model.predict_ms(tokens, history, form)};
}

// The number of chunks a greedy plan at chunk_ms takes, stopping early past `limit`.
int64_t greedy_count(const ChunkCostModel& model, const PlanOptions& o, double chunk_ms,
                     int64_t limit) {
  int64_t count = 0;
  for (int64_t L = o.history; L < o.prompt_tokens && count <= limit; ++count)
    L += planned_chunk_tokens(model, o, L, o.prompt_tokens - L, chunk_ms);
  return count;
}

}  // namespace

ChunkPlan greedy_plan(const ChunkCostModel& model, const PlanOptions& options, double chunk_ms) {
  ChunkPlan plan;
  plan.chunk_ms = chunk_ms;
  for (int64_t L = options.history; L < options.prompt_tokens;) {
    const int64_t x = planned_chunk_tokens(model, options, L, options.prompt_tokens - L, chunk_ms);
    plan.chunks.push_back(make_chunk(model, x, L));
    L += x;
  }
  return finish_plan(std::move(plan), options);
}

ChunkPlan fixed_plan(const ChunkCostModel& model, const PlanOptions& options) {
  ChunkPlan plan;
  const int64_t B = options.max_chunk > 0 ? options.max_chunk : options.prompt_tokens;
  for (int64_t L = options.history; L < options.prompt_tokens;) {
    const int64_t x = std::min(B, options.prompt_tokens - L);
    plan.chunks.push_back(make_chunk(model, x, L));
    L += x;
  }
  return finish_plan(std::move(plan), options);
}

ChunkPlan best_plan(const ChunkCostModel& model, const PlanOptions& options) {
  ChunkPlan fixed = fixed_plan(model, options);
  const int64_t rest = options.prompt_tokens - options.history;
  if (rest <= 0 || !model.ready()) return fixed;
  ChunkPlan best = fixed;
  // The slowest chunk any plan can have bounds the search from above.
  double hi_all = 0;
  for (const PlannedChunk& c : best.chunks) hi_all = std::max(hi_all, c.ms);
  hi_all = hi_all * 1.01 + 1e-3;
  const int64_t min_k = static_cast<int64_t>(best.chunks.size());
  const int64_t max_k =
      std::min<int64_t>(options.max_chunks, (rest + std::max<int64_t>(1, options.min_chunk) - 1) /
                                                std::max<int64_t>(1, options.min_chunk));
  for (int64_t k = min_k; k <= max_k; ++k) {
    double lo = 0, hi = hi_all;
    if (greedy_count(model, options, hi, k) > k) continue;
    for (int it = 0; it < 48 && hi - lo > 1e-6 * hi; ++it) {
      const double mid = (lo + hi) / 2;
      (greedy_count(model, options, mid, k) <= k ? hi : lo) = mid;
    }
    ChunkPlan plan = greedy_plan(model, options, hi);
    if (plan.ttft_ms < best.ttft_ms * (1 - 1e-9)) best = std::move(plan);
  }
  return best.ttft_ms < fixed.ttft_ms * (1 - options.min_predicted_gain) ? best : fixed;
}

}  // namespace sched
