// Memory planned before it is taken: the bytes a load will hold, predicted from a checkpoint's
// headers without reading its tensors, and the forward's scratch for a token budget, so that
// serve can refuse a model, length or batch that will not fit before it loads anything. Pure
// functions of their inputs (the checkpoint is only mapped); thread-safe.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weight_census.h"
#include "model/weights.h"

namespace model {

// The census that load_weights(checkpoint, config, options) produces, by the loader's rules:
// FP8 kept with its block scales, kv_b_proj and the router in F32 (kv_b_proj's absorbed copies
// beside it), BF16 as stored, F16 and 1-D tensors as F32, int8 (and int4, unpacked) with their
// per-row metadata. Whole layers only: a tensor-parallel shard is planned as 1/tp of its layers.
common::Result<WeightCensus> planned_weight_census(const Checkpoint& checkpoint,
                                                   const ModelConfig& config,
                                                   const LoadOptions& options);

struct ScratchInput {
  int64_t num_batched_tokens = 2048;  // the scheduler's token budget per step
  int64_t max_model_len = 4096;       // the longest context one sequence's attention reads
  int64_t max_num_seqs = 256;         // rows whose logits one step may sample
  int threads = 1;                    // forward threads (each keeps its own buffers)
};

// An upper estimate of the working memory one forward step takes beyond the weights and the KV
// cache: the token-sized activations of a layer, the routed experts' rows, the attention's
// per-thread context buffers and the logits. The buffers only grow, so this is their peak.
int64_t forward_scratch_bytes(const ModelConfig& config, const ScratchInput& in);

}  // namespace model
