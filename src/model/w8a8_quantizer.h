// Writes a checkpoint in msmodelslim's W8A8 layout (w8a8-mtp.md 1b-1c, 1h) from a BF16, F32
// or FP8 one: `chunkpipe quantize SRC DST --w8a8`. Attention projections W8A8_DYNAMIC, or
// static W8A8 calibrated on a forward over deterministic token ids; dense MLP, shared and
// routed experts W8A8_DYNAMIC (the MTP layer too, msmodelslim's "mix"); embeddings, norms,
// kv_b_proj, the router, eh_proj and lm_head FLOAT. The whole model is held in memory.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"

namespace model {

struct W8A8QuantizeOptions {
  bool static_attention = false;     // q_a, q_b (or q), kv_a, o_proj as static W8A8
  int64_t calibration_tokens = 256;  // tokens of the calibration forward (static only)
  int num_shards = 1;
};

// Quantizes every projection and MLP of `weights` (decoder and MTP layers) to W8A8_DYNAMIC in
// place; the attention projections named in `static_ranges` (weight name -> observed input
// min, max) become static W8A8 instead.
struct ActivationRange {
  float min = 0, max = 0;
};
void quantize_weights_w8a8(ModelWeights& weights, const ModelConfig& config,
                           const std::map<std::string, ActivationRange>& static_ranges);

common::Status write_w8a8_checkpoint(const std::string& src_dir, const std::string& dst_dir,
                                     const W8A8QuantizeOptions& options, common::ThreadPool& pool);

}  // namespace model
