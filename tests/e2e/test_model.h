// Test helper: the small random-weight model the serve tests run (made once per test process
// with `chunkpipe make-model`) and the serve flags they share.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "server_process.h"

namespace e2e {

// Removes `dir` when the test process exits: each made model is tens of megabytes.
inline void remove_at_exit(const std::string& dir) {
  static struct Made {
    std::vector<std::string> dirs;
    ~Made() {
      std::error_code ec;
      for (const std::string& d : dirs) std::filesystem::remove_all(d, ec);
    }
  } made;
  made.dirs.push_back(dir);
}

// A random-weight model made once per process and tag: `heads` attention heads over `layers`
// layers, 8 experts (top-2 of 2 groups). It is removed when the process exits.
inline std::string make_model(const std::string& tag, int heads, int layers, int seed) {
  const std::string d = std::filesystem::temp_directory_path() /
                        ("chunkpipe_" + tag + "_" + std::to_string(getpid()));
  const int rc = run_chunkpipe({"make-model",     d,
                                "--hidden",       "64",
                                "--layers",       std::to_string(layers),
                                "--heads",        std::to_string(heads),
                                "--q-lora-rank",  "32",
                                "--kv-lora-rank", "32",
                                "--qk-nope",      "16",
                                "--qk-rope",      "16",
                                "--v-head",       "16",
                                "--experts",      "8",
                                "--top-k",        "2",
                                "--n-group",      "2",
                                "--topk-group",   "1",
                                "--inter",        "128",
                                "--moe-inter",    "32",
                                "--seed",         std::to_string(seed)});
  EXPECT_EQ(rc, 0) << "make-model failed";
  remove_at_exit(d);
  return d;
}

inline std::string model_dir() {
  static const std::string dir = make_model("e2e_model", 2, 2, 7);
  return dir;
}

inline std::vector<std::string> base_flags() {
  return {
      "--served-model-name",      "deepseek_v3", "--max-model-len", "512", "--block-size",   "16",
      "--kv-cache-memory",        "16000000",    "--threads",       "1",   "--max-num-seqs", "64",
      "--max-num-batched-tokens", "512"};
}

}  // namespace e2e
