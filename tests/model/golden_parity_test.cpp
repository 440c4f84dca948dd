// Model parity with the independent PyTorch reference: logits at every position and MTP draft
// logits for 3 checkpoints x 3 sequences, whole, chunked through the paged cache, and batched.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>

#include "golden.h"
#include "kernels/gemm.h"
#include "model/deepseek_v3.h"
#include "model/sequence_runner.h"

namespace {

using testing_golden::Golden;
using testing_golden::load_golden;
using testing_golden::max_abs_diff;

constexpr double kTolerance = 1e-3;
const char* const kModels[] = {"tiny-bf16", "tiny-fp8", "tiny-noq-f32"};

model::DeepseekV3Model& get_model(const std::string& name) {
  static std::map<std::string, std::unique_ptr<model::DeepseekV3Model>> models;
  auto& m = models[name];
  if (!m) {
    auto loaded = model::DeepseekV3Model::load(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/" + name);
    EXPECT_TRUE(loaded.ok()) << loaded.status().message();
    m = std::move(loaded).value();
  }
  return *m;
}

common::ThreadPool& pool() {
  static common::ThreadPool p(2);
  return p;
}

struct Errors {
  double logits = 0, draft = 0;
};

Errors run_and_compare(const std::string& model_name, const Golden& g, int64_t chunk,
                       model::AttentionMode mode = model::AttentionMode::kAuto) {
  auto& m = get_model(model_name);
  m.set_attention_mode(mode);
  model::SequenceLogitsOptions opts;
  opts.chunk_size = chunk;
  opts.all_logits = true;
  opts.mtp = true;
  auto r = model::compute_sequence_logits(m, g.ids, opts, pool());
  m.set_attention_mode(model::AttentionMode::kAuto);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return {INFINITY, INFINITY};
  EXPECT_EQ(r->mtp_next_token, g.mtp_next_token);
  const int64_t T = g.num_tokens(), V = g.vocab_size;
  Errors e;
  e.logits = std::max(max_abs_diff(r->all_logits.data(), g.all_logits, 0, T, V),
                      max_abs_diff(r->last_logits.data(), g.last_logits, 0, 1, V));
  e.draft = max_abs_diff(r->mtp_draft_logits.data(), g.draft_logits, 0, T, V);
  return e;
}

TEST(GoldenParityTest, WholeSequencesMatchReference) {
  double worst = 0;
  for (const char* model_name : kModels) {
    for (const char* seq : {"short", "s64", "s200"}) {
      const Golden& g = load_golden(model_name, seq);
      Errors e = run_and_compare(model_name, g, 0);
      std::printf("    %-13s %-5s tokens=%3lld  max|logits diff|=%.3g  max|mtp draft diff|=%.3g\n",
                  model_name, seq, static_cast<long long>(g.num_tokens()), e.logits, e.draft);
      EXPECT_LT(e.logits, kTolerance) << model_name << "." << seq;
      EXPECT_LT(e.draft, kTolerance) << model_name << "." << seq;
      worst = std::max({worst, e.logits, e.draft});
    }
  }
  std::printf("    worst error over 9 golden files (logits and MTP draft logits): %.3g\n", worst);
}

TEST(GoldenParityTest, ChunkedThroughTheCacheMatchesReference) {
  double worst = 0;
  for (const char* model_name : kModels) {
    const Golden& g = load_golden(model_name, "s200");
    for (int64_t chunk : {1, 7, 64, 200}) {
      Errors e = run_and_compare(model_name, g, chunk);
      std::printf("    %-13s s200 chunk=%3lld  max|logits diff|=%.3g  max|mtp draft diff|=%.3g\n",
                  model_name, static_cast<long long>(chunk), e.logits, e.draft);
      EXPECT_LT(e.logits, kTolerance) << model_name << " chunk " << chunk;
      EXPECT_LT(e.draft, kTolerance) << model_name << " chunk " << chunk;
      worst = std::max({worst, e.logits, e.draft});
    }
  }
  std::printf("    worst chunked error: %.3g\n", worst);
}

TEST(GoldenParityTest, ExpandedAndAbsorbedAttentionBothMatch) {
  const Golden& g = load_golden("tiny-fp8", "s200");
  for (auto mode : {model::AttentionMode::kExpanded, model::AttentionMode::kAbsorbed}) {
    for (int64_t chunk : {1, 37, 200}) {
      Errors e = run_and_compare("tiny-fp8", g, chunk, mode);
      EXPECT_LT(e.logits, kTolerance) << "mode " << int(mode) << " chunk " << chunk;
      EXPECT_LT(e.draft, kTolerance) << "mode " << int(mode) << " chunk " << chunk;
    }
  }
}

// Past the golden files' 200 tokens: on AMX machines the expanded form expands and attends the
// history in key segments (a quarter of the chunk's queries, at least 256), so chunks of 300
// run 256-key segments over 600 and 700 keys. It must agree with the absorbed form, in one
// chunk and in chunks of 300.
// 700 token ids past the golden files' 200: several 256-key segments of history.
std::vector<int32_t> long_prompt_ids() {
  std::vector<int32_t> ids;
  for (int i = 0; i < 700; ++i) ids.push_back(int32_t((i * 131 + 7) % 500));
  return ids;
}

// All logits of `ids` on `m` in chunks of `chunk` (0: one), every chunk's attention forced to
// `mode`, over a cache of `dtype`; empty (and a test failure) if the forward fails.
std::vector<float> forced_form_logits(model::DeepseekV3Model& m, const std::vector<int32_t>& ids,
                                      model::AttentionMode mode, int64_t chunk,
                                      model::KvCacheDtype dtype = model::KvCacheDtype::kF32) {
  m.set_attention_mode(mode);
  model::SequenceLogitsOptions opts;
  opts.chunk_size = chunk;
  opts.all_logits = true;
  opts.kv_cache_dtype = dtype;
  auto r = model::compute_sequence_logits(m, ids, opts, pool());
  m.set_attention_mode(model::AttentionMode::kAuto);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? r->all_logits : std::vector<float>();
}

TEST(GoldenParityTest, ExpandedFormOverSeveralKeySegmentsAgreesWithAbsorbed) {
  auto& m = get_model("tiny-bf16");
  const std::vector<int32_t> ids = long_prompt_ids();
  auto logits = [&](model::AttentionMode mode, int64_t chunk) {
    return forced_form_logits(m, ids, mode, chunk);
  };
  const std::vector<float> absorbed = logits(model::AttentionMode::kAbsorbed, 0);
  ASSERT_EQ(absorbed.size(), size_t(700) * size_t(m.config().vocab_size));
  for (int64_t chunk : {int64_t{0}, int64_t{300}}) {
    const std::vector<float> expanded = logits(model::AttentionMode::kExpanded, chunk);
    ASSERT_EQ(expanded.size(), absorbed.size());
    double worst = 0;
    for (size_t i = 0; i < absorbed.size(); ++i)
      worst = std::max(worst, double(std::abs(expanded[i] - absorbed[i])));
    EXPECT_LT(worst, 1e-4) << "chunk " << chunk;
  }
}

// A bf16 latent cache (vLLM's kv_cache_dtype "auto" under --dtype bfloat16). Every reader sees
// the same rounded latent, so the expanded form (vdpbf16ps on AVX512_BF16 without AMX, else
// f32 on the widened values) and the absorbed form compute the same function, in one chunk and
// in chunks of 300 over 256-key segments. On this random model they differ by up to 1.4e-3
// (3.8e-6 on an f32 cache), on either path, and by 5.9e-4 with an f32 cache holding the same
// rounded values: the gap comes with the values, not the bf16 code (a wrong expansion was 2-5
// off). The rounding must show against the f32
// cache and stay bf16-sized, and greedy tokens must mostly agree (see the activations test
// below for why not all on this random model).
TEST(GoldenParityTest, Bf16CacheKeepsTheFormsAndChunkingsInAgreement) {
  auto& m = get_model("tiny-bf16");
  const std::vector<int32_t> ids = long_prompt_ids();
  auto logits = [&](model::AttentionMode mode, int64_t chunk, model::KvCacheDtype dtype) {
    return forced_form_logits(m, ids, mode, chunk, dtype);
  };
  const int64_t V = m.config().vocab_size;
  const std::vector<float> absorbed =
      logits(model::AttentionMode::kAbsorbed, 0, model::KvCacheDtype::kBf16);
  ASSERT_EQ(absorbed.size(), size_t(700) * size_t(V));
  auto worst_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
    return worst;
  };
  for (int64_t chunk : {int64_t{0}, int64_t{300}}) {
    const std::vector<float> expanded =
        logits(model::AttentionMode::kExpanded, chunk, model::KvCacheDtype::kBf16);
    ASSERT_EQ(expanded.size(), absorbed.size());
    const double diff = worst_diff(expanded, absorbed);
    std::printf(
        "    bf16 cache, expanded in chunks of %lld against absorbed: max|logits diff| %.3g\n",
        static_cast<long long>(chunk), diff);
    EXPECT_LT(diff, 5e-3) << "chunk " << chunk;
  }
  const std::vector<float> f32 =
      logits(model::AttentionMode::kAbsorbed, 0, model::KvCacheDtype::kF32);
  ASSERT_EQ(f32.size(), absorbed.size());
  const double head = worst_diff(std::vector<float>(f32.begin(), f32.begin() + 4 * V),
                                 std::vector<float>(absorbed.begin(), absorbed.begin() + 4 * V));
  int64_t agree = 0;
  for (int64_t t = 0; t < 700; ++t) {
    const float* a = absorbed.data() + t * V;
    const float* b = f32.data() + t * V;
    agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
  }
  std::printf(
      "    bf16 cache: max|logits diff| against the f32 cache %.3g over the first 4 "
      "positions, greedy agreement %lld/700\n",
      head, static_cast<long long>(agree));
  EXPECT_GT(head, 1e-6) << "the cache was not rounded";
  EXPECT_LT(head, 0.05);
  EXPECT_GE(agree * 4, 700 * 3);
}

// Three sequences with different lengths and histories share one batch and one paged cache
// with interleaved blocks; every row's logits must match its own sequence's golden row. Runs
// with the latent-only cache and with the expanded k/v cache beside it (history then read, not
// re-expanded; the short chunks still go through the absorbed path and must fill it). With a
// bf16 cache (tiny-bf16 only; the last step expands two sequences' histories, with vdpbf16ps
// where the CPU has it) the reference is each sequence run alone on a bf16 cache, within the
// forms' 5e-3 (Bf16CacheKeepsTheFormsAndChunkingsInAgreement).
TEST(GoldenParityTest, MixedBatchOfThreeSequencesMatchesReference) {
  for (const auto dtype : {model::KvCacheDtype::kF32, model::KvCacheDtype::kBf16})
    for (const bool expanded_cache : {false, true})
      for (const char* model_name : kModels) {
        const bool bf16 = dtype == model::KvCacheDtype::kBf16;
        if (bf16 && (expanded_cache || std::string(model_name) != "tiny-bf16")) continue;
        auto& m = get_model(model_name);
        const auto& c = m.config();
        const Golden* seqs[3] = {&load_golden(model_name, "s200"), &load_golden(model_name, "s64"),
                                 &load_golden(model_name, "short")};
        const int bs = 16;
        const int64_t V = c.vocab_size, H = c.hidden_size;
        // Logical block i of sequence s lives at physical block 3 * i + s.
        std::vector<std::vector<int32_t>> tables(3);
        for (int s = 0; s < 3; ++s) {
          for (int i = 0; i < 13; ++i) tables[s].push_back(3 * i + s);
        }
        model::LatentKvCache cache(c.num_total_layers(), 0, c.num_total_layers(), 39, bs,
                                   c.kv_cache_row_dim(),
                                   expanded_cache ? c.expanded_kv_row_dim() : 0, dtype);
        // Each sequence's reference rows: the golden files, or its own bf16-cache run.
        std::vector<std::vector<float>> want(3), want_draft(3);
        for (int s = 0; s < 3; ++s) {
          want[s] = seqs[s]->all_logits;
          want_draft[s] = seqs[s]->draft_logits;
          if (!bf16) continue;
          model::SequenceLogitsOptions opts;
          opts.all_logits = true;
          opts.mtp = true;
          opts.mtp_next_token = seqs[s]->mtp_next_token;
          opts.kv_cache_dtype = dtype;
          auto r = model::compute_sequence_logits(m, seqs[s]->ids, opts, pool());
          ASSERT_TRUE(r.ok()) << r.status().message();
          want[s] = r->all_logits;
          want_draft[s] = r->mtp_draft_logits;
        }
        // Steps: (sequence, begin, end) chunks run together.
        const std::vector<std::vector<std::array<int64_t, 3>>> steps = {
            {{0, 0, 50}},
            {{0, 50, 57}, {1, 0, 30}},
            {{1, 30, 64}, {2, 0, 4}, {0, 57, 200}},
        };
        double worst = 0, worst_draft = 0;
        for (const auto& step : steps) {
          model::ForwardBatch batch;
          std::vector<int32_t> next_ids;
          for (const auto& [s, b, e] : step) {
            const Golden& g = *seqs[s];
            batch.sequences.push_back(
                {std::span<const int32_t>(g.ids.data() + b, e - b), b, tables[s]});
            for (int64_t p = b; p < e; ++p) {
              next_ids.push_back(p + 1 < g.num_tokens() ? g.ids[p + 1] : g.mtp_next_token);
            }
          }
          const int64_t T = batch.num_tokens();
          std::vector<float> hidden(T * H), logits(T * V), draft(T * V);
          ASSERT_TRUE(m.embed(batch, hidden.data()).ok());
          ASSERT_TRUE(
              m.run_layers(batch, 0, c.num_hidden_layers, hidden.data(), cache, pool()).ok());
          m.final_norm(hidden.data(), T, hidden.data());
          ASSERT_TRUE(m.compute_logits(hidden.data(), T, logits.data(), pool()).ok());
          ASSERT_TRUE(
              m.mtp_logits(batch, hidden.data(), next_ids, cache, pool(), draft.data()).ok());
          int64_t row = 0;
          for (const auto& [s, b, e] : step) {
            worst = std::max(worst, max_abs_diff(logits.data() + row * V, want[s], b, e - b, V));
            worst_draft = std::max(
                worst_draft, max_abs_diff(draft.data() + row * V, want_draft[s], b, e - b, V));
            row += e - b;
          }
        }
        std::printf(
            "    %-13s batch of 3 sequences%s: max|logits diff|=%.3g  max|mtp draft diff|=%.3g\n",
            model_name,
            expanded_cache ? " (expanded k/v cache)" : (bf16 ? " (bf16 cache, against alone)" : ""),
            worst, worst_draft);
        const double tolerance = bf16 ? 5e-3 : kTolerance;
        EXPECT_LT(worst, tolerance) << model_name << " expanded cache " << expanded_cache;
        EXPECT_LT(worst_draft, tolerance) << model_name << " expanded cache " << expanded_cache;
      }
}

// ActivationPrecision::kBf16 (serve's --dtype bfloat16) on the BF16 checkpoint. The rounding must
// show in the logits and stay bf16-sized (within 0.05 of the f32 reference) over the first four
// positions. Further on, this random model's near-tied expert scores make rounding flip some
// tokens' expert choices, which moves their logits by up to ~2 and, through their keys, the
// later positions a little (measured: 83-100% greedy agreement); a wrong kernel would leave
// almost none, so at least 75% must agree. The test binary also runs under CHUNKPIPE_ISA=avx2:
// both the vdpbf16ps kernel and the rounded f32 paths are checked.
TEST(GoldenParityTest, Bf16ActivationsStayWithinBf16RoundingOfTheReference) {
  const kernels::ScopedActivationPrecision precision(kernels::ActivationPrecision::kBf16);
  for (const char* seq : {"short", "s64", "s200"}) {
    const Golden& g = load_golden("tiny-bf16", seq);
    auto& m = get_model("tiny-bf16");
    model::SequenceLogitsOptions opts;
    opts.all_logits = true;
    auto r = model::compute_sequence_logits(m, g.ids, opts, pool());
    ASSERT_TRUE(r.ok()) << r.status().message();
    const int64_t T = g.num_tokens(), V = g.vocab_size;
    const double diff = max_abs_diff(r->all_logits.data(), g.all_logits, 0, T, V);
    double scale = 0;
    for (float v : g.all_logits) scale = std::max(scale, double(std::abs(v)));
    int64_t agree = 0;
    for (int64_t t = 0; t < T; ++t) {
      const float* got = r->all_logits.data() + t * V;
      const float* want = g.all_logits.data() + t * V;
      agree += std::max_element(got, got + V) - got == std::max_element(want, want + V) - want;
    }
    const double head_diff = max_abs_diff(r->all_logits.data(), g.all_logits, 0, 4, V);
    std::printf(
        "    bf16 activations %-5s max|logits diff| %.3g over the first 4 positions, %.3g "
        "over all (logits up to %.3g), greedy agreement %lld/%lld\n",
        seq, head_diff, diff, scale, static_cast<long long>(agree), static_cast<long long>(T));
    EXPECT_GT(head_diff, 1e-4) << seq << ": the activations were not rounded";
    EXPECT_LT(head_diff, 0.05) << seq;
    EXPECT_GE(agree * 4, T * 3) << seq;
  }
}

TEST(GoldenParityTest, RejectsOutOfVocabularyIds) {
  auto r = model::compute_sequence_logits(get_model("tiny-bf16"), {1, 2, 512}, {}, pool());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "token id 512 is outside the vocabulary [0, 512)");
}

}  // namespace

