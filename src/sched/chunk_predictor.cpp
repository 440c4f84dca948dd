// Chunk predictor math. Log lines keep vllm-ascend's [ProfilingChunk] wording so operators find
// what they search for.
#include "sched/chunk_predictor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace sched {
namespace {

std::string format(const char* fmt, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), fmt, a, b, c);
  return buf;
}

}  // namespace

std::vector<double> least_squares3(const std::vector<std::array<double, 3>>& x,
                                   const std::vector<double>& y) {
  const size_t m = x.size();
  if (m < 3 || y.size() != m) return {};
  // Column scaling, then Householder QR on the m x 3 matrix.
  std::array<double, 3> scale{};
  for (const auto& row : x)
    for (int j = 0; j < 3; ++j) scale[j] = std::max(scale[j], std::abs(row[j]));
  for (double& s : scale)
    if (s == 0) return {};
  std::vector<std::array<double, 3>> r(m);
  for (size_t i = 0; i < m; ++i)
    for (int j = 0; j < 3; ++j) r[i][j] = x[i][j] / scale[j];
  std::vector<double> q = y;
  for (int k = 0; k < 3; ++k) {
    double norm = 0;
    for (size_t i = k; i < m; ++i) norm += r[i][k] * r[i][k];
    norm = std::sqrt(norm);
    if (norm < 1e-300) return {};
    const double alpha = r[k][k] > 0 ? -norm : norm;
    std::vector<double> v(m, 0.0);
    for (size_t i = k; i < m; ++i) v[i] = r[i][k];
    v[k] -= alpha;
    double vnorm2 = 0;
    for (size_t i = k; i < m; ++i) vnorm2 += v[i] * v[i];
    if (vnorm2 < 1e-300) continue;
    for (int j = k; j < 3; ++j) {
      double dot = 0;
      for (size_t i = k; i < m; ++i) dot += v[i] * r[i][j];
      for (size_t i = k; i < m; ++i) r[i][j] -= 2 * dot / vnorm2 * v[i];
    }
    double dot = 0;
    for (size_t i = k; i < m; ++i) dot += v[i] * q[i];
    for (size_t i = k; i < m; ++i) q[i] -= 2 * dot / vnorm2 * v[i];
  }
  std::vector<double> theta(3);
  for (int k = 2; k >= 0; --k) {
    if (std::abs(r[k][k]) < 1e-12) return {};
    double s = q[k];
    for (int j = k + 1; j < 3; ++j) s -= r[k][j] * theta[j];
    theta[k] = s / r[k][k];
  }
  for (int j = 0; j < 3; ++j) theta[j] /= scale[j];
  return theta;
}

ChunkSizePredictor::ChunkSizePredictor(int64_t base_chunk, int page_size, double smooth_factor,
                                       int64_t min_chunk, int max_fit_chunk)
    : base_chunk_(base_chunk),
      page_size_(page_size),
      smooth_factor_(smooth_factor),
      min_chunk_(min_chunk),
      max_fit_chunk_(max_fit_chunk) {}

std::vector<int64_t> ChunkSizePredictor::profile_chunk_sizes(int64_t base_chunk, int num_samples) {
  std::vector<int64_t> sizes;
  for (int i = 0; i <= num_samples; ++i) {
    const double v =
        static_cast<double>(base_chunk) - (i - 1) * (static_cast<double>(base_chunk) / num_samples);
    sizes.push_back(
        std::clamp<int64_t>(static_cast<int64_t>(v), 1, base_chunk));  // i = 0 is the warm-up
  }
  return sizes;
}

bool ChunkSizePredictor::fit_profile(const std::vector<std::pair<int64_t, double>>& samples,
                                     std::vector<std::string>* log) {
  if (static_cast<int>(samples.size()) < kMinProfileSamples) {
    if (log)
      log->push_back(format("[ProfilingChunk] Profiling failed: only %.0f/8 samples collected",
                            samples.size()));
    return false;
  }
  std::vector<std::array<double, 3>> x;
  std::vector<double> y;
  double lo = 1e300, hi = -1e300;
  for (const auto& [tokens, ms] : samples) {
    const double l = static_cast<double>(tokens);
    x.push_back({l * l, l, 1.0});
    y.push_back(ms);
    lo = std::min(lo, ms);
    hi = std::max(hi, ms);
  }
  if (log) {
    log->push_back(format("[ProfilingChunk] Collected %.0f samples. Latency range: [%.2f, %.2f] ms",
                          samples.size(), lo, hi));
  }
  auto theta = least_squares3(x, y);
  if (theta.empty()) {
    if (log)
      log->push_back(
          "[ProfilingChunk] Profiling failed: the samples do not determine a quadratic fit");
    return false;
  }
  a_ = theta[0];
  b_ = theta[1];
  c_ = theta[2];
  const double B = static_cast<double>(base_chunk_);
  target_ms_ = a_ * B * B + b_ * B;
  if (target_ms_ <= 0) target_ms_ = 1.0;
  ready_ = true;
  if (log) {
    log->push_back(format("[ProfilingChunk] Fitted: a=%.2e, b=%.2e, c=%.2e", a_, b_, c_));
    log->push_back(
        format("[ProfilingChunk] Target latency: %.2f ms (base_chunk=%.0f)", target_ms_, B));
    log->push_back("[ProfilingChunk] Profiling completed successfully");
  }
  return true;
}

