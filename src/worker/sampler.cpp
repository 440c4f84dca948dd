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

// allowed_token_ids: everything else becomes -inf. The ids are sorted.
void mask_all_but(std::span<float> logits, const std::vector<int32_t>& allowed) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  int64_t next = 0;
  for (int32_t id : allowed) {
    const int64_t end = std::min<int64_t>(id, static_cast<int64_t>(logits.size()));
    for (; next < end; ++next) logits[next] = kMasked;
    next = std::max<int64_t>(next, int64_t(id) + 1);
  }
  for (; next < static_cast<int64_t>(logits.size()); ++next) logits[next] = kMasked;
}

// vLLM v1's bad words: a word's last token is masked when the output ends with the rest of it.
void mask_bad_words(std::span<float> logits, const std::vector<std::vector<int32_t>>& words,
                    std::span<const int32_t> output) {
  const int64_t V = static_cast<int64_t>(logits.size());
  for (const auto& word : words) {
    if (word.empty() || word.size() > output.size() + 1) continue;
    const size_t prefix = word.size() - 1;
    if (!std::equal(word.begin(), word.begin() + prefix, output.end() - prefix)) continue;
    const int32_t last = word.back();
    if (last >= 0 && last < V) logits[last] = -std::numeric_limits<float>::infinity();
  }
}

// allowed_token_ids and bad words (masks), logit_bias (a logits processor, before the
// penalties, as in vLLM v1), the penalties and the min_tokens masking of stop tokens, in place.
void apply_logits_processors(std::span<float> logits, const sched::SamplingParams& p,
                             const TokenHistory& history) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (!p.allowed_token_ids.empty()) mask_all_but(logits, p.allowed_token_ids);
  mask_bad_words(logits, p.bad_words_token_ids, history.output_token_ids);
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
  const bool masking_stops = static_cast<int64_t>(history.output_token_ids.size()) < p.min_tokens;
  if (masking_stops) {
    for (int32_t t : p.all_stop_token_ids) {
      if (t >= 0 && t < V) logits[t] = -std::numeric_limits<float>::infinity();
    }
  }
  // Masks that contradict each other (allowed_token_ids = [EOS] under min_tokens, an allowed
  // token that is also a bad word) leave nothing to sample: fall back to a uniform choice
  // among the allowed tokens (the whole vocabulary without a list) instead of NaN weights.
  const bool masked =
      !p.allowed_token_ids.empty() || !p.bad_words_token_ids.empty() || masking_stops;
  if (masked &&
      *std::max_element(logits.begin(), logits.end()) == -std::numeric_limits<float>::infinity()) {
    if (p.allowed_token_ids.empty()) {
      std::fill(logits.begin(), logits.end(), 0.0f);
    } else {
      for (int32_t t : p.allowed_token_ids)
        if (t >= 0 && t < V) logits[t] = 0.0f;
    }
  }
}

// What random sampling draws from: unnormalized weights over candidate tokens, after
// temperature, top-k, top-p and min-p.
struct Candidates {
  std::vector<int32_t> ids;  // empty: every token of the vocabulary, in id order
  std::vector<double> weights;
  double total = 0;

  int32_t id(size_t i) const { return ids.empty() ? static_cast<int32_t>(i) : ids[i]; }
  double weight_of(int32_t token) const {
    if (ids.empty()) return token >= 0 && size_t(token) < weights.size() ? weights[token] : 0.0;
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == token) return weights[i];
    return 0.0;
  }
};

Candidates random_candidates(std::span<const float> logits, const sched::SamplingParams& p) {
  const int64_t V = static_cast<int64_t>(logits.size());
  const bool filtered = p.top_k > 0 || p.top_p < 1.0 || p.min_p > 0.0;
  const double inv_t = 1.0 / p.temperature;
  Candidates c;
  if (!filtered) {
    // Plain temperature sampling: one pass over the vocabulary, no sorting.
    const float top = *std::max_element(logits.begin(), logits.end());
    c.weights.resize(V);
    for (int64_t i = 0; i < V; ++i) c.total += c.weights[i] = std::exp((logits[i] - top) * inv_t);
    return c;
  }
  // Candidates sorted by logit, then cut by top-k, top-p and min-p.
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
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
  order.resize(keep);
  probs.resize(keep);
  c.ids = std::move(order);
  c.weights = std::move(probs);
  for (double w : c.weights) c.total += w;
  return c;
}

