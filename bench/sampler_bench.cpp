// The sampler's cost per token over a DeepSeek-V3-sized vocabulary (129280 by default), per
// sampling setting and for one prompt_logprobs position, and the exp row kernel against its
// std::exp reference on the same row, side by side in one run. Logits are N(0, 3) with one peaked
// token, as a trained model's row looks. Prints the CPU first. Usage: sampler_bench [--vocab
// 129280] [--iters 300]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "cpu_line.h"
#include "kernels/exp_row.h"
#include "worker/sampler.h"

namespace {

// The best of three rounds of `iters` calls, in ms per call.
double best_ms(int iters, const std::function<void()>& call) {
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) call();
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - t0;
    best = std::min(best, took.count() / iters);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int vocab = 129280, iters = 300;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--vocab")) {
      vocab = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--iters")) {
      iters = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (vocab < 2 || iters < 1) {
    std::fprintf(stderr, "--vocab must be at least 2 and --iters at least 1\n");
    return 2;
  }
  bench::print_cpu_line();
  std::mt19937_64 gen(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& x : logits) x = normal(gen);
  logits[42] = 25.0f;

  std::vector<double> out(static_cast<size_t>(vocab));
  const float top = *std::max_element(logits.begin(), logits.end());
  const double fast = best_ms(
      iters, [&] { kernels::exp_shifted(logits.data(), vocab, top, 1.0 / 0.6, out.data()); });
  const double reference = best_ms(iters, [&] {
    kernels::exp_shifted_reference(logits.data(), vocab, top, 1.0 / 0.6, out.data());
  });
  std::printf("exp over %d logits: %.3f ms (std::exp reference %.3f ms, %.1fx)\n", vocab, fast,
              reference, reference / fast);

  struct Setting {
    const char* name;
    double temperature, top_p;
    int32_t top_k, logprobs;
  };
  const Setting settings[] = {{"greedy", 0, 1, 0, 0},
                              {"temperature 1", 1.0, 1, 0, 0},
                              {"temperature 0.6, top_p 0.95", 0.6, 0.95, 0, 0},
                              {"temperature 0.6, top_p 0.95, logprobs 5", 0.6, 0.95, 0, 5},
                              {"temperature 0.7, top_k 50", 0.7, 1, 50, 0}};
  std::printf("%-42s %s\n", "sample_token", "ms per token (row copy included)");
  std::vector<float> row;
  for (const Setting& s : settings) {
    sched::SamplingParams p;
    p.temperature = s.temperature;
    p.top_p = s.top_p;
    p.top_k = s.top_k;
    if (s.logprobs > 0) p.logprobs = s.logprobs;
    int32_t checksum = 0;
    const double ms = best_ms(iters, [&] {
      row = logits;
      checksum += worker::sample_token(row, p, {}, gen).token;
    });
    std::printf("%-42s %.3f\n", s.name, ms);
    if (checksum < 0) return 1;  // keeps the draws observable
  }
  float sum = 0;
  const double scored = best_ms(iters, [&] { sum += worker::score_token(logits, 7, 5).logprob; });
  std::printf("%-42s %.3f\n", "score_token, top 5 (one prompt position)", scored);
  volatile float sink = sum;  // keeps the scoring observable
  (void)sink;
  return 0;
}
