// Internal to kernels: the per-ISA bodies behind kernels::linear, each computing outputs
// [n_begin, n_end) of y = x · Wᵀ for all m rows. gemm.cpp picks one by cpu_features().
// Thread-safe for disjoint output ranges.
#pragma once

#include <cstdint>

#include "tensor/weight_matrix.h"

namespace kernels::detail {

// F32 or BF16 weights, f32 activations; weights streamed once per pair (AVX2) or quad
// (AVX-512) of activation rows.
void streaming_range_avx2(const float* x, int64_t m, const tensor::WeightView& w, float* y,
                          int64_t ldy, int64_t n_begin, int64_t n_end);
void streaming_range_avx512(const float* x, int64_t m, const tensor::WeightView& w, float* y,
                            int64_t ldy, int64_t n_begin, int64_t n_end);

}  // namespace kernels::detail
