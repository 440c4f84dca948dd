// Tensor and expert parallelism at the model level: every rank loads only its shard, the ranks
// (threads here, one shared-memory group) run the same sequences, and their logits and MTP draft
// logits must be within 1e-4 of TP=1. The parameters cover every weight kind: BF16, FP8 with
// 128x128 scale blocks that the shard boundaries cut, F32 without q_lora (q_proj), dense MLPs,
// experts sliced (TP) or whole (EP), shared experts, vocabulary-parallel embedding and lm_head
// (with a vocabulary that does not divide evenly), both attention forms, a 64-expert model
// with group-limited routing, and experts over data-parallel x tensor-parallel ranks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "dist/group_factory.h"
#include "model/checkpoint_writer.h"
#include "model/config.h"
#include "model/deepseek_v3.h"
#include "model/kv_cache.h"
#include "model/sequence_runner.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace {

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, double(std::abs(a[i] - b[i])));
  return worst;
}

// A 64-expert model (top-6 of 8 groups, 4 used), vocabulary 510: written once per process and
// removed when it exits.
const std::string& wide_moe_model() {
  static const std::string dir = [] {
    const std::string d =
        std::filesystem::temp_directory_path() / ("chunkpipe_tp_moe64_" + std::to_string(getpid()));
    auto base = model::load_model_config(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16");
    EXPECT_TRUE(base.ok());
    model::ModelConfig c = *base;
    c.vocab_size = 510;
    c.n_routed_experts = 64;
    c.num_experts_per_tok = 6;
    c.n_group = 8;
    c.topk_group = 4;
    c.num_hidden_layers = 3;
    const model::ModelWeights w = model::random_weights(c, tensor::DType::kBF16, 11);
    std::filesystem::create_directories(d);
    EXPECT_TRUE(
        model::write_safetensors_checkpoint(d, model::weights_to_tensors(c, w, false), 2).ok());
    std::ofstream(d + "/config.json") << model::config_to_json(c).dump(2);
    return d;
  }();
  static const struct RemovedAtExit {
    ~RemovedAtExit() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } removed_at_exit;
  return dir;
}

struct Case {
  std::string model;  // under tests/data, or "moe64"
  int tp;
  bool ep;
  model::AttentionMode mode;
  int64_t chunk;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string m = c.model;
  for (char& ch : m)
    if (ch == '-') ch = '_';
  return m + "_tp" + std::to_string(c.tp) + (c.ep ? "_ep" : "") +
         (c.mode == model::AttentionMode::kAbsorbed ? "_absorbed" : "_expanded") + "_chunk" +
         std::to_string(c.chunk);
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " tp=" << c.tp << (c.ep ? " ep" : "") << " chunk=" << c.chunk;
}

class TensorParallelTest : public testing::TestWithParam<Case> {};

TEST_P(TensorParallelTest, LogitsMatchOneRank) {
  const Case& tc = GetParam();
  const std::string dir = tc.model == "moe64"
                              ? wide_moe_model()
                              : std::string(CHUNKPIPE_TEST_DATA_DIR) + "/" + tc.model;
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(int32_t((i * 37 + 11) % 500));
  model::SequenceLogitsOptions so;
  so.chunk_size = tc.chunk;
  so.all_logits = true;
  so.mtp = true;
  so.mtp_next_token = 5;

  auto whole = model::DeepseekV3Model::load(dir);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  (*whole)->set_attention_mode(tc.mode);
  common::ThreadPool pool(1);
  auto want = model::compute_sequence_logits(**whole, ids, so, pool);
  ASSERT_TRUE(want.ok()) << want.status().message();

  auto server = dist::StoreServer::start("127.0.0.1", 0);  // a free port
  const int port = server.ok() ? (*server)->port() : 0;
  ASSERT_TRUE(server.ok());
  std::mutex mu;
  std::vector<model::SequenceLogits> got(static_cast<size_t>(tc.tp));
  std::vector<std::thread> ranks;
  for (int r = 0; r < tc.tp; ++r) {
    ranks.emplace_back([&, r] {
      model::LoadOptions lo;
      lo.tp = {r, tc.tp, tc.ep};
      auto shard = model::DeepseekV3Model::load(dir, lo);
      ASSERT_TRUE(shard.ok()) << shard.status().message();
      dist::StoreClient store("127.0.0.1", port, 30);
      dist::GroupSpec spec("tp", r, tc.tp);
      spec.timeout_s = 60;
      auto group = dist::make_process_group(store, spec);
      ASSERT_TRUE(group.ok()) << group.status().message();
      (*shard)->set_process_group(group->get());
      (*shard)->set_attention_mode(tc.mode);
      common::ThreadPool rank_pool(1);
      auto out = model::compute_sequence_logits(**shard, ids, so, rank_pool);
      ASSERT_TRUE(out.ok()) << out.status().message();
      if (tc.ep && r == 0) {
        const model::MoeTimes& t = (*shard)->moe_times();
        EXPECT_GT(t.layers, 0);
      }
      std::lock_guard<std::mutex> lock(mu);
      got[static_cast<size_t>(r)] = std::move(*out);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < tc.tp; ++r) {
    const model::SequenceLogits& g = got[static_cast<size_t>(r)];
    EXPECT_LT(max_diff(g.all_logits, want->all_logits), 1e-4) << "rank " << r;
    EXPECT_LT(max_diff(g.mtp_draft_logits, want->mtp_draft_logits), 1e-4) << "rank " << r;
    EXPECT_EQ(g.all_logits, got[0].all_logits) << "rank " << r << " differs from rank 0";
  }
}

using model::AttentionMode;
INSTANTIATE_TEST_SUITE_P(
    Shards, TensorParallelTest,
    testing::Values(Case{"tiny-bf16", 2, false, AttentionMode::kExpanded, 13},
                    Case{"tiny-bf16", 2, true, AttentionMode::kAbsorbed, 7},
                    Case{"tiny-bf16", 4, false, AttentionMode::kAbsorbed, 40},
                    Case{"tiny-bf16", 4, true, AttentionMode::kExpanded, 9},
                    Case{"tiny-fp8", 2, false, AttentionMode::kExpanded, 40},
                    Case{"tiny-fp8", 2, true, AttentionMode::kAbsorbed, 11},
                    Case{"tiny-fp8", 4, false, AttentionMode::kExpanded, 7},
                    Case{"tiny-noq-f32", 2, false, AttentionMode::kAbsorbed, 13},
                    Case{"tiny-noq-f32", 4, true, AttentionMode::kExpanded, 40},
                    Case{"moe64", 2, true, AttentionMode::kExpanded, 13},
                    Case{"moe64", 4, true, AttentionMode::kAbsorbed, 7},
                    Case{"moe64", 2, false, AttentionMode::kAbsorbed, 40}),
    case_name);

// PP=2 x TP=2: two stages of two ranks each, the hidden state handed from stage 0's rank 0
// to stage 1, chunk by chunk (with and without expert parallelism).
TEST(PipelineTensorParallelTest, TwoStagesOfTwoRanksMatchOneRank) {
  const std::string dir = std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-fp8";
  for (const bool ep : {false, true}) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) ids.push_back(int32_t((i * 53 + 5) % 500));
    auto whole = model::DeepseekV3Model::load(dir);
    ASSERT_TRUE(whole.ok());
    common::ThreadPool pool(1);
    model::SequenceLogitsOptions so;
    so.all_logits = true;
    so.chunk_size = 13;
    auto want = model::compute_sequence_logits(**whole, ids, so, pool);
    ASSERT_TRUE(want.ok());
    const model::ModelConfig& c = (*whole)->config();
    const int64_t H = c.hidden_size, V = c.vocab_size;

    auto server = dist::StoreServer::start("127.0.0.1", 0);  // a free port
    const int port = server.ok() ? (*server)->port() : 0;
    ASSERT_TRUE(server.ok());
    // ranks[s * 2 + r]: its model slice, group, cache and pool.
    struct Rank {
      std::unique_ptr<model::DeepseekV3Model> model;
      std::unique_ptr<dist::ProcessGroup> group;
      std::unique_ptr<model::LatentKvCache> cache;
      std::unique_ptr<common::ThreadPool> pool;
    };
    std::vector<Rank> ranks(4);
    auto on_stage = [&](int s, const std::function<void(Rank&)>& body) {
      std::vector<std::thread> t;
      for (int r = 0; r < 2; ++r) t.emplace_back([&, r] { body(ranks[size_t(s * 2 + r)]); });
      for (auto& x : t) x.join();
    };
    std::vector<std::thread> setup;
    for (int i = 0; i < 4; ++i) {
      setup.emplace_back([&, i] {
        const int s = i / 2, r = i % 2;
        model::LoadOptions lo;
        lo.layer_begin = s * 2;
        lo.layer_end = s * 2 + 2;
        lo.load_embedding = s == 0;
        lo.load_head = s == 1;
        lo.load_mtp = false;
        lo.tp = {r, 2, ep};
        auto m = model::DeepseekV3Model::load(dir, lo);
        ASSERT_TRUE(m.ok()) << m.status().message();
        dist::StoreClient store("127.0.0.1", port, 30);
        dist::GroupSpec spec("tp.stage" + std::to_string(s), r, 2);
        auto g = dist::make_process_group(store, spec);
        ASSERT_TRUE(g.ok()) << g.status().message();
        Rank& me = ranks[size_t(i)];
        me.model = std::move(*m);
        me.group = std::move(*g);
        me.model->set_process_group(me.group.get());
        me.cache = std::make_unique<model::LatentKvCache>(c.num_total_layers(), s * 2, s * 2 + 2, 4,
                                                          16, c.kv_cache_row_dim());
        me.pool = std::make_unique<common::ThreadPool>(1);
      });
    }
    for (auto& t : setup) t.join();
    ASSERT_TRUE(ranks[3].model != nullptr);
    const std::vector<int32_t> table = {0, 1, 2, 3};
    std::vector<float> got(size_t(40 * V));
    for (int64_t start = 0; start < 40; start += 13) {
      const int64_t n = std::min<int64_t>(13, 40 - start);
      model::ForwardBatch batch;
      batch.sequences.push_back({std::span<const int32_t>(ids.data() + start, n), start, table});
      std::vector<float> handoff;
      on_stage(0, [&](Rank& me) {
        std::vector<float> hidden(size_t(n * H));
        ASSERT_TRUE(me.model->embed(batch, hidden.data()).ok());
        ASSERT_TRUE(me.model->run_layers(batch, 0, 2, hidden.data(), *me.cache, *me.pool).ok());
        if (me.group->rank() == 0) handoff = hidden;
      });
      on_stage(1, [&](Rank& me) {
        std::vector<float> hidden = handoff;
        ASSERT_TRUE(me.model->run_layers(batch, 2, 4, hidden.data(), *me.cache, *me.pool).ok());
        me.model->final_norm(hidden.data(), n, hidden.data());
        std::vector<float> logits(size_t(n * V));
        ASSERT_TRUE(me.model->compute_logits(hidden.data(), n, logits.data(), *me.pool).ok());
        if (me.group->rank() == 0) std::copy(logits.begin(), logits.end(), got.begin() + start * V);
      });
    }
    EXPECT_LT(max_diff(got, want->all_logits), 1e-4) << (ep ? "with EP" : "without EP");
  }
}

// lmhead_tensor_parallel_size: the heads split over a group of data-parallel ranks, each with
// its own sequence (of its own length); each rank's logits and MTP draft logits must equal
// TP=1's on its own sequence.
TEST(LmHeadParallelTest, EachRankGetsTheLogitsOfItsOwnRows) {
  const std::string dir = wide_moe_model();  // vocabulary 510: a padded last shard
  for (const int g : {2, 4}) {
    auto whole = model::DeepseekV3Model::load(dir);
    ASSERT_TRUE(whole.ok()) << whole.status().message();
    common::ThreadPool pool(1);
    auto sequence = [](int r) {
      std::vector<int32_t> ids;
      for (int i = 0; i < 9 + 7 * r; ++i) ids.push_back(int32_t((i * 31 + r * 101 + 7) % 509));
      return ids;
    };
    model::SequenceLogitsOptions so;
    so.all_logits = true;
    so.mtp = true;
    so.mtp_next_token = 3;
    std::vector<model::SequenceLogits> wants;
    for (int r = 0; r < g; ++r) {
      auto want = model::compute_sequence_logits(**whole, sequence(r), so, pool);
      ASSERT_TRUE(want.ok());
      wants.push_back(std::move(*want));
    }
    auto server = dist::StoreServer::start("127.0.0.1", 0);  // a free port
    const int port = server.ok() ? (*server)->port() : 0;
    ASSERT_TRUE(server.ok());
    std::vector<std::thread> ranks;
    for (int r = 0; r < g; ++r) {
      ranks.emplace_back([&, r] {
        const model::SequenceLogits* want = &wants[static_cast<size_t>(r)];
        model::LoadOptions lo;
        lo.lmhead_tp = {r, g};
        auto shard = model::DeepseekV3Model::load(dir, lo);
        ASSERT_TRUE(shard.ok()) << shard.status().message();
        EXPECT_EQ((*shard)->weights().lm_head.rows(), (510 + g - 1) / g);
        dist::StoreClient store("127.0.0.1", port, 30);
        dist::GroupSpec spec("lmhead", r, g);
        auto group = dist::make_process_group(store, spec);
        ASSERT_TRUE(group.ok()) << group.status().message();
        (*shard)->set_lmhead_group(group->get());
        common::ThreadPool rank_pool(1);
        auto got = model::compute_sequence_logits(**shard, sequence(r), so, rank_pool);
        ASSERT_TRUE(got.ok()) << got.status().message();
        EXPECT_LT(max_diff(got->all_logits, want->all_logits), 1e-4) << "rank " << r << " of " << g;
        EXPECT_LT(max_diff(got->mtp_draft_logits, want->mtp_draft_logits), 1e-4) << "rank " << r;
      });
    }
    for (auto& t : ranks) t.join();
  }
}

// Experts over data-parallel ranks, vLLM's EP world of DP x TP: each DP rank runs its own
// sequence (of its own length) through its TP group, and the routed experts are split over all
// dp·tp ranks (rank dp_rank·tp + tp_rank). Each rank's logits and MTP draft logits must equal
// TP=1's on its DP rank's sequence.
TEST(DataParallelExpertsTest, EachDataParallelRankGetsTheLogitsOfItsOwnSequence) {
  const std::string dir = wide_moe_model();  // 64 experts
  auto whole = model::DeepseekV3Model::load(dir);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  common::ThreadPool pool(1);
  auto sequence = [](int d) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 11 + 6 * d; ++i) ids.push_back(int32_t((i * 29 + d * 97 + 5) % 509));
    return ids;
  };
  model::SequenceLogitsOptions so;
  so.all_logits = true;
  so.mtp = true;
  so.mtp_next_token = 4;
  for (const auto& [dp, tp] : std::vector<std::pair<int, int>>{{2, 1}, {2, 2}, {4, 1}}) {
    std::vector<model::SequenceLogits> wants;
    for (int d = 0; d < dp; ++d) {
      auto want = model::compute_sequence_logits(**whole, sequence(d), so, pool);
      ASSERT_TRUE(want.ok());
      wants.push_back(std::move(*want));
    }
    auto server = dist::StoreServer::start("127.0.0.1", 0);  // a free port
    ASSERT_TRUE(server.ok());
    const int port = (*server)->port();
    const std::string layout = "dp " + std::to_string(dp) + " x tp " + std::to_string(tp);
    std::vector<std::thread> ranks;
    for (int d = 0; d < dp; ++d) {
      for (int t = 0; t < tp; ++t) {
        ranks.emplace_back([&, d, t] {
          const int ep_rank = d * tp + t, ep_size = dp * tp;
          model::LoadOptions lo;
          lo.tp = {t, tp, true};
          lo.dp_experts = {ep_rank, ep_size};
          auto shard = model::DeepseekV3Model::load(dir, lo);
          ASSERT_TRUE(shard.ok()) << shard.status().message();
          const model::MoeWeights& moe = *(*shard)->weights().layers.back().moe;
          EXPECT_EQ(moe.experts.size(), size_t(64 / ep_size)) << layout;
          EXPECT_EQ(moe.first_expert, ep_rank * 64 / ep_size) << layout;
          dist::StoreClient store("127.0.0.1", port, 30);
          std::unique_ptr<dist::ProcessGroup> tp_group;
          if (tp > 1) {
            auto g = dist::make_process_group(store, {"tp.dp" + std::to_string(d), t, tp});
            ASSERT_TRUE(g.ok()) << g.status().message();
            tp_group = std::move(g).value();
            (*shard)->set_process_group(tp_group.get());
          }
          auto ep_group = dist::make_process_group(store, {"ep", ep_rank, ep_size});
          ASSERT_TRUE(ep_group.ok()) << ep_group.status().message();
          (*shard)->set_expert_group(ep_group->get());
          common::ThreadPool rank_pool(1);
          auto got = model::compute_sequence_logits(**shard, sequence(d), so, rank_pool);
          ASSERT_TRUE(got.ok()) << got.status().message();
          const model::SequenceLogits& want = wants[size_t(d)];
          EXPECT_LT(max_diff(got->all_logits, want.all_logits), 1e-4)
              << layout << " rank " << ep_rank;
          EXPECT_LT(max_diff(got->mtp_draft_logits, want.mtp_draft_logits), 1e-4)
              << layout << " rank " << ep_rank;
          EXPECT_GT((*shard)->moe_times().layers, 0);
        });
      }
    }
    for (auto& t : ranks) t.join();
  }
}

