// FP8 checkpoints load with their linears kept as FP8 codes and block scales (a quarter of the
// F32 bytes), give the logits of the old dequantize-at-load path bit for bit, on every kernel
// path, whole and sharded over tensor-parallel ranks; a NaN code fails the load by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../ops/test_util.h"
#include "common/thread_pool.h"
#include "kernels/cpu_features.h"
#include "model/deepseek_v3.h"
#include "model/safetensors.h"
#include "model/sequence_runner.h"
#include "model/weight_census.h"

namespace {

const std::string kFp8Dir = std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-fp8";

common::ThreadPool& pool() {
  static common::ThreadPool p(2);
  return p;
}

std::unique_ptr<model::DeepseekV3Model> load(bool dequantize) {
  model::LoadOptions o;
  o.fp8_dequantize = dequantize;
  auto m = model::DeepseekV3Model::load(kFp8Dir, o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<float> all_logits(model::DeepseekV3Model& m, int64_t chunk) {
  model::SequenceLogitsOptions opts;
  opts.all_logits = true;
  opts.mtp = true;
  opts.chunk_size = chunk;
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 37 + 11) % int(m.config().vocab_size));
  auto r = model::compute_sequence_logits(m, ids, opts, pool());
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return {};
  std::vector<float> out = r->all_logits;
  out.insert(out.end(), r->mtp_draft_logits.begin(), r->mtp_draft_logits.end());
  return out;
}

TEST(Fp8WeightsTest, LinearsStayFp8AndTakeAQuarterOfTheBytes) {
  auto kept = load(false), widened = load(true);
  ASSERT_TRUE(kept && widened);
  const model::DecoderLayerWeights& l = kept->weights().layers[0];
  EXPECT_EQ(l.attn.q_a_proj.dtype(), tensor::DType::kF8E4M3);
  EXPECT_EQ(l.attn.o_proj.dtype(), tensor::DType::kF8E4M3);
  EXPECT_EQ(widened->weights().layers[0].attn.o_proj.dtype(), tensor::DType::kF32);
  const model::WeightCensus a = model::weight_census(kept->weights());
  const model::WeightCensus b = model::weight_census(widened->weights());
  EXPECT_GT(a.fp8_bytes, 0);
  EXPECT_EQ(b.fp8_bytes, 0);
  // Each FP8 byte (and its scale share) replaces four F32 bytes.
  EXPECT_NEAR(double(b.f32_bytes - a.f32_bytes), 4.0 * double(a.fp8_bytes), 0.01 * b.f32_bytes);
  EXPECT_NE(model::census_line(a).find("FP8"), std::string::npos);
}

TEST(Fp8WeightsTest, LogitsMatchTheDequantizedPathOnEveryKernelPath) {
  auto kept = load(false), widened = load(true);
  ASSERT_TRUE(kept && widened);
  for (const auto& path : testutil::supported_isa_paths()) {
    kernels::ScopedCpuFeatures isa(path.features);
    for (int64_t chunk : {0, 7}) {
      const std::vector<float> want = all_logits(*widened, chunk), got = all_logits(*kept, chunk);
      ASSERT_EQ(want.size(), got.size());
      ASSERT_FALSE(want.empty());
      // FP8 runs the AVX2 kernels' sums on every machine: the same bits as the dequantized
      // weights there, and within rounding of the AVX-512 F32 kernels.
      if (std::string(path.name) == "avx2") {
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << path.name << " chunk " << chunk;
      }
      // Relative to the largest logit (a logit near zero has no relative error of its own).
      double diff = 0, scale = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        diff = std::max(diff, std::abs(double(got[i]) - want[i]));
        scale = std::max(scale, std::abs(double(want[i])));
      }
      EXPECT_LT(diff / scale, 1e-5) << path.name << " chunk " << chunk << ": " << diff;
    }
  }
}

TEST(Fp8WeightsTest, TensorParallelShardsKeepTheirScaleBlocks) {
  // Each rank's shard alone: rows cut on block boundaries stay FP8, and its values equal the
  // dequantized shard's.
  for (int rank = 0; rank < 2; ++rank) {
    model::LoadOptions o;
    o.tp = {rank, 2, false};
    auto ck = model::Checkpoint::open(kFp8Dir);
    ASSERT_TRUE(ck.ok());
    auto cfg = model::load_model_config(kFp8Dir);
    ASSERT_TRUE(cfg.ok());
    auto kept = model::load_weights(**ck, *cfg, o);
    o.fp8_dequantize = true;
    auto widened = model::load_weights(**ck, *cfg, o);
    ASSERT_TRUE(kept.ok() && widened.ok());
    const auto& a = kept->layers[0].attn;
    const auto& b = widened->layers[0].attn;
    // 4 heads of 48 query rows and 32 value columns: rank 0's slices start on a block, rank 1's
    // (row 96, column 64) inside one, so they fall back to F32. The dense MLP's 256 columns
    // split into whole 128-blocks on both ranks.
    const tensor::DType attn_dtype = rank == 0 ? tensor::DType::kF8E4M3 : tensor::DType::kF32;
    EXPECT_EQ(a.q_b_proj.dtype(), attn_dtype) << "rank " << rank;
    EXPECT_EQ(a.o_proj.dtype(), attn_dtype) << "rank " << rank;
    ASSERT_TRUE(kept->layers[0].dense_mlp.has_value());
    const model::MlpWeights& mk = *kept->layers[0].dense_mlp;
    const model::MlpWeights& mw = *widened->layers[0].dense_mlp;
    EXPECT_EQ(mk.gate_up.dtype(), tensor::DType::kF8E4M3) << "rank " << rank;
    EXPECT_EQ(mk.down.dtype(), tensor::DType::kF8E4M3) << "rank " << rank;
    for (auto [x, y] : {std::pair{&a.q_b_proj, &b.q_b_proj}, std::pair{&a.o_proj, &b.o_proj},
                        std::pair{&mk.gate_up, &mw.gate_up}, std::pair{&mk.down, &mw.down}}) {
      ASSERT_EQ(x->rows(), y->rows());
      ASSERT_EQ(x->cols(), y->cols());
      for (int64_t r = 0; r < x->rows(); r += 5)
        for (int64_t c = 0; c < x->cols(); c += 3)
          ASSERT_EQ(x->view().at(r, c), y->view().at(r, c)) << "rank " << rank;
    }
  }
}

TEST(Fp8WeightsTest, ANanCodeFailsTheLoadByName) {
  // A copy of the fixture whose first FP8 weight has one NaN code.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("fp8_nan_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::copy(kFp8Dir, dir);
  // Layer 0's o_proj, found through the index and its file's header (data_offsets).
  const std::string name = "model.layers.0.self_attn.o_proj.weight";
  std::ifstream index_file(dir / "model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(index_file);
  const std::filesystem::path file = dir / index["weight_map"][name].get<std::string>();
  int64_t offset = -1;
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_len = 0;
    f.read(reinterpret_cast<char*>(&header_len), 8);
    std::string header(header_len, '\0');
    f.read(header.data(), std::streamsize(header_len));
    const nlohmann::json h = nlohmann::json::parse(header);
    ASSERT_EQ(h[name]["dtype"], "F8_E4M3");
    offset = 8 + int64_t(header_len) + h[name]["data_offsets"][0].get<int64_t>() + 3;
    f.seekp(offset);
    f.put(char(0x7f));
  }
  ASSERT_GE(offset, 0);
  model::LoadOptions o;
  auto m = model::DeepseekV3Model::load(dir.string(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find(name), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("NaN"), std::string::npos) << m.status().message();
  std::filesystem::remove_all(dir);
}

}  // namespace
