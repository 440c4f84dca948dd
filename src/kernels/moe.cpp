// Router math follows DeepSeek-V3 noaux_tc (deepseek-v3-model.md §7); dispatch gathers each
// expert's tokens into a dense block so the expert runs as one linear call per projection.
#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/check.h"
#include "kernels/activation.h"
#include "kernels/gemm.h"
#include "tensor/aligned_buffer.h"

namespace kernels {

void route_experts(const float* router_logits, int64_t num_tokens, const float* correction_bias,
                   const RouterParams& p, int32_t* topk_ids, float* topk_weights) {
  const int E = p.num_experts, k = p.top_k;
  const int G = std::max(1, p.num_groups), per_group = E / G;
  std::vector<float> scores(E), choice(E), group_score(G);
  std::vector<int> order(E), group_order(G);
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* logits = router_logits + t * E;
    if (p.scoring == ScoringFunc::kSigmoid) {
      for (int e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    } else {
      float m = *std::max_element(logits, logits + E), sum = 0.0f;
      for (int e = 0; e < E; ++e) sum += (scores[e] = std::exp(logits[e] - m));
      for (int e = 0; e < E; ++e) scores[e] /= sum;
    }
    for (int e = 0; e < E; ++e) {
      choice[e] = scores[e] +
                  (p.method == TopkMethod::kNoauxTc && correction_bias ? correction_bias[e] : 0.0f);
    }
    if (p.method != TopkMethod::kGreedy && G > 1 && p.topk_groups < G) {
      for (int g = 0; g < G; ++g) {
        const float* c = choice.data() + g * per_group;
        if (p.method == TopkMethod::kNoauxTc) {  // sum of the two best in the group
          float b1 = kMasked, b2 = kMasked;
          for (int i = 0; i < per_group; ++i) {
            if (c[i] > b1) {
              b2 = b1;
              b1 = c[i];
            } else if (c[i] > b2) {
              b2 = c[i];
            }
          }
          group_score[g] = b1 + (per_group > 1 ? b2 : 0.0f);
        } else {
          group_score[g] = *std::max_element(c, c + per_group);
        }
      }
      std::iota(group_order.begin(), group_order.end(), 0);
      std::partial_sort(group_order.begin(), group_order.begin() + p.topk_groups, group_order.end(),
                        [&](int a, int b) {
                          return group_score[a] > group_score[b] ||
                                 (group_score[a] == group_score[b] && a < b);
                        });
      std::vector<bool> keep(G, false);
      for (int i = 0; i < p.topk_groups; ++i) keep[group_order[i]] = true;
      for (int e = 0; e < E; ++e) {
        if (!keep[e / per_group]) choice[e] = kMasked;
      }
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
      return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
    });
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += scores[order[j]];
    for (int j = 0; j < k; ++j) {
      float w = scores[order[j]];
      if (p.normalize && k > 1) w /= (sum + 1e-20f);
      topk_ids[t * k + j] = order[j];
      topk_weights[t * k + j] = w * p.routed_scaling_factor;
    }
  }
}

void swiglu_mlp(const float* x, int64_t num_tokens, const ExpertWeights& w, float* out,
                common::ThreadPool& pool) {
  const int64_t inter = w.gate_up.rows / 2;
  // Per-thread buffers that only grow, left unzeroed (both are written whole before they are
  // read): fresh zero-filled ones cost a long prefill's dense and shared-expert MLPs their
  // zeroing and page faults on every layer (64 MB per layer at 4096 tokens of the `small` model).
  thread_local tensor::AlignedBuffer<float> gate_up, act;
  if (gate_up.size() < static_cast<size_t>(num_tokens * 2 * inter))
    gate_up.resize(static_cast<size_t>(num_tokens * 2 * inter));
  if (act.size() < static_cast<size_t>(num_tokens * inter))
    act.resize(static_cast<size_t>(num_tokens * inter));
  linear(x, num_tokens, w.gate_up, gate_up.data(), pool);
  silu_mul(gate_up.data(), num_tokens, inter, act.data());
  linear(act.data(), num_tokens, w.down, out, pool);
}

