// Corrupt or inconsistent checkpoints: each gives one line naming the file and the tensor; and
// the dtypes make-model writes for the matrices kept F32 in memory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/checkpoint_writer.h"
#include "model/deepseek_v3.h"
#include "tensor/dtype.h"

namespace {

namespace fs = std::filesystem;

class CheckpointErrorsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // A writable copy of tests/data/<fixture>.
  std::string copy_fixture(const std::string& fixture) {
    char tmpl[] = "/tmp/chunkpipe_ckpt_XXXXXX";
    dir_ = mkdtemp(tmpl);
    fs::copy(fs::path(CHUNKPIPE_TEST_DATA_DIR) / fixture, dir_, fs::copy_options::recursive);
    for (auto& e : fs::directory_iterator(dir_)) {
      fs::permissions(e.path(), fs::perms::owner_read | fs::perms::owner_write);
    }
    return dir_;
  }

  static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static void write(const std::string& path, const std::string& data) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
  }

  // Loads and returns the error message (fails the test if loading succeeds).
  static std::string load_error(const std::string& dir) {
    auto m = model::DeepseekV3Model::load(dir);
    EXPECT_FALSE(m.ok()) << "loading " << dir << " should fail";
    if (m.ok()) return "";
    const std::string msg = m.status().message();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "error must be one line: " << msg;
    std::printf("    error: %s\n", msg.c_str());
    return msg;
  }

  std::string dir_;
};

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST_F(CheckpointErrorsTest, IntactFixturesLoad) {
  for (const char* f : {"tiny-bf16", "tiny-fp8", "tiny-noq-f32"}) {
    auto m = model::DeepseekV3Model::load(fs::path(CHUNKPIPE_TEST_DATA_DIR) / f);
    EXPECT_TRUE(m.ok()) << f << ": " << m.status().message();
  }
}

TEST_F(CheckpointErrorsTest, TruncatedHeader) {
  auto d = copy_fixture("tiny-noq-f32");
  auto bytes = read(d + "/model.safetensors");
  write(d + "/model.safetensors", bytes.substr(0, 100));
  auto msg = load_error(d);
  EXPECT_CONTAINS(msg, "model.safetensors: truncated safetensors header");
  write(d + "/model.safetensors", bytes.substr(0, 5));
  EXPECT_CONTAINS(load_error(d), "model.safetensors: truncated safetensors header");
}

TEST_F(CheckpointErrorsTest, TruncatedData) {
  auto d = copy_fixture("tiny-noq-f32");
  auto bytes = read(d + "/model.safetensors");
  write(d + "/model.safetensors", bytes.substr(0, bytes.size() / 2));
  auto msg = load_error(d);
  EXPECT_CONTAINS(msg, "model.safetensors: tensor 'model.");
  EXPECT_CONTAINS(msg, "lies beyond the file's");
}

TEST_F(CheckpointErrorsTest, ShapeDisagreesWithConfig) {
  auto d = copy_fixture("tiny-noq-f32");
  auto cfg = nlohmann::json::parse(read(d + "/config.json"));
  cfg["intermediate_size"] = 320;
  write(d + "/config.json", cfg.dump());
  EXPECT_CONTAINS(load_error(d),
                  "model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape "
                  "[256, 128] but config.json implies [320, 128]");
}

TEST_F(CheckpointErrorsTest, MissingTensor) {
  auto d = copy_fixture("tiny-bf16");
  auto index = nlohmann::json::parse(read(d + "/model.safetensors.index.json"));
  index["weight_map"].erase("model.layers.1.self_attn.o_proj.weight");
  write(d + "/model.safetensors.index.json", index.dump());
  EXPECT_CONTAINS(load_error(d),
                  "model.safetensors.index.json: tensor 'model.layers.1.self_attn.o_proj.weight' "
                  "is missing");
}

