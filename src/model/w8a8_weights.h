// Reading msmodelslim W8A8 / W4A8 linear weights (w8a8-mtp.md 1b, 1e) from a Checkpoint into
// kernel-ready I8 WeightMatrix objects, with the side tensors each type carries; every error
// names the tensor and its file. Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "model/quant_description.h"
#include "model/safetensors.h"
#include "tensor/weight_matrix.h"

namespace model {

// Rows [row_begin, row_end) and columns [col_begin, col_end) of the logical [rows, cols] weight
// (a TP shard); rows past `rows` up to row_end are zero (padded vocabulary shards).
struct Int8Part {
  int64_t row_begin = 0, row_end = 0, col_begin = 0, col_end = 0;
  bool with_bias = true;    // static quant_bias: only on TP rank 0 of a row-parallel layer
  bool mix_static = false;  // W8A8_MIX read as static W8A8 (a decode-only KV consumer)
};

// `weight_name` ends in "weight"; `type` is its description entry (not kFloat). The stored
// tensor is I8 [rows, cols], or [rows / 2, cols] of packed int4 pairs for W4A8_DYNAMIC.
common::Result<tensor::WeightMatrix> read_int8_linear(const Checkpoint& checkpoint,
                                                      const std::string& weight_name,
                                                      QuantType type, int64_t rows, int64_t cols,
                                                      const Int8Part& part);

// [a; b] of two I8 matrices with the same columns and activation quantization (gate_proj and
// up_proj fused); an error names `what` when they cannot be fused.
common::Result<tensor::WeightMatrix> concat_int8_rows(const tensor::WeightMatrix& a,
                                                      const tensor::WeightMatrix& b,
                                                      const std::string& what);

}  // namespace model
