// Sampling in f32/f64 on one request's vocabulary row.
#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <unordered_map>

#include "kernels/exp_row.h"

namespace worker {
namespace {

// The largest logit (-inf for an empty or all-NaN row). Eight running maxima, so the loop is not
// one chain of dependent compares (std::max_element's is, and cost more than the rest of a
// top-k draw over DeepSeek-V3's 129k-token vocabulary).
float max_logit(std::span<const float> logits) {
  constexpr size_t kLanes = 8;
  float m[kLanes];
  std::fill(m, m + kLanes, -std::numeric_limits<float>::infinity());
  size_t i = 0;
  for (; i + kLanes <= logits.size(); i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) m[j] = std::max(m[j], logits[i + j]);
  for (; i < logits.size(); ++i) m[0] = std::max(m[0], logits[i]);
  return *std::max_element(m, m + kLanes);
}

// The sum of `w`, in eight running sums for the same reason (one chain of dependent additions
// cost as much as the exps). The order differs from a plain loop's only in the last bits.
double sum_of(std::span<const double> w) {
  constexpr size_t kLanes = 8;
  double s[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= w.size(); i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) s[j] += w[i + j];
  for (; i < w.size(); ++i) s[0] += w[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// A row's log-softmax, from its max and log-sum-exp: NaN logits count as -inf (they are never
// the answer), +inf ones share all the mass, and a row with nothing above -inf gives -inf
// everywhere: every logprob is a number or -inf.
class LogSoftmax {
 public:
  explicit LogSoftmax(std::span<const float> logits) : max_(max_logit(logits)) {
    if (max_ == kInf || max_ == -kInf) {
      const auto n = std::count(logits.begin(), logits.end(), kInf);
      inf_logprob_ = max_ == kInf ? -static_cast<float>(std::log(double(n))) : -kInf;
      return;
    }
    const double sum = kernels::sum_exp_shifted(logits.data(), int64_t(logits.size()), max_);
    lse_ = max_ + static_cast<float>(std::log(sum));
  }
  float operator()(float logit) const {
    if (max_ == kInf || max_ == -kInf) return logit == kInf ? inf_logprob_ : -kInf;
    return std::isnan(logit) ? -kInf : logit - lse_;
  }

 private:
  static constexpr float kInf = std::numeric_limits<float>::infinity();
  float max_;
  float lse_ = 0;
  float inf_logprob_ = 0;
};

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
  // Every row must leave a valid token to draw, whatever its numbers:
  // - NaN logits (a numerically broken checkpoint, an overflow) never win;
  // - +inf logits share all the mass between them (softmax's limit);
  // - a row with nothing above -inf (masks that contradict each other: allowed_token_ids =
  //   [EOS] under min_tokens, an allowed token that is also a bad word; or an all-NaN row) falls
  //   back to a uniform choice among the allowed tokens (the whole vocabulary without a list).
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (float& x : logits) x = std::isnan(x) ? -kInf : x;
  const float top = max_logit(logits);
  if (top == kInf) {
    for (float& x : logits) x = x == kInf ? 0.0f : -kInf;
  } else if (top == -kInf) {
    if (p.allowed_token_ids.empty()) {
      std::fill(logits.begin(), logits.end(), 0.0f);
    } else {
      for (int32_t t : p.allowed_token_ids)
        if (t >= 0 && t < V) logits[t] = 0.0f;
    }
  }
}

// Copies the x of `in` for which keep(x) holds to `out` (which must have room for all of `in`)
// and returns how many, with no branch on the data: a selection's passes over a flat
// distribution mispredict half of std::partition's branches.
template <typename Keep>
size_t compact(std::span<const double> in, double* out, Keep keep) {
  size_t n = 0;
  for (const double x : in) {
    out[n] = x;
    n += keep(x) ? 1 : 0;
  }
  return n;
}

// Keeps the tokens of the top-p nucleus of `w` (unnormalized, >= 0) and zeroes the rest, in
// O(V): vLLM's rule (a token stays while the mass of the tokens above it is below top_p of the
// total; ties in id order) without sorting the vocabulary.
// - A token whose weight is at most (1 - top_p) · total / V cannot stay (all such tokens
//   together weigh at most (1 - top_p) · total), so only heavier ones are selected among: on a
//   real model's peaked distribution that is a handful.
// - A selection by mass on those finds the cut weight `tau` and how many tokens equal to it
//   stay. A flat distribution (a random-weight model) keeps most of the vocabulary, where a sort
//   cost 10x more.
void keep_nucleus(std::vector<double>& w, double top_p) {
  const double total = sum_of(w);
  if (!(total > 0)) return;
  const double needed = top_p * total;  // a token stays while the mass above it is below this
  const double floor = 0.5 * (1.0 - top_p) * total / double(w.size());  // half: for rounding
  const auto buffer = std::make_unique_for_overwrite<double[]>(2 * w.size());
  double* v = buffer.get();        // the weights the cut may still fall among
  double* scratch = v + w.size();  // where the next pass writes them
  size_t n = compact(w, v, [&](double x) { return x > floor; });
  double above = 0;  // the mass known to lie above v[0, n)
  double tau = 0;
  size_t ties_kept = 0;
  while (n > 0) {
    const double a = v[0], b = v[n / 2], c = v[n - 1];
    const double pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));  // median of 3
    const std::span<const double> range(v, n);
    const size_t gt = compact(range, scratch, [&](double x) { return x > pivot; });
    const double mass_gt = sum_of({scratch, gt});
    if (gt > 0 && above + mass_gt >= needed) {  // the cut lies among the larger weights
      std::swap(v, scratch);
      n = gt;
      continue;
    }
    above += mass_gt;
    const size_t eq = size_t(std::count(v, v + n, pivot));
    // Tie j (from 0) stays while above + j * pivot < needed: `stay` of them. If that is not
    // all of them, or nothing smaller is left, the cut is here. (Every pass either ends or
    // drops at least the pivot's ties.)
    const double stay = std::max(0.0, std::ceil((needed - above) / pivot));
    tau = pivot;
    ties_kept = stay <= double(eq) ? size_t(stay) : eq;
    if (stay <= double(eq) || gt + eq == n) break;
    above += double(eq) * pivot;
    n = compact(range, scratch, [&](double x) { return x < pivot; });
    std::swap(v, scratch);
  }
  for (double& x : w) {
    if (x > tau) continue;
    if (x == tau && ties_kept > 0) {
      --ties_kept;
      continue;
    }
    x = 0;
  }
}

// What random sampling draws from: unnormalized weights over candidate tokens, zero outside the
// support that min-p, top-k and top-p leave (vLLM v1's order: min-p and top-k, which commute,
// then top-p on what is left).
struct Candidates {
  std::vector<int32_t> ids;  // ascending; empty: the whole vocabulary, in id order
  std::vector<double> weights;
  double total = 0;

