// Writes a DeepSeek-V3 checkpoint in Hugging Face layout: config.json, safetensors shards with
// model.safetensors.index.json, from a name -> tensor list. Used by `chunkpipe make-model`.
// Single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/config.h"
#include "model/weights.h"
#include "tensor/dtype.h"

namespace model {

struct TensorToWrite {
  std::string name;
  tensor::DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A tensor whose bytes are produced in order, piece by piece, as the file is written: a
// checkpoint far larger than memory streams through a buffer.
struct TensorSource {
  using Sink = std::function<void(const uint8_t* data, size_t bytes)>;
  std::string name;
  tensor::DType dtype;
  std::vector<int64_t> shape;
  size_t bytes = 0;
  std::function<void(const Sink&)> produce;  // calls the sink with `bytes` bytes in all
};

// Splits the tensors (sorted by name) into `num_shards` files of similar size, named
// `stem`.safetensors or `stem`-0000i-of-0000n.safetensors with `stem`.safetensors.index.json.
common::Status write_safetensors(const std::string& dir, std::vector<TensorSource> tensors,
                                 int num_shards, const std::string& stem = "model");

// The same for tensors held in memory.
common::Status write_safetensors_checkpoint(const std::string& dir,
                                            std::vector<TensorToWrite> tensors, int num_shards,
                                            const std::string& stem = "model");

// config.json for `config` (every field the loader reads), as HF writes it.
nlohmann::json config_to_json(const ModelConfig& config);

// The Hugging Face tensors of `weights` (with the MTP layers). Linear weights are stored in
// `dtype` (BF16 or F32) or, with fp8, as F8_E4M3 with 128x128 weight_scale_inv blocks; I8
// weights in msmodelslim's W8A8 layout with their side tensors.
std::vector<TensorToWrite> weights_to_tensors(const ModelConfig& config,
                                              const ModelWeights& weights, bool fp8);

}  // namespace model
