// The CPP cost model (NNLS fit, chunk solve, form choice) and the chunk planner (pipeline
// recurrence, greedy and best plans) on hand-computed cases, and the scheduler following a plan.
#include "sched/chunk_planner.h"

#include <gtest/gtest.h>

#include <cmath>

#include "sched/chunk_predictor.h"
#include "sched/cost_from_dims.h"
#include "sched/scheduler.h"

namespace {

using sched::AttentionForm;
using sched::ChunkCostModel;
using sched::CostSample;
using sched::FormCoefficients;
using sched::PlanOptions;

// The hand-computed planner cases: t = 5 + x ms per chunk of x tokens on 2 stages, chunks of
// any size from one token up to max_chunk.
const ChunkCostModel kFiveMsPlusOnePerToken({true, 5.0, 1.0, 0.0, 0.0}, {});
PlanOptions unit_chunk_options(int64_t prompt_tokens, int64_t max_chunk) {
  PlanOptions o;
  o.prompt_tokens = prompt_tokens;
  o.max_chunk = max_chunk;
  o.min_chunk = 1;
  o.align = 1;
  o.num_stages = 2;
  return o;
}

std::vector<CostSample> exact_samples(const FormCoefficients& f, AttentionForm form) {
  std::vector<CostSample> out;
  for (int64_t x : {16, 64, 256, 1024})
    for (int64_t L : {0, 1000, 5000})
      out.push_back(CostSample::probe(form, x, L, f.predict_ms(x, L)));
  return out;
}

TEST(ChunkCostModelTest, FitRecoversEachFormsTerms) {
  const FormCoefficients expanded{true, 30.0, 0.2, 0.025, 2.5e-4};
  const FormCoefficients absorbed{true, 28.0, 0.3, 0.0, 3.3e-4};
  auto samples = exact_samples(expanded, AttentionForm::kExpanded);
  const auto more = exact_samples(absorbed, AttentionForm::kAbsorbed);
  samples.insert(samples.end(), more.begin(), more.end());
  ChunkCostModel m;
  std::string why;
  ASSERT_TRUE(m.fit(samples, &why)) << why;
  EXPECT_NEAR(m.expanded().overhead_ms, 30.0, 1e-6);
  EXPECT_NEAR(m.expanded().per_token_ms, 0.2, 1e-9);
  EXPECT_NEAR(m.expanded().per_history_ms, 0.025, 1e-9);
  EXPECT_NEAR(m.expanded().per_pair_ms, 2.5e-4, 1e-12);
  EXPECT_NEAR(m.absorbed().per_pair_ms, 3.3e-4, 1e-12);
  EXPECT_NEAR(m.absorbed().per_history_ms, 0.0, 1e-12);
}

TEST(ChunkCostModelTest, FitKeepsTermsNonNegative) {
  // Data whose unconstrained fit has a negative overhead: t = 2x - 5 for x >= 10.
  std::vector<CostSample> samples;
  for (int64_t x : {10, 20, 40, 80, 160})
    samples.push_back(CostSample::probe(AttentionForm::kExpanded, x, 0, 2.0 * x - 5));
  ChunkCostModel m;
  ASSERT_TRUE(m.fit(samples, nullptr));
  EXPECT_GE(m.expanded().overhead_ms, 0.0);
  EXPECT_GE(m.expanded().per_history_ms, 0.0);
  EXPECT_GE(m.expanded().per_pair_ms, 0.0);
  EXPECT_GT(m.expanded().per_token_ms, 1.5);
  // Too few samples of the prefill form: no model.
  samples.resize(3);
  std::string why;
  EXPECT_FALSE(ChunkCostModel().fit(samples, &why));
  EXPECT_NE(why.find("expanded"), std::string::npos);
}

TEST(ChunkCostModelTest, MaxTokensWithinSolvesTheQuadratic) {
  // t = 10 + x: 40 tokens fit in 50 ms, none in 10.
  const FormCoefficients linear{true, 10.0, 1.0, 0.0, 0.0};
  EXPECT_EQ(linear.max_tokens_within(50, 0), 40);
  EXPECT_EQ(linear.max_tokens_within(10, 0), 0);
  // t = 2·A(x, 0) = x(x+1): 3 tokens take 12 ms; 4 take 20.
  const FormCoefficients pairs{true, 0.0, 0.0, 0.0, 2.0};
  EXPECT_EQ(pairs.max_tokens_within(12, 0), 3);
  EXPECT_EQ(pairs.max_tokens_within(19.9, 0), 3);
  EXPECT_EQ(pairs.max_tokens_within(20, 0), 4);
  // After 10 cached tokens, t = 2(10x + x(x+1)/2) = x² + 21x: 2 tokens take 46 ms.
  EXPECT_EQ(pairs.max_tokens_within(46, 10), 2);
  // History re-expansion alone can exceed the time: nothing fits.
  const FormCoefficients history{true, 0.0, 1.0, 1.0, 0.0};
  EXPECT_EQ(history.max_tokens_within(99, 100), 0);
}

TEST(ChunkCostModelTest, AbsorbedWinsForSmallChunksAfterLongHistory) {
  // Expanded: 0.02 ms per history token + 2e-4 per pair; absorbed: 3e-4 per pair, no history.
  // Absorbed is cheaper while x·L·1e-4 < 0.02·L, i.e. x < 200 (token terms equal).
  const ChunkCostModel m({true, 5, 0.1, 0.02, 2e-4}, {true, 5, 0.1, 0.0, 3e-4});
  EXPECT_EQ(m.cheaper_form(64, 8000), AttentionForm::kAbsorbed);
  EXPECT_EQ(m.cheaper_form(1024, 8000), AttentionForm::kExpanded);
  EXPECT_NEAR(m.predict_ms(64, 8000), m.absorbed().predict_ms(64, 8000), 1e-12);
  // The chunk that fits a time is the larger of the two forms' answers.
  const double t = m.absorbed().predict_ms(100, 8000);
  EXPECT_EQ(m.max_tokens_within(t, 8000), 100);
  // Without an absorbed fit, expanded is the only form.
  const ChunkCostModel only({true, 5, 0.1, 0.02, 2e-4}, {});
  EXPECT_EQ(only.cheaper_form(64, 8000), AttentionForm::kExpanded);
}

TEST(ChunkPlannerTest, PipelineRecurrenceCountsFillDrainAndTheInFlightLimit) {
  PlanOptions o;
  o.num_stages = 2;
  // Stage 0: 0-3, 3-4, then chunk 2 waits for chunk 0 to leave stage 1 (at 6): 6-8.
  // Stage 1: 3-6, 6-7, 8-10.
  EXPECT_DOUBLE_EQ(sched::pipeline_ttft_ms({3, 1, 2}, {1, 1, 1}, o), 10.0);
  o.num_stages = 1;
  EXPECT_DOUBLE_EQ(sched::pipeline_ttft_ms({3, 1, 2}, {1, 1, 1}, o), 6.0);
  // Three stages, equal chunks: W + (S - 1)·t.
  o.num_stages = 3;
  EXPECT_DOUBLE_EQ(sched::pipeline_ttft_ms({2, 2, 2, 2}, {1, 1, 1, 1}, o), 8.0 + 2 * 2.0);
  // A hop of 1 ms + 0.5 ms per token between stages, on each of the two hops.
  o.link_ms = 1;
  o.link_ms_per_token = 0.5;
  EXPECT_DOUBLE_EQ(sched::pipeline_ttft_ms({2}, {4}, o), 2 + 3 + 2 + 3 + 2);
}

TEST(ChunkPlannerTest, OverheadSetsTheChunkCountByHand) {
  // t = 5 + x ms, 100 tokens, 2 stages: K equal chunks give TTFT = (K + 1)(5 + 100/K)
  // = 100 + 5K + 100/K + 5, least at K = 4 and 5 (150 ms); the tie goes to fewer chunks.
  const ChunkCostModel& m = kFiveMsPlusOnePerToken;
  PlanOptions o = unit_chunk_options(100, 100);
  const auto plan = sched::best_plan(m, o);
  ASSERT_EQ(plan.chunks.size(), 4u);
  for (const auto& c : plan.chunks) EXPECT_EQ(c.tokens, 25);
  EXPECT_NEAR(plan.ttft_ms, 150.0, 1e-6);
  EXPECT_NEAR(plan.chunk_ms, 30.0, 1e-3);
  // Fixed chunks of the whole budget: one 105 ms chunk through both stages.
  EXPECT_NEAR(sched::fixed_plan(m, o).ttft_ms, 210.0, 1e-9);
  // min_chunk 50 allows two chunks at most: (2 + 1)·55 = 165.
  o.min_chunk = 50;
  EXPECT_NEAR(sched::best_plan(m, o).ttft_ms, 165.0, 1e-6);
}

TEST(ChunkPlannerTest, FixedChunksStayUnlessThePlanGainsEnough) {
  // t = 5 + x ms, 100 tokens, budget 50: fixed is two 55 ms chunks, (2 + 1)·55 = 165 ms; the best
  // plan is four chunks of 25, (4 + 1)·30 = 150 ms, a predicted gain of 9.1%.
  const ChunkCostModel& m = kFiveMsPlusOnePerToken;
  PlanOptions o = unit_chunk_options(100, 50);
  EXPECT_NEAR(sched::fixed_plan(m, o).ttft_ms, 165.0, 1e-9);
  o.min_predicted_gain = 0.09;
  EXPECT_NEAR(sched::best_plan(m, o).ttft_ms, 150.0, 1e-6);
  EXPECT_EQ(sched::best_plan(m, o).chunks.size(), 4u);
  o.min_predicted_gain = 0.10;
  const auto kept = sched::best_plan(m, o);
  EXPECT_NEAR(kept.ttft_ms, 165.0, 1e-9);
  EXPECT_EQ(kept.chunk_ms, 0.0);  // fixed: the scheduler takes whole budgets
  ASSERT_EQ(kept.chunks.size(), 2u);
  EXPECT_EQ(kept.chunks[0].tokens, 50);
}

TEST(ChunkPlannerTest, EqualTimeChunksShrinkAsHistoryGrows) {
  // Attention (1e-3 ms per pair) and 20 ms per chunk: about sqrt(W / c) = 20 chunks, each
  // smaller than the one before.
  const ChunkCostModel m({true, 20.0, 0.0, 0.0, 1e-3}, {});
  PlanOptions o;
  o.prompt_tokens = 4096;
  o.max_chunk = 1024;
  o.min_chunk = 16;
  o.align = 16;
  o.num_stages = 2;
  const auto fixed = sched::fixed_plan(m, o);
  const auto plan = sched::best_plan(m, o);
  ASSERT_GT(plan.chunks.size(), 12u);
  ASSERT_LT(plan.chunks.size(), 30u);
  for (size_t k = 1; k + 1 < plan.chunks.size(); ++k) {
    EXPECT_LE(plan.chunks[k].tokens, plan.chunks[k - 1].tokens) << "chunk " << k;
    EXPECT_LE(plan.chunks[k].ms, plan.chunk_ms + 1e-9) << "chunk " << k;
  }
  int64_t total = 0;
  for (const auto& c : plan.chunks) total += c.tokens;
  EXPECT_EQ(total, 4096);
  EXPECT_LT(plan.ttft_ms, fixed.ttft_ms);
  EXPECT_LT(plan.bubble(), fixed.bubble());
  // The predicted TTFT is the recurrence over the plan's own chunk times.
  std::vector<double> ms;
  std::vector<int64_t> tokens;
  for (const auto& c : plan.chunks) {
    ms.push_back(c.ms);
    tokens.push_back(c.tokens);
  }
  EXPECT_DOUBLE_EQ(sched::pipeline_ttft_ms(ms, tokens, o), plan.ttft_ms);
}

TEST(ChunkPlannerTest, PlansStartAfterPrefixHits) {
  const ChunkCostModel m({true, 5.0, 1.0, 0.0, 0.0}, {});
  PlanOptions o;
  o.prompt_tokens = 150;
  o.history = 50;  // the same 100 tokens to compute as above
  o.max_chunk = 100;
  o.align = 1;
  const auto plan = sched::best_plan(m, o);
  ASSERT_EQ(plan.chunks.size(), 4u);
  EXPECT_EQ(plan.chunks.front().history, 50);
  EXPECT_EQ(plan.chunks.back().history, 125);
}

// The scheduler in planned mode reproduces the plan chunk by chunk and tags each chunk with
// the cheaper attention form.
TEST(ChunkPlannerTest, SchedulerFollowsThePlanAndItsForms) {
  const FormCoefficients expanded{true, 2.0, 0.01, 0.002, 2e-5};
  const FormCoefficients absorbed{true, 2.0, 0.01, 0.0, 3e-5};
  auto samples = exact_samples(expanded, AttentionForm::kExpanded);
  const auto more = exact_samples(absorbed, AttentionForm::kAbsorbed);
  samples.insert(samples.end(), more.begin(), more.end());
  sched::ChunkSizePredictor predictor(1024, 16, 1.0, 64, 30);
  PlanOptions o;
  o.max_chunk = 1024;
  o.min_chunk = 64;
  o.align = 16;
  o.num_stages = 2;
  predictor.set_planned(o);
  ASSERT_TRUE(predictor.fit_cost_model(samples, nullptr));
  predictor.set_need_timing(false);
  // Its from-scratch quadratic (what /metrics shows) is the expanded form at zero history.
  for (int64_t x : {64, 1024}) {
    const double l = static_cast<double>(x);
    EXPECT_NEAR(predictor.a() * l * l + predictor.b() * l + predictor.c(),
                expanded.predict_ms(x, 0), 1e-6);
  }
  o.prompt_tokens = 6000;
  const auto plan = sched::best_plan(predictor.cost_model(), o);
  ASSERT_GT(plan.chunks.size(), 6u);

  kv::KvCacheManager kv(1000, 16, false);
  sched::Scheduler s({1024, 8, 8192}, &kv);
  s.set_chunk_predictor(&predictor);
  auto r = std::make_unique<sched::Request>();
  r->request_id = "long";
  r->prompt_token_ids.assign(6000, 5);
  r->sampling.max_tokens = 1;
  s.add_request(std::move(r));
  std::vector<int64_t> got;
  std::vector<AttentionForm> forms;
  for (int step = 0; step < 64; ++step) {
    auto so = s.schedule();
    if (so.empty()) break;
    ASSERT_EQ(so.scheduled.size(), 1u);
    got.push_back(so.scheduled[0].num_scheduled_tokens);
    forms.push_back(so.scheduled[0].attention_form);
    const bool last = so.scheduled[0].samples;
    s.update(so, {last ? 7 : -1});
    if (last) break;
  }
  ASSERT_EQ(got.size(), plan.chunks.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k], plan.chunks[k].tokens) << "chunk " << k;
    EXPECT_EQ(forms[k], plan.chunks[k].form) << "chunk " << k;
  }
}

}  // namespace