  int32_t id(size_t i) const { return ids.empty() ? static_cast<int32_t>(i) : ids[i]; }
  double weight_of(int32_t token) const {
    if (ids.empty()) return token >= 0 && size_t(token) < weights.size() ? weights[token] : 0.0;
    const auto it = std::lower_bound(ids.begin(), ids.end(), token);
    return it != ids.end() && *it == token ? weights[size_t(it - ids.begin())] : 0.0;
  }
};

// The ids whose logit is not below the k-th largest (ties with it stay, as vLLM masks below its
// value), ascending. A bounded min-heap: after the first k logits most are rejected by one
// comparison, so this is one pass over the vocabulary, not a sort. *top: the largest logit.
std::vector<int32_t> top_k_ids(std::span<const float> logits, int64_t k, float* top) {
  std::vector<float> heap(logits.begin(), logits.begin() + k);
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  float smallest = heap.front();  // a local, so the loop does not reload it through an alias
  for (const float l : logits.subspan(size_t(k))) {
    if (l > smallest) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      heap.back() = l;
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
      smallest = heap.front();
    }
  }
  const float kth = heap.front();
  *top = *std::max_element(heap.begin(), heap.end());
  std::vector<int32_t> ids;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] >= kth) ids.push_back(static_cast<int32_t>(i));
  return ids;
}

