// The bytes a loaded weight set holds, by storage dtype (FP8 and I8 with their scales, norms and
// biases as F32), and the line the startup log prints from them. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "model/weights.h"

namespace model {

struct WeightCensus {
  int64_t f32_bytes = 0, bf16_bytes = 0, fp8_bytes = 0, i8_bytes = 0;
  int64_t total() const { return f32_bytes + bf16_bytes + fp8_bytes + i8_bytes; }
};

WeightCensus weight_census(const ModelWeights& weights);
// "weights 1.23 GiB: FP8 0.80 GiB, BF16 0.40 GiB, F32 0.03 GiB" (dtypes holding nothing left out).
std::string census_line(const WeightCensus& census);
// "1.234 GiB".
std::string gib_text(int64_t bytes);

}  // namespace model
