// ChunkCostModel: what one prefill chunk costs a pipeline stage on this engine, per attention
// form, fitted from probes at zero and non-zero history and refined by whole steps. The model
// and its fit are described in docs/ARCHITECTURE.md ("CPP cost model").
// Pure values and math; not thread-safe (the scheduler thread owns its copy).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace sched {

// How a chunk attends to its history. kAuto leaves the choice to the model's FLOP rule.
enum class AttentionForm : uint8_t { kAuto = 0, kExpanded = 1, kAbsorbed = 2 };

const char* attention_form_name(AttentionForm form);

// Causal attention area of a chunk of x new tokens after L cached ones: each new token attends
// to the history and to the new tokens before it (and itself).
inline double attention_area(double x, double history) {
  return x * history + x * (x + 1) / 2;
}

// One form's terms, in milliseconds per stage:
//   t(x, L) = overhead + per_token·x + per_history·L + per_pair·A(x, L)
// overhead: the per-forward cost (launches, norms of nothing, the step's bookkeeping);
// per_token: the linear layers, MoE and the chunk's own projections;
// per_history: re-expanding each history token's k/v from the latent (expanded form only);
// per_pair: scores, softmax and the weighted sum of one (query, key) pair.
struct FormCoefficients {
  bool valid = false;
  double overhead_ms = 0, per_token_ms = 0, per_history_ms = 0, per_pair_ms = 0;

  double predict_ms(int64_t tokens, int64_t history) const;
  // The largest x with predict_ms(x, history) <= ms (0 when not even one token fits).
  int64_t max_tokens_within(double ms, int64_t history) const;
};

// A measured forward: one regressor row [1, Σx, ΣL, ΣA] over the chunks that used `form`
// (startup probes have one chunk; an online step may batch several) and its time.
struct CostSample {
  AttentionForm form = AttentionForm::kExpanded;
  std::array<double, 4> row{};
  double ms = 0;
  static CostSample probe(AttentionForm form, int64_t tokens, int64_t history, double ms);
};

// Non-negative least squares (Lawson-Hanson) of rows · θ ≈ y with θ >= 0, each row weighted by
// 1/y so that small chunks are fitted as well as large ones (relative error). Empty when the
// system is empty or degenerate.
std::vector<double> fit_nonnegative(const std::vector<std::array<double, 4>>& rows,
                                    const std::vector<double>& y);

class ChunkCostModel {
 public:
  static constexpr int kMinSamplesPerForm = 5;

  ChunkCostModel() = default;
  ChunkCostModel(FormCoefficients expanded, FormCoefficients absorbed)
      : expanded_(expanded), absorbed_(absorbed) {}

  // Fits each form on its samples. The expanded form must fit (it is the prefill path); the
  // absorbed form is optional (without samples it is never chosen). `why` says what failed.
  bool fit(const std::vector<CostSample>& samples, std::string* why);

  bool ready() const { return expanded_.valid; }
  const FormCoefficients& expanded() const { return expanded_; }
  const FormCoefficients& absorbed() const { return absorbed_; }

  // The form this model predicts is cheaper for the chunk, and its time.
  AttentionForm cheaper_form(int64_t tokens, int64_t history) const;
  double predict_ms(int64_t tokens, int64_t history) const;
  double predict_ms(int64_t tokens, int64_t history, AttentionForm form) const;
  // The largest chunk whose cheaper form fits in `ms` after `history` (0: none).
  int64_t max_tokens_within(double ms, int64_t history) const;

  // "expanded: c=.. ms, token=.. us, history=.. us, pair=.. ns; absorbed: ..." for the logs.
  std::string describe() const;

 private:
  FormCoefficients expanded_, absorbed_;
};

}  // namespace sched
