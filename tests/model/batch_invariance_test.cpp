// A sequence's logits are the same bits whatever else shares its forward and however many
// threads run it: the linears, the MoE (whose per-expert batches change with the batch, and
// whose decode-sized steps run one expert per thread) and both attention forms, on every ISA
// path of this machine, with f32 and bf16 activations. The batch beside the sequence holds
// other sequences of random tokens and histories, 1 to 300 rows in all.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../ops/test_util.h"
#include "kernels/gemm.h"
#include "model/deepseek_v3.h"

namespace {

constexpr int kBlockSize = 16;
constexpr int64_t kHistory = 20;  // the target's tokens before its chunk

struct Filler {
  std::vector<int32_t> ids;  // its whole history and chunk
  int64_t computed = 0;
  std::vector<int32_t> blocks;
};

// Logits of the target's chunk (after kHistory cached tokens), run in one forward with fillers
// that bring the batch to `rows` rows. Every sequence's history is computed first, alone.
std::vector<float> target_logits(const model::DeepseekV3Model& m, const std::vector<int32_t>& ids,
                                 int64_t chunk, model::AttentionMode form, int64_t rows,
                                 common::ThreadPool& pool) {
  const auto& c = m.config();
  std::mt19937 rng(static_cast<uint32_t>(rows * 7 + chunk));
  std::vector<Filler> fillers;
  int64_t left = rows - chunk, next_block = 0;
  auto blocks_for = [&](int64_t tokens) {
    std::vector<int32_t> b;
    for (int64_t i = 0; i * kBlockSize < tokens; ++i) b.push_back(int32_t(next_block++));
    return b;
  };
  const std::vector<int32_t> target_blocks = blocks_for(kHistory + chunk);
  while (left > 0) {
    Filler f;
    const int64_t n = std::min<int64_t>(left, 1 + int64_t(rng() % 40));
    f.computed = int64_t(rng() % 30);
    for (int64_t i = 0; i < f.computed + n; ++i) f.ids.push_back(int32_t(3 + rng() % 500));
    f.blocks = blocks_for(f.computed + n);
    fillers.push_back(std::move(f));
    left -= n;
  }
  model::LatentKvCache cache(c.num_total_layers(), 0, c.num_hidden_layers, next_block, kBlockSize,
                             c.kv_cache_row_dim());
  const int64_t H = c.hidden_size, V = c.vocab_size;
  auto run = [&](const model::ForwardBatch& batch) {
    std::vector<float> hidden(size_t(batch.num_tokens() * H));
    EXPECT_TRUE(m.embed(batch, hidden.data()).ok());
    EXPECT_TRUE(m.run_layers(batch, 0, c.num_hidden_layers, hidden.data(), cache, pool).ok());
    return hidden;
  };
  // Histories, one sequence at a time.
  run({{{{ids.data(), size_t(kHistory)}, 0, target_blocks}}});
  for (const Filler& f : fillers)
    if (f.computed > 0) run({{{{f.ids.data(), size_t(f.computed)}, 0, f.blocks}}});
  // The step: the target first, then the fillers' chunks.
  model::ForwardBatch step;
  step.sequences.push_back({{ids.data() + kHistory, size_t(chunk)}, kHistory, target_blocks, form});
  for (const Filler& f : fillers) {
    step.sequences.push_back(
        {{f.ids.data() + f.computed, f.ids.size() - size_t(f.computed)}, f.computed, f.blocks});
  }
  std::vector<float> hidden = run(step);
  m.final_norm(hidden.data(), chunk, hidden.data());
  std::vector<float> logits(size_t(chunk * V));
  EXPECT_TRUE(m.compute_logits(hidden.data(), chunk, logits.data(), pool).ok());
  return logits;
}

TEST(BatchInvarianceTest, ASequencesLogitsDoNotDependOnTheBatchOrTheThreads) {
  auto loaded = model::DeepseekV3Model::load(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const model::DeepseekV3Model& m = **loaded;
  std::vector<int32_t> ids;
  for (int i = 0; i < kHistory + 3; ++i) ids.push_back(int32_t((i * 37 + 11) % 500 + 3));
  std::vector<std::unique_ptr<common::ThreadPool>> pools;
  for (int t = 1; t <= 3; ++t) pools.push_back(std::make_unique<common::ThreadPool>(t));
  struct Form {
    model::AttentionMode mode;
    int64_t chunk;
    const char* name;
  };
  const Form forms[] = {{model::AttentionMode::kAbsorbed, 1, "absorbed"},
                        {model::AttentionMode::kExpanded, 3, "expanded"}};
  for (const auto precision :
       {kernels::ActivationPrecision::kF32, kernels::ActivationPrecision::kBf16}) {
    const kernels::ScopedActivationPrecision scoped(precision);
    for (const auto& path : testutil::supported_isa_paths()) {
      kernels::ScopedCpuFeatures isa(path.features);
      // On AVX512_BF16 bf16 activations take one of two forms by the rows of each linear call
      // (gemm_test.cpp), and an expert's rows change with the batch: there the logits agree to
      // bf16 rounding instead of bit for bit (ARCHITECTURE, "Batch invariance").
      const bool two_forms = precision == kernels::ActivationPrecision::kBf16 &&
                             kernels::cpu_features().avx512_bf16 && !kernels::amx_bf16_active();
      for (const Form& f : forms) {
        const std::vector<float> alone = target_logits(m, ids, f.chunk, f.mode, f.chunk, *pools[0]);
        for (auto& pool : pools) {
          for (const int64_t rows : {1, 2, 3, 7, 16, 64, 300}) {
            if (rows < f.chunk) continue;
            const std::vector<float> got = target_logits(m, ids, f.chunk, f.mode, rows, *pool);
            const std::string what = std::string(path.name) + " " + f.name + " precision " +
                                     std::to_string(static_cast<int>(precision)) + " threads " +
                                     std::to_string(pool->num_threads()) + " rows " +
                                     std::to_string(rows);
            if (two_forms) {
              EXPECT_LT(testutil::max_rel_error(got, alone), 0.05) << what;
            } else {
              EXPECT_EQ(got, alone) << what;
            }
          }
        }
      }
    }
  }
}

}  // namespace