Candidates random_candidates(std::span<const float> logits, const sched::SamplingParams& p) {
  const int64_t V = static_cast<int64_t>(logits.size());
  const double inv_t = 1.0 / p.temperature;
  Candidates c;
  float top = 0;  // the largest logit: every weight is at most 1
  if (p.top_k > 0 && p.top_k < V)
    c.ids = top_k_ids(logits, p.top_k, &top);
  else
    top = max_logit(logits);
  const size_t n = c.ids.empty() ? size_t(V) : c.ids.size();
  c.weights.resize(n);
  if (c.ids.empty()) {
    kernels::exp_shifted(logits.data(), V, top, inv_t, c.weights.data());
  } else {
    std::vector<float> picked(n);
    for (size_t i = 0; i < n; ++i) picked[i] = logits[size_t(c.ids[i])];
    kernels::exp_shifted(picked.data(), int64_t(n), top, inv_t, c.weights.data());
  }
  // min-p: the best token weighs 1, so the threshold is min_p itself.
  if (p.min_p > 0.0)
    for (double& x : c.weights)
      if (x < p.min_p) x = 0;
  if (p.top_p < 1.0) keep_nucleus(c.weights, p.top_p);
  c.total = sum_of(c.weights);
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
    if (c.id(pick) == excluded || c.weights[pick] == 0) continue;
    if (pick == last || u < c.weights[pick]) break;
    u -= c.weights[pick];
  }
  return c.id(pick);
}

// The first id with the largest logit.
int32_t argmax(std::span<const float> logits) {
  const float m = max_logit(logits);
  const auto it = std::find(logits.begin(), logits.end(), m);
  return it == logits.end() ? 0 : static_cast<int32_t>(it - logits.begin());
}

// out->token's value(logit) and the top `num_top` alternatives by it (ties: the lower id first).
// A bounded heap over one pass: neither a value per token nor a sort of the vocabulary is kept.
template <typename Value>
void score_by(std::span<const float> logits, int32_t num_top, const Value& logprob,
              SampledToken* out) {
  out->logprob = logprob(logits[out->token]);
  if (num_top <= 0) return;
  using Entry = std::pair<float, int32_t>;  // (logprob, id)
  // Best first: the higher logprob, then the lower id. The heap's front is its worst entry.
  const auto better = [](const Entry& a, const Entry& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const size_t n = std::min<size_t>(size_t(num_top), logits.size());
  std::vector<Entry> heap;
  heap.reserve(n);
  size_t i = 0;
  for (; i < n; ++i) {
    heap.emplace_back(logprob(logits[i]), static_cast<int32_t>(i));
    std::push_heap(heap.begin(), heap.end(), better);
  }
  float worst = heap.front().first;  // a local: the loop does not reload it through the heap
  for (; i < logits.size(); ++i) {
    const float lp = logprob(logits[i]);
    if (!(lp > worst)) continue;  // a tie never wins: every id here is above the heap's
    std::pop_heap(heap.begin(), heap.end(), better);
    heap.back() = {lp, static_cast<int32_t>(i)};
    std::push_heap(heap.begin(), heap.end(), better);
    worst = heap.front().first;
  }
  std::sort(heap.begin(), heap.end(), better);
  for (const auto& [lp, id] : heap) out->top_logprobs.emplace_back(id, lp);
}

// By logprob (the row's log-softmax).
void score(std::span<const float> logits, int32_t num_top, SampledToken* out) {
  score_by(logits, num_top, LogSoftmax(logits), out);
}

// By the logit itself (the *_logits modes); NaN counts as -inf, as in the log-softmax.
void score_logits(std::span<const float> logits, int32_t num_top, SampledToken* out) {
  score_by(
      logits, num_top,
      [](float l) { return std::isnan(l) ? -std::numeric_limits<float>::infinity() : l; }, out);
}

using sched::LogprobsMode;

// Whether the logits processors may change a row under `p` (apply_logits_processors' list).
bool processors_may_change(const sched::SamplingParams& p, const TokenHistory& history) {
  return !p.allowed_token_ids.empty() || !p.bad_words_token_ids.empty() || !p.logit_bias.empty() ||
         p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 ||
         (static_cast<int64_t>(history.output_token_ids.size()) < p.min_tokens &&
          !p.all_stop_token_ids.empty());
}

// The row as the model gave it, kept for the raw modes when the processors may change it
// (empty otherwise: the processed row scores the same). raw_logits always keeps it: the
// processors also settle non-finite logits.
std::vector<float> keep_raw_logits(std::span<const float> logits, const sched::SamplingParams& p,
                                   const TokenHistory& history) {
  if (!p.logprobs) return {};
  const bool keep =
      p.logprobs_mode == LogprobsMode::kRawLogits ||
      (p.logprobs_mode == LogprobsMode::kRawLogprobs && processors_may_change(p, history));
  return keep ? std::vector<float>(logits.begin(), logits.end()) : std::vector<float>();
}

// The logits a random draw was made from, as vLLM's processed modes report them: each
// candidate's logit / temperature, -inf outside the support that min-p, top-k and top-p left.
std::vector<float> drawn_logits(std::span<const float> logits, const Candidates& c,
                                double temperature) {
  std::vector<float> out(logits.size(), -std::numeric_limits<float>::infinity());
  const double inv_t = 1.0 / temperature;
  for (size_t i = 0; i < c.weights.size(); ++i) {
    if (c.weights[i] <= 0) continue;
    const size_t id = static_cast<size_t>(c.id(i));
    out[id] = static_cast<float>(logits[id] * inv_t);
  }
  return out;
}

// Logprobs per the request's logprobs_mode. `raw`: keep_raw_logits' row (empty: `logits`);
// `logits`: after the processors; `drawn`: the random draw's candidates (null: greedy, whose
// processed row is `logits`).
void add_logprobs(std::span<const float> raw, std::span<const float> logits,
                  const Candidates* drawn, const sched::SamplingParams& p, SampledToken* out) {
  if (!p.logprobs) return;  // logprobs cost a pass over the vocabulary: only on request
  const int32_t n = *p.logprobs;
  const std::span<const float> before = raw.empty() ? logits : raw;
  switch (p.logprobs_mode) {
    case LogprobsMode::kRawLogprobs:
      return score(before, n, out);
    case LogprobsMode::kRawLogits:
      return score_logits(before, n, out);
    case LogprobsMode::kProcessedLogprobs:
    case LogprobsMode::kProcessedLogits: {
      std::vector<float> row;
      if (drawn != nullptr) row = drawn_logits(logits, *drawn, p.temperature);
      const std::span<const float> after = drawn != nullptr ? std::span<const float>(row) : logits;
      if (p.logprobs_mode == LogprobsMode::kProcessedLogprobs) return score(after, n, out);
      return score_logits(after, n, out);
    }
  }
}

}  // namespace

