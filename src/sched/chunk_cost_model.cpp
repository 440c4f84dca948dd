// Chunk cost model math. The fit is Lawson-Hanson NNLS on four columns, written here because
// it is twenty lines and no Debian C++ library offers it without a large dependency (Eigen has
// no NNLS; the solvers that do are Fortran or Python).
#include "sched/chunk_cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace sched {
namespace {

constexpr int kCols = 4;

// Least squares on the columns in `active` (normal equations of column-scaled data, Gaussian
// elimination with partial pivoting). Inactive columns get 0. False when singular.
bool solve_subset(const std::vector<std::array<double, kCols>>& a, const std::vector<double>& y,
                  const std::array<bool, kCols>& active, std::array<double, kCols>* out) {
  std::vector<int> cols;
  for (int j = 0; j < kCols; ++j)
    if (active[j]) cols.push_back(j);
  const size_t k = cols.size();
  out->fill(0.0);
  if (k == 0) return true;
  std::vector<double> scale(k, 0.0);
  for (const auto& row : a)
    for (size_t i = 0; i < k; ++i) scale[i] = std::max(scale[i], std::abs(row[cols[i]]));
  for (double s : scale)
    if (s == 0) return false;
  std::vector<std::vector<double>> m(k, std::vector<double>(k + 1, 0.0));
  for (size_t r = 0; r < a.size(); ++r) {
    for (size_t i = 0; i < k; ++i) {
      const double ai = a[r][cols[i]] / scale[i];
      for (size_t j = 0; j < k; ++j) m[i][j] += ai * a[r][cols[j]] / scale[j];
      m[i][k] += ai * y[r];
    }
  }
  for (size_t c = 0; c < k; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < k; ++r)
      if (std::abs(m[r][c]) > std::abs(m[pivot][c])) pivot = r;
    if (std::abs(m[pivot][c]) < 1e-12) return false;
    std::swap(m[c], m[pivot]);
    for (size_t r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = m[r][c] / m[c][c];
      for (size_t j = c; j <= k; ++j) m[r][j] -= f * m[c][j];
    }
  }
  for (size_t i = 0; i < k; ++i) (*out)[cols[i]] = m[i][k] / m[i][i] / scale[i];
  return true;
}

std::string format_coefficients(const char* name, const FormCoefficients& f) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%s: c=%.2f ms, token=%.2f us, history=%.3f us, pair=%.3f ns",
                name, f.overhead_ms, f.per_token_ms * 1e3, f.per_history_ms * 1e3,
                f.per_pair_ms * 1e6);
  return buf;
}

}  // namespace

const char* attention_form_name(AttentionForm form) {
  switch (form) {
    case AttentionForm::kExpanded:
      return "expanded";
    case AttentionForm::kAbsorbed:
      return "absorbed";
    case AttentionForm::kAuto:
      break;
  }
  return "auto";
}

double FormCoefficients::predict_ms(int64_t tokens, int64_t history) const {
  const double x = static_cast<double>(tokens), L = static_cast<double>(history);
  return overhead_ms + per_token_ms * x + per_history_ms * L + per_pair_ms * attention_area(x, L);
}

int64_t FormCoefficients::max_tokens_within(double ms, int64_t history) const {
  if (!valid) return 0;
  const double L = static_cast<double>(history);
  // (p/2) x² + (token + p (L + 1/2)) x + (c + h L - ms) <= 0
  const double qa = per_pair_ms / 2, qb = per_token_ms + per_pair_ms * (L + 0.5),
               qc = overhead_ms + per_history_ms * L - ms;
  if (qc > 0) return 0;
  double x;
  if (qa <= 0) {
    if (qb <= 0) return int64_t{1} << 40;  // free tokens: no bound from time
    x = -qc / qb;
  } else {
    x = (-qb + std::sqrt(qb * qb - 4 * qa * qc)) / (2 * qa);
  }
  // A hair of slack so that a time computed from x tokens gives x back despite rounding.
  return static_cast<int64_t>(std::floor(std::min(x * (1 + 1e-12) + 1e-9, 1e12)));
}

CostSample CostSample::probe(AttentionForm form, int64_t tokens, int64_t history, double ms) {
  const double x = static_cast<double>(tokens), L = static_cast<double>(history);
  return {form, {1.0, x, L, attention_area(x, L)}, ms};
}