// One draw from the candidates, without `excluded` (-1: none).
int32_t draw(const Candidates& c, std::mt19937_64& rng, int32_t excluded = -1) {
  const size_t n = c.weights.size();
  const double total = excluded >= 0 ? c.total - c.weight_of(excluded) : c.total;
  double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  size_t last = n;  // the last candidate that may be drawn
  for (size_t i = n; i-- > 0;)
    if (c.id(i) != excluded && c.weights[i] > 0) {
      last = i;
      break;
    }
  if (last == n) return excluded;  // all the mass was on `excluded`
  size_t pick = 0;
  for (;; ++pick) {
    if (c.id(pick) == excluded) continue;
    if (pick == last || u < c.weights[pick]) break;
    u -= c.weights[pick];
  }
  return c.id(pick);
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// out->token's logprob and the top `num_top` alternatives (ties: the lower id first).
void score(std::span<const float> logits, int32_t num_top, SampledToken* out) {
  const int64_t V = static_cast<int64_t>(logits.size());
  std::vector<float> logprobs;
  log_softmax(logits, &logprobs);
  out->logprob = logprobs[out->token];
  if (num_top > 0) {
    const int64_t n = std::min<int64_t>(num_top, V);
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
      return logprobs[a] > logprobs[b] || (logprobs[a] == logprobs[b] && a < b);
    });
    for (int64_t i = 0; i < n; ++i) out->top_logprobs.emplace_back(order[i], logprobs[order[i]]);
  }
}

// Logprobs come from the processed logits, before temperature (vLLM's default).
void add_logprobs(std::span<const float> logits, const sched::SamplingParams& p,
                  SampledToken* out) {
  if (!p.logprobs) return;  // logprobs cost a pass over the vocabulary: only on request
  score(logits, *p.logprobs, out);
}

}  // namespace

SampledToken sample_token(std::span<float> logits, const sched::SamplingParams& p,
                          const TokenHistory& history, std::mt19937_64& rng) {
  apply_logits_processors(logits, p, history);
  SampledToken out;
  out.token = p.greedy() ? argmax(logits) : draw(random_candidates(logits, p), rng);
  add_logprobs(logits, p, &out);
  return out;
}

SampledToken score_token(std::span<const float> logits, int32_t token, int32_t num_top) {
  SampledToken out;
  out.token = token;
  score(logits, num_top, &out);
  const float mine = logits[token];
  const auto higher =
      std::count_if(logits.begin(), logits.end(), [&](float v) { return v > mine; });
  out.rank = 1 + static_cast<int32_t>(higher);
  return out;
}

VerifiedToken verify_draft(std::span<float> logits, const sched::SamplingParams& p,
                           const TokenHistory& history, int32_t draft, std::mt19937_64& rng) {
  apply_logits_processors(logits, p, history);
  VerifiedToken out;
  if (p.greedy()) {
    out.sampled.token = argmax(logits);
    out.accepted = out.sampled.token == draft;
  } else {
    // The draft distribution q is one-hot on the draft: accept with probability
    // min(1, p(d) / q(d)) = p(d); otherwise draw from max(0, p - q), which is p without d.
    const Candidates c = random_candidates(logits, p);
    const double p_draft = c.total > 0 ? c.weight_of(draft) / c.total : 0.0;
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    out.accepted = u < p_draft;
    out.sampled.token = out.accepted ? draft : draw(c, rng, draft);
  }
  add_logprobs(logits, p, &out.sampled);
  return out;
}

}  // namespace worker