std::optional<double> ChunkSizePredictor::solve(int64_t history, double target) const {
  const double L = static_cast<double>(history);
  double qa, qb, qc;
  if (with_history_ready_) {  // ah x² + (ah L + bh) x + (bh L + ch - T) = 0
    qa = ah_;
    qb = ah_ * L + bh_;
    qc = bh_ * L + ch_ - target;
  } else {  // a x² + (2 a L + b) x - T = 0
    qa = a_;
    qb = 2 * a_ * L + b_;
    qc = -target;
  }
  if (qa == 0) return std::nullopt;
  const double disc = qb * qb - 4 * qa * qc;
  if (disc < 0) return std::nullopt;
  const double x = (-qb + std::sqrt(disc)) / (2 * qa);
  if (!(x > 0)) return std::nullopt;
  return x;
}

std::optional<int64_t> ChunkSizePredictor::predict(int64_t history, double target) const {
  if (!ready_) return std::nullopt;
  if (planned_) {
    // Unbounded remainder: the scheduler caps by what is left and the token budget.
    return planned_chunk_tokens(cost_model_, plan_, history, int64_t{1} << 40,
                                target > 0 ? target : target_ms_);
  }
  auto raw = solve(history, target > 0 ? target : target_ms_);
  if (!raw) return std::nullopt;
  const double B = static_cast<double>(base_chunk_);
  const double smoothed = B + smooth_factor_ * (*raw - B);
  int64_t n = std::max<int64_t>(static_cast<int64_t>(smoothed), min_chunk_);
  const int64_t g = chunk_align_ > 0 ? chunk_align_ : std::max(page_size_, 64);
  n = (n + g - 1) / g * g;
  return std::max(n, g);
}

double ChunkSizePredictor::request_target_ms(int64_t prompt_tokens) const {
  if (!ready_ || overhead_stages_ < 2) return target_ms_;
  const double n = static_cast<double>(prompt_tokens);
  const double a = with_history_ready_ ? ah_ : a_, b = with_history_ready_ ? bh_ : b_,
               c = with_history_ready_ ? ch_ : c_;
  const double work = a * n * n + b * n;  // the prompt's chunk work without per-forward costs
  if (!(c > 0) || !(work > 0)) return target_ms_;
  const double t = std::sqrt(work * c / (overhead_stages_ - 1)) + (with_history_ready_ ? c : 0);
  return std::min(target_ms_, t);
}

double ChunkSizePredictor::predict_time(int64_t chunk, int64_t history) const {
  if (!ready_) return 0.0;
  if (planned_) return cost_model_.predict_ms(chunk, history);
  const double n = static_cast<double>(chunk), L = static_cast<double>(history);
  if (with_history_ready_) return ah_ * n * (n + L) + bh_ * (n + L) + ch_;
  auto f = [&](double l) { return a_ * l * l + b_ * l + c_; };
  return f(L + n) - f(L);
}

void ChunkSizePredictor::record_step(const std::vector<std::pair<int64_t, int64_t>>& chunks,
                                     double elapsed_ms, std::vector<std::string>* log) {
  if (!ready_ || elapsed_ms <= 0 || !need_timing_ || planned_) return;
  if (target_steps_ >= kTargetSteps && history_fitted_) {
    need_timing_ = false;
    return;
  }
  if (chunks.empty()) return;
  int64_t total_hist = 0;
  double x1 = 0, x2 = 0;
  for (const auto& [c, h] : chunks) {
    total_hist += h;
    x1 += static_cast<double>(c + h) * static_cast<double>(c);
    x2 += static_cast<double>(c + h);
  }
  if (total_hist == 0 && target_steps_ < kTargetSteps) {
    target_ms_ = elapsed_ms;  // vllm-ascend overwrites: the last of the first three counts
    ++target_steps_;
  }
  if (history_fitted_) return;
  history_samples_.push_back({x1, x2, static_cast<double>(chunks.size()), elapsed_ms});
  const int n = static_cast<int>(history_samples_.size());
  if (n < kMinHistorySamples) {
    if (log)
      log->push_back(format("Not enough data points for chunked data fitting (%.0f < 5)", n));
    return;
  }
  if (n > max_fit_chunk_) {
    history_fitted_ = true;  // frozen at the fit of the first max_fit_chunk samples
    return;
  }
  std::vector<std::array<double, 3>> x;
  std::vector<double> y;
  for (const auto& s : history_samples_) {
    x.push_back({s[0], s[1], s[2]});
    y.push_back(s[3]);
  }
  auto theta = least_squares3(x, y);
  if (theta.empty()) return;
  ah_ = theta[0];
  bh_ = theta[1];
  ch_ = theta[2];
  with_history_ready_ = true;
  if (log)
    log->push_back(
        format("[ProfilingChunk With History] Fitted: a=%.2e, b=%.2e, c=%.2e", ah_, bh_, ch_));
}

