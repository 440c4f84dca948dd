// Where each MLA attention form wins: one process runs a checkpoint's layers on chunks of x new
// tokens after L cached ones, once in the expanded form (re-expand the history's k/v from the
// latent, then per-head attention) and once in the absorbed form (MQA over the latent), the same
// probe CPP's startup profiling runs (ModelRunner::profile_ms). Prints the CPU, each pair of
// times, the winner, and per history the largest chunk the absorbed form wins.
//   attention_form_bench MODEL_DIR [THREADS=1] [HISTORIES=1024,4096]
//   [CHUNKS=16,64,128,256,512,1024]
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_line.h"
#include "model/deepseek_v3.h"
#include "worker/model_runner.h"

namespace {

std::vector<int64_t> list(const char* text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::atoll(item.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: attention_form_bench MODEL_DIR [THREADS] [HISTORIES] [CHUNKS]\n");
    return 2;
  }
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  const auto histories = list(argc > 3 ? argv[3] : "1024,4096");
  const auto chunks = list(argc > 4 ? argv[4] : "16,64,128,256,512,1024");
  auto model = model::DeepseekV3Model::load(argv[1]);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().message().c_str());
    return 1;
  }
  int64_t longest = 0;
  for (int64_t L : histories)
    for (int64_t x : chunks) longest = std::max(longest, L + x);
  worker::RunnerOptions options;
  options.block_size = 128;
  options.num_blocks = longest / options.block_size + 2;
  options.num_threads = threads;
  worker::ModelRunner runner(**model, options);
  const auto& c = (*model)->config();
  bench::print_cpu_line();
  std::printf(
      "model %s: %d layers, %d heads, kv_lora_rank %lld, qk_nope %d, qk_rope %d, v_head %d; "
      "%d thread(s)\n",
      argv[1], c.num_hidden_layers, c.num_attention_heads, static_cast<long long>(c.kv_lora_rank),
      c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, threads);
  runner.profile_ms(chunks.front(), histories.front(), sched::AttentionForm::kExpanded);  // warm-up
  std::printf("%8s %8s %12s %12s  %s\n", "history", "chunk", "expanded ms", "absorbed ms",
              "cheaper");
  for (int64_t L : histories) {
    int64_t absorbed_up_to = 0;
    for (int64_t x : chunks) {
      double e = 1e300, a = 1e300;
      for (int rep = 0; rep < 2; ++rep) {  // the better of two
        e = std::min(e, runner.profile_ms(x, L, sched::AttentionForm::kExpanded));
        a = std::min(a, runner.profile_ms(x, L, sched::AttentionForm::kAbsorbed));
      }
      if (a < e) absorbed_up_to = x;
      std::printf("%8lld %8lld %12.2f %12.2f  %s\n", static_cast<long long>(L),
                  static_cast<long long>(x), e, a, a < e ? "absorbed" : "expanded");
    }
    std::printf("history %lld: absorbed wins up to chunk %lld (of those tried)\n",
                static_cast<long long>(L), static_cast<long long>(absorbed_up_to));
  }
  return 0;
}