std::vector<double> fit_nonnegative(const std::vector<std::array<double, 4>>& rows,
                                    const std::vector<double>& y) {
  if (rows.size() < 2 || rows.size() != y.size()) return {};
  std::vector<std::array<double, kCols>> a(rows.size());
  std::vector<double> b(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!(y[i] > 0)) return {};
    for (int j = 0; j < kCols; ++j) a[i][j] = rows[i][j] / y[i];
    b[i] = 1.0;
  }
  // Columns that are zero everywhere stay at 0 (e.g. history in zero-history-only data).
  std::array<bool, kCols> usable{};
  for (int j = 0; j < kCols; ++j)
    for (const auto& r : a) usable[j] = usable[j] || r[j] != 0;
  std::array<bool, kCols> passive{};
  std::array<double, kCols> x{};
  for (int outer = 0; outer < 3 * kCols; ++outer) {
    std::array<double, kCols> w{};  // the gradient Aᵀ(b - A x)
    for (size_t i = 0; i < a.size(); ++i) {
      double r = b[i];
      for (int j = 0; j < kCols; ++j) r -= a[i][j] * x[j];
      for (int j = 0; j < kCols; ++j) w[j] += a[i][j] * r;
    }
    int best = -1;
    for (int j = 0; j < kCols; ++j) {
      if (passive[j] || !usable[j]) continue;
      // Relative tolerance against the column's own size.
      double norm = 0;
      for (const auto& r : a) norm += r[j] * r[j];
      if (w[j] > 1e-10 * std::sqrt(norm) && (best < 0 || w[j] > w[best])) best = j;
    }
    if (best < 0) break;
    passive[best] = true;
    for (int inner = 0; inner < 3 * kCols; ++inner) {
      std::array<double, kCols> z{};
      if (!solve_subset(a, b, passive, &z)) {
        passive[best] = false;  // dependent on the columns already in: leave it out
        usable[best] = false;
        break;
      }
      bool all_positive = true;
      for (int j = 0; j < kCols; ++j) all_positive = all_positive && (!passive[j] || z[j] > 0);
      if (all_positive) {
        x = z;
        break;
      }
      double alpha = 1.0;
      for (int j = 0; j < kCols; ++j)
        if (passive[j] && z[j] <= 0) alpha = std::min(alpha, x[j] / (x[j] - z[j]));
      for (int j = 0; j < kCols; ++j) {
        x[j] += alpha * (z[j] - x[j]);
        if (passive[j] && x[j] <= 1e-300) {
          passive[j] = false;
          x[j] = 0;
        }
      }
    }
  }
  return {x.begin(), x.end()};
}

bool ChunkCostModel::fit(const std::vector<CostSample>& samples, std::string* why) {
  auto fit_form = [&](AttentionForm form, FormCoefficients* out) {
    std::vector<std::array<double, 4>> rows;
    std::vector<double> y;
    for (const CostSample& s : samples) {
      if (s.form != form || !(s.ms > 0)) continue;
      rows.push_back(s.row);
      y.push_back(s.ms);
    }
    if (static_cast<int>(rows.size()) < kMinSamplesPerForm) return false;
    const auto theta = fit_nonnegative(rows, y);
    if (theta.empty()) return false;
    *out = {true, theta[0], theta[1], theta[2], theta[3]};
    // A model that predicts nothing grows with the chunk cannot size chunks.
    return out->per_token_ms > 0 || out->per_pair_ms > 0;
  };
  FormCoefficients expanded, absorbed;
  if (!fit_form(AttentionForm::kExpanded, &expanded)) {
    if (why) *why = "too few or degenerate expanded-form samples";
    return false;
  }
  if (!fit_form(AttentionForm::kAbsorbed, &absorbed)) absorbed = {};
  expanded_ = expanded;
  absorbed_ = absorbed;
  return true;
}

AttentionForm ChunkCostModel::cheaper_form(int64_t tokens, int64_t history) const {
  if (!absorbed_.valid) return AttentionForm::kExpanded;
  return absorbed_.predict_ms(tokens, history) < expanded_.predict_ms(tokens, history)
             ? AttentionForm::kAbsorbed
             : AttentionForm::kExpanded;
}

double ChunkCostModel::predict_ms(int64_t tokens, int64_t history) const {
  return predict_ms(tokens, history, cheaper_form(tokens, history));
}

double ChunkCostModel::predict_ms(int64_t tokens, int64_t history, AttentionForm form) const {
  return form == AttentionForm::kAbsorbed ? absorbed_.predict_ms(tokens, history)
                                          : expanded_.predict_ms(tokens, history);
}

int64_t ChunkCostModel::max_tokens_within(double ms, int64_t history) const {
  // min(t_e, t_a) <= ms holds up to the larger of the two forms' own bounds.
  return std::max(expanded_.max_tokens_within(ms, history),
                  absorbed_.max_tokens_within(ms, history));
}

std::string ChunkCostModel::describe() const {
  std::string s = format_coefficients("expanded", expanded_);
  s += absorbed_.valid ? "; " + format_coefficients("absorbed", absorbed_)
                       : "; absorbed: not fitted";
  return s;
}

}  // namespace sched
