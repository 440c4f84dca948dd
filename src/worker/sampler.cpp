// Sampling in f32/f64 on one request's vocabulary row.
#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace worker {
namespace {

void log_softmax(std::span<const float> logits, std::vector<float>* out) {
  const float m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - m);
  const float lse = m + static_cast<float>(std::log(sum));
  out->resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) (*out)[i] = logits[i] - lse;
}

}  // namespace

SampledToken sample_token(std::span<float> logits, const sched::SamplingParams& p,
                          const TokenHistory& history, std::mt19937_64& rng) {
  const int64_t V = static_cast<int64_t>(logits.size());
  // As vLLM v1: logit_bias (a logits processor) before the penalties.
  for (const auto& [t, bias] : p.logit_bias) {
    if (t >= 0 && t < V) logits[t] += bias;
  }
  if (p.repetition_penalty != 1.0) {
    std::vector<bool> seen(V, false);
    for (int32_t t : history.prompt_token_ids) seen[t] = true;
    for (int32_t t : history.output_token_ids) seen[t] = true;
    const float rp = static_cast<float>(p.repetition_penalty);
    for (int64_t i = 0; i < V; ++i) {
      if (seen[i]) logits[i] = logits[i] > 0 ? logits[i] / rp : logits[i] * rp;
    }
  }
  if (p.presence_penalty != 0.0 || p.frequency_penalty != 0.0) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : history.output_token_ids) ++counts[t];
    for (const auto& [t, c] : counts) {
      logits[t] -= static_cast<float>(p.frequency_penalty * c + p.presence_penalty);
    }
  }
  if (static_cast<int64_t>(history.output_token_ids.size()) < p.min_tokens) {
    for (int32_t t : p.all_stop_token_ids) {
      if (t >= 0 && t < V) logits[t] = -std::numeric_limits<float>::infinity();
    }
  }

  SampledToken out;
  const bool filtered = p.top_k > 0 || p.top_p < 1.0 || p.min_p > 0.0;
  if (p.greedy()) {
    out.token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else if (!filtered) {
    // Plain temperature sampling: one pass over the vocabulary, no sorting.
    const double inv_t = 1.0 / p.temperature;
    const float top = *std::max_element(logits.begin(), logits.end());
    std::vector<double> probs(V);
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += probs[i] = std::exp((logits[i] - top) * inv_t);
    double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
    int64_t pick = 0;
    while (pick + 1 < V && u >= probs[pick]) u -= probs[pick++];
    out.token = static_cast<int32_t>(pick);
  } else {
    // Candidates sorted by logit, then cut by top-k, top-p and min-p.
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    const double inv_t = 1.0 / p.temperature;
    const auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b]; };
    int64_t keep = V;
    if (p.top_k > 0) keep = std::min<int64_t>(keep, p.top_k);
    double normalizer = 0;  // over the candidates top-k leaves (all of them without top-k)
    if (p.top_k <= 0) {
      // Top-p / min-p without top-k: sorting the whole vocabulary is the slow part, and the
      // nucleus almost always lies in the best few thousand tokens. Sort those first, and the
      // rest only when their mass does not reach top_p.
      const float top_logit = *std::max_element(logits.begin(), logits.end());
      for (int64_t i = 0; i < V; ++i) normalizer += std::exp((logits[i] - top_logit) * inv_t);
      const int64_t head = std::min<int64_t>(V, 4096);
      std::partial_sort(order.begin(), order.begin() + head, order.end(), by_logit);
      double mass = 0;
      for (int64_t i = 0; i < head; ++i) mass += std::exp((logits[order[i]] - top_logit) * inv_t);
      if (head < V && mass / normalizer < p.top_p) {
        std::sort(order.begin() + head, order.end(), by_logit);
      } else {
        keep = head;
      }
    } else {
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_logit);
    }
    const double top = logits[order[0]] * inv_t;
    std::vector<double> probs(keep);
    double sum = 0;
    for (int64_t i = 0; i < keep; ++i) sum += probs[i] = std::exp(logits[order[i]] * inv_t - top);
    if (p.top_k <= 0) sum = normalizer;  // probabilities over the whole vocabulary
    for (auto& v : probs) v /= sum;
    if (p.top_p < 1.0) {
      double cum = 0;
      int64_t cut = 0;
      while (cut < keep && (cut == 0 || cum < p.top_p)) cum += probs[cut++];
      keep = cut;
    }
    if (p.min_p > 0.0) {
      const double threshold = p.min_p * probs[0];
      int64_t cut = 1;
      while (cut < keep && probs[cut] >= threshold) ++cut;
      keep = cut;
    }
    double total = 0;
    for (int64_t i = 0; i < keep; ++i) total += probs[i];
    double u = std::uniform_real_distribution<double>(0.0, total)(rng);
    int64_t pick = 0;
    while (pick + 1 < keep && u >= probs[pick]) u -= probs[pick++];
    out.token = order[pick];
  }
  if (!p.logprobs) return out;  // logprobs cost a pass over the vocabulary: only on request
  std::vector<float> logprobs;
  log_softmax(logits, &logprobs);
  out.logprob = logprobs[out.token];
  if (*p.logprobs > 0) {
    const int64_t n = std::min<int64_t>(*p.logprobs, V);
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n, order.end(),
                      [&](int32_t a, int32_t b) { return logprobs[a] > logprobs[b]; });
    for (int64_t i = 0; i < n; ++i) out.top_logprobs.emplace_back(order[i], logprobs[order[i]]);
  }
  return out;
}

}  // namespace worker