namespace {

// A made-up two-layer model whose FLOPs are counted by hand (see cost_from_dims.cpp):
// projections H·nh·(dn+dr) + H·(r+dr) + nh·dv·H = 24 + 36 + 16 = 76, expansion r·nh·(dn+dv) =
// 64, dense MLP 3·4·5 = 60, MoE 3·4·3·(2+1) + 4·4 = 124.
sched::ModelDims hand_dims() {
  sched::ModelDims d;
  d.hidden = 4;
  d.layers = 2;
  d.dense_layers = 1;
  d.heads = 2;
  d.kv_lora_rank = 8;
  d.qk_nope = 2;
  d.qk_rope = 1;
  d.v_head = 2;
  d.routed_experts = 4;
  d.experts_per_token = 2;
  d.shared_experts = 1;
  d.moe_inter = 3;
  d.inter = 5;
  return d;
}

TEST(CostFromDimsTest, TermFlopsByHand) {
  const auto both = sched::term_flops(hand_dims(), 0, 2);
  EXPECT_DOUBLE_EQ(both.per_token, 2 * (76 + 60 + 64) + 2 * (76 + 124 + 64));  // 928
  EXPECT_DOUBLE_EQ(both.per_history, 2 * 64 * 2);
  EXPECT_DOUBLE_EQ(both.per_pair, 2 * 2 * (2 + 1 + 2) * 2);
  EXPECT_DOUBLE_EQ(both.absorbed_per_pair, 2 * 2 * (2 * 8 + 1) * 2);
  const auto moe_only = sched::term_flops(hand_dims(), 1, 1);
  EXPECT_DOUBLE_EQ(moe_only.per_token, 2 * (76 + 124 + 64));
  EXPECT_EQ(sched::stage_layer_counts(61, 2), (std::vector<int64_t>{31, 30}));
  EXPECT_EQ(sched::stage_layer_counts(5, 3), (std::vector<int64_t>{2, 2, 1}));
}

TEST(CostFromDimsTest, RatesTurnFlopsIntoMillisecondsOfTheSlowestStage) {
  sched::StageRates rates;
  rates.num_stages = 2;  // stage 0: the dense layer, stage 1: the MoE layer (slower)
  rates.tensor_parallel = 2;
  rates.linear_tflops = 1e-9;     // 1 FLOP per ms per device
  rates.attention_tflops = 2e-9;  // 2 FLOPs per ms per device
  rates.overhead_ms = 3;
  const auto m = sched::cost_model_from_dims(hand_dims(), rates);
  EXPECT_DOUBLE_EQ(m.expanded().overhead_ms, 3);
  EXPECT_DOUBLE_EQ(m.expanded().per_token_ms, 2.0 * (76 + 124 + 64) / 2);
  EXPECT_DOUBLE_EQ(m.expanded().per_history_ms, 2.0 * 64 / 2);
  EXPECT_DOUBLE_EQ(m.expanded().per_pair_ms, 2.0 * 2 * 5 / 4);
  EXPECT_DOUBLE_EQ(m.absorbed().per_history_ms, 0);
  EXPECT_DOUBLE_EQ(m.absorbed().per_pair_ms, 2.0 * 2 * 17 / 4);
  // DeepSeek-V3's own dimensions: re-expanding one history token costs as much attention as
  // r·(dn+dv)/(dn+dr+dv) = 409.6 query tokens (at equal rates).
  const auto v3 = sched::term_flops(sched::deepseek_v3_dims(), 0, 1);
  EXPECT_DOUBLE_EQ(v3.per_history / v3.per_pair, 512.0 * 256 / 320);
}

// The simulator's upstream chunks on example (b) of cpp-design.md §5.4: a pure quadratic
// (2e-7 l² + 0.05 l ms, no overhead) gives vllm-ascend's 32768 / 27136 / 23680 / ... chunks.
TEST(CostFromDimsTest, UpstreamPlanReproducesTheWorkedExample) {
  // f(L + x) - f(L) = a(2Lx + x²) + b x: per_pair = 2a (area xL + x²/2 + x/2) and per_token
  // = b - a (the x/2 of the area is a·x), so the fitted quadratic is the same.
  const double a = 2e-7, b = 0.05;
  const sched::ChunkCostModel m({true, 0.0, b - a, 0.0, 2 * a}, {});
  sched::PlanOptions o;
  o.prompt_tokens = 131072;
  o.max_chunk = 32768;
  o.min_chunk = 4096;
  const auto plan = sched::upstream_plan(m, o, 128, 1.0);
  std::vector<int64_t> chunks;
  for (const auto& c : plan.chunks) chunks.push_back(c.tokens);
  EXPECT_EQ(chunks, (std::vector<int64_t>{32768, 27136, 23680, 21248, 19456, 6784}));
  EXPECT_NEAR(plan.chunk_ms, 1853.1, 0.1);
}

}  // namespace
