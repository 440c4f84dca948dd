// Corrupt or inconsistent checkpoints: each gives one line naming the file and the tensor.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/deepseek_v3.h"

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