void moe_dispatch(const float* x, int64_t num_tokens, int64_t hidden, const int32_t* topk_ids,
                  const float* topk_weights, int top_k, std::span<const ExpertWeights> experts,
                  float* out, common::ThreadPool& pool) {
  const int64_t num_experts = static_cast<int64_t>(experts.size());
  // Counting sort of (token, slot) assignments by expert.
  std::vector<int64_t> offsets(num_experts + 1, 0);
  for (int64_t i = 0; i < num_tokens * top_k; ++i) {
    CHECK(topk_ids[i] >= 0 && topk_ids[i] < num_experts) << "expert id out of range";
    ++offsets[topk_ids[i] + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> assignment(num_tokens * top_k), fill(offsets.begin(), offsets.end() - 1);
  for (int64_t i = 0; i < num_tokens * top_k; ++i) assignment[fill[topk_ids[i]]++] = i;

  // Decode-sized batches: each expert has a few tokens, so a parallel region per projection would
  // cost more in hand-offs than its GEMV. Whole experts then run one per thread (each on a
  // one-thread pool: the same kernels, the same bits), and their outputs are added in expert
  // order as below.
  int64_t active = 0, most = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    active += n > 0;
    most = std::max(most, n);
  }
  if (pool.num_threads() > 1 && active >= pool.num_threads() &&
      most <= kExpertsPerThreadMaxTokens) {
    std::vector<int64_t> used;
    for (int64_t e = 0; e < num_experts; ++e)
      if (offsets[e + 1] > offsets[e]) used.push_back(e);
    std::vector<std::vector<float>> ys(used.size());
    pool.parallel_for(static_cast<int64_t>(used.size()), 1, [&](int64_t b, int64_t end, int) {
      thread_local common::ThreadPool serial(1);
      std::vector<float> xe;
      for (int64_t u = b; u < end; ++u) {
        const int64_t e = used[size_t(u)], n = offsets[e + 1] - offsets[e];
        xe.resize(static_cast<size_t>(n * hidden));
        for (int64_t i = 0; i < n; ++i) {
          const int64_t t = assignment[offsets[e] + i] / top_k;
          std::copy_n(x + t * hidden, hidden, xe.data() + i * hidden);
        }
        ys[size_t(u)].resize(static_cast<size_t>(n * hidden));
        swiglu_mlp(xe.data(), n, experts[e], ys[size_t(u)].data(), serial);
      }
    });
    for (size_t u = 0; u < used.size(); ++u) {
      const int64_t e = used[u], n = offsets[e + 1] - offsets[e];
      for (int64_t i = 0; i < n; ++i) {
        const int64_t a = assignment[offsets[e] + i];
        const float w = topk_weights[a];
        float* o = out + (a / top_k) * hidden;
        const float* y = ys[u].data() + i * hidden;
        for (int64_t d = 0; d < hidden; ++d) o[d] += w * y[d];
      }
    }
    return;
  }

  std::vector<float> xe, ye;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    xe.resize(static_cast<size_t>(n * hidden));
    ye.resize(static_cast<size_t>(n * hidden));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = assignment[offsets[e] + i] / top_k;
      std::copy_n(x + t * hidden, hidden, xe.data() + i * hidden);
    }
    swiglu_mlp(xe.data(), n, experts[e], ye.data(), pool);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t a = assignment[offsets[e] + i];
      const float w = topk_weights[a];
      float* o = out + (a / top_k) * hidden;
      const float* y = ye.data() + i * hidden;
      for (int64_t d = 0; d < hidden; ++d) o[d] += w * y[d];
    }
  }
}

void moe_dispatch_reference(const float* x, int64_t num_tokens, int64_t hidden,
                            const int32_t* topk_ids, const float* topk_weights, int top_k,
                            std::span<const ExpertWeights> experts, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int j = 0; j < top_k; ++j) {
      const ExpertWeights& w = experts[topk_ids[t * top_k + j]];
      const int64_t inter = w.gate_up.rows / 2;
      std::vector<float> gu(2 * inter), act(inter), y(hidden);
      linear_reference(x + t * hidden, 1, w.gate_up, gu.data(), 2 * inter);
      silu_mul_reference(gu.data(), 1, inter, act.data());
      linear_reference(act.data(), 1, w.down, y.data(), hidden);
      for (int64_t d = 0; d < hidden; ++d)
        out[t * hidden + d] += topk_weights[t * top_k + j] * y[d];
    }
  }
}

}  // namespace kernels