TEST(TensorParallelConfigTest, FinegrainedTpIsValidatedAsUpstream) {
  auto c = model::load_model_config(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(model::validate_finegrained_tp(*c, 0, 1).ok());
  EXPECT_TRUE(model::validate_finegrained_tp(*c, 16, 32).ok());
  const common::Status uneven = model::validate_finegrained_tp(*c, 16, 1);
  ASSERT_FALSE(uneven.ok());
  EXPECT_NE(uneven.message().find("finegrained tp sizes must divide by data_parallel_size"),
            std::string::npos)
      << uneven.message();
  model::ModelConfig dense = *c;
  dense.n_routed_experts = 0;
  EXPECT_NE(model::validate_finegrained_tp(dense, 2, 2).message().find("only for MOE models"),
            std::string::npos);
}

TEST(TensorParallelConfigTest, ASplitThatDoesNotDivideNamesTheDimension) {
  auto c = model::load_model_config(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16");
  ASSERT_TRUE(c.ok());
  const common::Status heads = model::validate_tensor_parallel(*c, {0, 3, false});
  ASSERT_FALSE(heads.ok());
  EXPECT_NE(heads.message().find("num_attention_heads (4)"), std::string::npos) << heads.message();
  model::ModelConfig odd = *c;
  odd.num_attention_heads = 8;
  odd.n_routed_experts = 6;
  const common::Status experts = model::validate_tensor_parallel(odd, {0, 4, true});
  ASSERT_FALSE(experts.ok());
  EXPECT_NE(experts.message().find("n_routed_experts"), std::string::npos) << experts.message();
  EXPECT_TRUE(model::validate_tensor_parallel(*c, {1, 2, true}).ok());
  // Experts over DP x TP: the size is the product, and the TP ranks must hold whole experts.
  model::ModelConfig wide = *c;
  wide.n_routed_experts = 12;
  EXPECT_TRUE(model::validate_dp_experts(wide, {0, 4}, {0, 2, true}).ok());
  const common::Status product = model::validate_dp_experts(wide, {0, 8}, {0, 2, true});
  ASSERT_FALSE(product.ok());
  EXPECT_NE(product.message().find("expert-parallel size 8 (--data-parallel-size x "
                                   "--tensor-parallel-size 2)"),
            std::string::npos)
      << product.message();
  EXPECT_FALSE(model::validate_dp_experts(wide, {0, 4}, {0, 2, false}).ok());
}

}  // namespace