namespace {

// Two pipeline stages, each loading only its slice of layers and owning its own cache, hand
// the hidden state over and reproduce the golden logits (the MTP layer lives on the last stage).
TEST(GoldenParityTest, PipelineStagesLoadAndRunTheirLayerSlices) {
  const std::string dir = std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16";
  model::LoadOptions first;
  first.layer_begin = 0;
  first.layer_end = 2;
  first.load_head = false;
  model::LoadOptions last;
  last.layer_begin = 2;
  last.layer_end = 4;
  last.load_embedding = false;
  auto stage0 = model::DeepseekV3Model::load(dir, first);
  auto stage1 = model::DeepseekV3Model::load(dir, last);
  ASSERT_TRUE(stage0.ok()) << stage0.status().message();
  ASSERT_TRUE(stage1.ok()) << stage1.status().message();
  EXPECT_TRUE((*stage0)->weights().lm_head.empty());
  EXPECT_TRUE((*stage1)->weights().embed_tokens.empty());
  EXPECT_TRUE((*stage1)->weights().layers[0].input_layernorm.empty());

  const auto& c = (*stage0)->config();
  const Golden& g = load_golden("tiny-bf16", "s64");
  const int64_t T = g.num_tokens(), H = c.hidden_size, V = c.vocab_size;
  const int bs = 16;
  std::vector<int32_t> table = {3, 0, 2, 1};
  model::LatentKvCache cache0(c.num_total_layers(), 0, 2, 4, bs, c.kv_cache_row_dim());
  model::LatentKvCache cache1(c.num_total_layers(), 2, c.num_total_layers(), 4, bs,
                              c.kv_cache_row_dim());
  std::vector<float> hidden, logits, draft;
  double worst = 0, worst_draft = 0;
  for (int64_t start = 0; start < T; start += 24) {  // chunks of 24, 24, 16
    const int64_t n = std::min<int64_t>(24, T - start);
    model::ForwardBatch batch;
    batch.sequences.push_back({std::span<const int32_t>(g.ids.data() + start, n), start, table});
    hidden.assign(n * H, 0.0f);
    ASSERT_TRUE((*stage0)->embed(batch, hidden.data()).ok());
    ASSERT_TRUE((*stage0)->run_layers(batch, 0, 2, hidden.data(), cache0, pool()).ok());
    ASSERT_TRUE((*stage1)->run_layers(batch, 2, 4, hidden.data(), cache1, pool()).ok());
    (*stage1)->final_norm(hidden.data(), n, hidden.data());
    logits.resize(n * V);
    draft.resize(n * V);
    ASSERT_TRUE((*stage1)->compute_logits(hidden.data(), n, logits.data(), pool()).ok());
    std::vector<int32_t> next(g.ids.begin() + start + 1, g.ids.begin() + start + n);
    next.push_back(start + n < T ? g.ids[start + n] : g.mtp_next_token);
    ASSERT_TRUE(
        (*stage1)->mtp_logits(batch, hidden.data(), next, cache1, pool(), draft.data()).ok());
    worst = std::max(worst, max_abs_diff(logits.data(), g.all_logits, start, n, V));
    worst_draft = std::max(worst_draft, max_abs_diff(draft.data(), g.draft_logits, start, n, V));
  }
  std::printf(
      "    two stages (layers 0-1 | 2-3 + MTP): max|logits diff|=%.3g  max|mtp draft diff|=%.3g\n",
      worst, worst_draft);
  EXPECT_LT(worst, kTolerance);
  EXPECT_LT(worst_draft, kTolerance);
}

}  // namespace