TEST_F(CheckpointErrorsTest, MissingFp8Scale) {
  auto d = copy_fixture("tiny-fp8");
  auto index = nlohmann::json::parse(read(d + "/model.safetensors.index.json"));
  index["weight_map"].erase("model.layers.2.self_attn.kv_b_proj.weight_scale_inv");
  write(d + "/model.safetensors.index.json", index.dump());
  EXPECT_CONTAINS(load_error(d),
                  "tensor 'model.layers.2.self_attn.kv_b_proj.weight_scale_inv' is missing");
}

TEST_F(CheckpointErrorsTest, UnknownDtype) {
  auto d = copy_fixture("tiny-noq-f32");
  auto bytes = read(d + "/model.safetensors");
  const std::string key = "\"lm_head.weight\":{\"dtype\":\"F32\"";
  auto pos = bytes.find(key);
  ASSERT_NE(pos, std::string::npos) << "fixture header layout changed";
  bytes.replace(pos + key.size() - 4, 3, "Q4K");  // same length: the header stays valid
  write(d + "/model.safetensors", bytes);
  EXPECT_CONTAINS(
      load_error(d),
      "model.safetensors: tensor 'lm_head.weight' has unknown or unsupported dtype 'Q4K'");
}

TEST_F(CheckpointErrorsTest, MissingShard) {
  auto d = copy_fixture("tiny-bf16");
  fs::remove(d + "/model-00002-of-00002.safetensors");
  auto msg = load_error(d);
  EXPECT_CONTAINS(msg,
                  "model.safetensors.index.json: shard 'model-00002-of-00002.safetensors' (holding "
                  "tensor 'model.");
  EXPECT_CONTAINS(msg, "is missing");
}

TEST_F(CheckpointErrorsTest, MissingConfig) {
  auto d = copy_fixture("tiny-bf16");
  fs::remove(d + "/config.json");
  EXPECT_CONTAINS(load_error(d), "config.json: cannot open config.json");
}

}  // namespace

// Not an error case, but the other half of the same format: make-model's BF16 checkpoints store
// the matrices kept F32 in memory (kv_b_proj, the router) as BF16, as the Hugging Face release
// does, without changing a value; an F32 model keeps them F32.
TEST(CheckpointWriterTest, Bf16CheckpointStoresKvBProjAndRouterAsBf16Losslessly) {
  auto config = model::load_model_config(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16");
  ASSERT_TRUE(config.ok()) << config.status().message();
  for (tensor::DType dtype : {tensor::DType::kBF16, tensor::DType::kF32}) {
    const model::ModelWeights w = model::random_weights(*config, dtype, 3);
    const tensor::WeightMatrix& kv_b = w.layers[1].attn.kv_b_proj;
    ASSERT_EQ(kv_b.dtype(), tensor::DType::kF32);
    const std::vector<model::TensorToWrite> tensors = model::weights_to_tensors(*config, w, false);
    int checked = 0;
    for (const model::TensorToWrite& t : tensors) {
      const bool f32_in_memory = t.name == "model.layers.1.self_attn.kv_b_proj.weight" ||
                                 t.name == "model.layers.1.mlp.gate.weight";
      if (!f32_in_memory) continue;
      ++checked;
      EXPECT_EQ(t.dtype, dtype) << t.name;
      if (t.name.find("kv_b_proj") == std::string::npos) continue;
      const float* values = kv_b.view().f32();
      for (int64_t i = 0; i < kv_b.rows() * kv_b.cols(); ++i) {
        float stored;
        if (dtype == tensor::DType::kBF16) {
          uint16_t bits;
          std::memcpy(&bits, t.bytes.data() + 2 * i, 2);
          stored = tensor::bf16_to_f32(bits);
        } else {
          std::memcpy(&stored, t.bytes.data() + 4 * i, 4);
        }
        ASSERT_EQ(stored, values[i]) << "element " << i;
      }
    }
    EXPECT_EQ(checked, 2);
  }
}