SampledToken sample_token(std::span<float> logits, const sched::SamplingParams& p,
                          const TokenHistory& history, std::mt19937_64& rng) {
  const std::vector<float> raw = keep_raw_logits(logits, p, history);
  apply_logits_processors(logits, p, history);
  SampledToken out;
  if (p.greedy()) {
    out.token = argmax(logits);
    add_logprobs(raw, logits, nullptr, p, &out);
    return out;
  }
  const Candidates c = random_candidates(logits, p);
  out.token = draw(c, rng);
  add_logprobs(raw, logits, &c, p, &out);
  return out;
}

std::vector<double> sampling_weights(std::span<const float> logits,
                                     const sched::SamplingParams& params) {
  const Candidates c = random_candidates(logits, params);
  if (c.ids.empty()) return c.weights;
  std::vector<double> weights(logits.size(), 0.0);
  for (size_t i = 0; i < c.ids.size(); ++i) weights[size_t(c.ids[i])] = c.weights[i];
  return weights;
}

SampledToken score_token(std::span<const float> logits, int32_t token, int32_t num_top) {
  SampledToken out;
  out.token = token;
  score(logits, num_top, &out);  // prompt logprobs are raw logprobs in every mode, as in vLLM
  const float mine = std::isnan(logits[token]) ? -std::numeric_limits<float>::infinity()
                                               : logits[token];  // NaN ranks with -inf
  const auto higher =
      std::count_if(logits.begin(), logits.end(), [&](float v) { return v > mine; });
  out.rank = 1 + static_cast<int32_t>(higher);
  return out;
}

VerifiedToken verify_draft(std::span<float> logits, const sched::SamplingParams& p,
                           const TokenHistory& history, int32_t draft, std::mt19937_64& rng) {
  const std::vector<float> raw = keep_raw_logits(logits, p, history);
  apply_logits_processors(logits, p, history);
  VerifiedToken out;
  if (p.greedy()) {
    out.sampled.token = argmax(logits);
    out.accepted = out.sampled.token == draft;
    add_logprobs(raw, logits, nullptr, p, &out.sampled);
  } else {
    // The draft distribution q is one-hot on the draft: accept with probability
    // min(1, p(d) / q(d)) = p(d); otherwise draw from max(0, p - q), which is p without d.
    const Candidates c = random_candidates(logits, p);
    const double p_draft = c.total > 0 ? c.weight_of(draft) / c.total : 0.0;
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    out.accepted = u < p_draft;
    out.sampled.token = out.accepted ? draft : draw(c, rng, draft);
    add_logprobs(raw, logits, &c, p, &out.sampled);
  }
  return out;
}

}  // namespace worker
