// The tensors of a random-weight DeepSeek-V3 checkpoint, generated piece by piece as the file is
// written (TensorSource), so that V3's real dimensions stream to disk in bounded memory: linears
// FP8 e4m3 with power-of-two 128x128 weight_scale_inv blocks (or BF16), embeddings, head, norms
// and the router BF16, the correction bias F32. Every value is a function of (seed, tensor,
// row, column): the same files whatever the thread count. Thread-safe to produce one tensor at a
// time; the pool is used inside each piece.
#pragma once

#include <cstdint>
#include <vector>

#include "common/thread_pool.h"
#include "model/checkpoint_writer.h"
#include "model/config.h"

namespace model {

// The HF names and shapes of `config` (main layers and num_nextn_predict_layers MTP layers, which
// share the main embedding and head). Linear weights are zero-mean with standard deviation
// 1/sqrt(fan-in) up to the power-of-two scale blocks; `pool` must outlive the sources.
std::vector<TensorSource> random_checkpoint_tensors(const ModelConfig& config, uint64_t seed,
                                                    bool fp8, common::ThreadPool& pool);

}  // namespace model