bool ChunkSizePredictor::fit_cost_model(const std::vector<CostSample>& samples,
                                        std::vector<std::string>* log) {
  if (log) {
    double lo = 1e300, hi = 0;
    for (const CostSample& c : samples) {
      lo = std::min(lo, c.ms);
      hi = std::max(hi, c.ms);
    }
    log->push_back(format("[ProfilingChunk] Collected %.0f samples. Latency range: [%.2f, %.2f] ms",
                          samples.size(), samples.empty() ? 0 : lo, hi));
  }
  std::string why;
  if (!cost_model_.fit(samples, &why)) {
    if (log) log->push_back("[ProfilingChunk] Profiling failed: " + why);
    return false;
  }
  profile_samples_ = samples;
  target_ms_ = cost_model_.predict_ms(base_chunk_, 0);
  ready_ = true;
  if (log) {
    log->push_back("[ProfilingChunk] Cost model: " + cost_model_.describe());
    log->push_back(format("[ProfilingChunk] Target latency: %.2f ms (base_chunk=%.0f)", target_ms_,
                          static_cast<double>(base_chunk_)));
    log->push_back("[ProfilingChunk] Profiling completed successfully");
  }
  return true;
}

double ChunkSizePredictor::plan_chunk_ms(int64_t prompt_tokens, int64_t history) const {
  if (!ready_ || !planned_) return 0;
  PlanOptions o = plan_;
  o.prompt_tokens = prompt_tokens;
  o.history = history;
  return best_plan(cost_model_, o).chunk_ms;
}

AttentionForm ChunkSizePredictor::attention_form(int64_t chunk, int64_t history) const {
  if (!ready_ || !planned_) return AttentionForm::kAuto;
  return cost_model_.cheaper_form(chunk, history);
}

ChunkPlan upstream_plan(const ChunkCostModel& model, const PlanOptions& options, int page_size,
                        double smooth_factor) {
  const int64_t B = options.max_chunk;
  ChunkSizePredictor p(B, page_size, smooth_factor, std::min(options.min_chunk, B), 30);
  std::vector<std::pair<int64_t, double>> samples;
  const auto sizes = ChunkSizePredictor::profile_chunk_sizes(B);
  for (size_t i = 1; i < sizes.size(); ++i)
    samples.emplace_back(sizes[i], model.predict_ms(sizes[i], 0));
  if (!p.fit_profile(samples, nullptr)) return fixed_plan(model, options);
  ChunkPlan plan;
  plan.chunk_ms = p.target_ms();
  std::vector<double> ms;
  std::vector<int64_t> tokens;
  for (int64_t L = options.history; L < options.prompt_tokens;) {
    const int64_t n = std::min(B, options.prompt_tokens - L);
    const int64_t x = std::min(n, p.predict(L).value_or(n));
    const AttentionForm form = model.cheaper_form(x, L);
    plan.chunks.push_back({x, L, form, model.predict_ms(x, L, form)});
    ms.push_back(plan.chunks.back().ms);
    tokens.push_back(x);
    plan.work_ms += plan.chunks.back().ms;
    L += x;
  }
  plan.ttft_ms = pipeline_ttft_ms(ms, tokens, options);
  return plan;
}

void ChunkSizePredictor::record_planned_step(const std::vector<std::pair<int64_t, int64_t>>& chunks,
                                             AttentionForm form, double elapsed_ms,
                                             std::vector<std::string>* log) {
  if (!ready_ || !planned_ || !need_timing_ || chunks.empty() || !(elapsed_ms > 0)) return;
  CostSample s{form, {1.0, 0, 0, 0}, elapsed_ms};
  for (const auto& [x, L] : chunks) {
    s.row[1] += static_cast<double>(x);
    s.row[2] += static_cast<double>(L);
    s.row[3] += attention_area(static_cast<double>(x), static_cast<double>(L));
  }
  online_samples_.push_back(s);
  std::vector<CostSample> all = profile_samples_;
  all.insert(all.end(), online_samples_.begin(), online_samples_.end());
  ChunkCostModel refined;
  if (refined.fit(all, nullptr)) {
    cost_model_ = refined;
    target_ms_ = cost_model_.predict_ms(base_chunk_, 0);
  }
  if (static_cast<int>(online_samples_.size()) >= max_fit_chunk_) {
    need_timing_ = false;
    if (log)
      log->push_back("[ProfilingChunk] Cost model refined online: " + cost_model_.describe());
  }
}

}  // namespace sched
