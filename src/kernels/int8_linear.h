// W8A8 linear layers: y[M, N] = x[M, K] · Wq[N, K]ᵀ with int8 weights (tensor::Int8Quant) and
// activations quantized to int8 per token (dynamic) or with a fixed scale and offset (static).
// Integer dot products are exact on every path (AVX2 vpmaddwd, AVX-VNNI and AVX512-VNNI
// vpdpbusd), so all paths give bit-identical outputs. Thread-safe for distinct outputs.
#pragma once

#include <cstdint>

#include "common/thread_pool.h"
#include "tensor/weight_matrix.h"

namespace kernels {

// Quantizes rows of x [m, k] as `quant` says: xq [m, k] and each row's scale (1 when static).
void quantize_activations(const float* x, int64_t m, int64_t k, const tensor::Int8Quant& quant,
                          int8_t* xq, float* act_scale);

// y (row stride ldy) = dequant(quantize(x) · Wqᵀ); w.dtype must be kI8.
void linear_int8(const float* x, int64_t m, const tensor::WeightView& w, float* y, int64_t ldy,
                 common::ThreadPool& pool);

// Naive reference: the same quantization, int64 dot products, the same epilogue.
void linear_int8_reference(const float* x, int64_t m, const tensor::WeightView& w, float* y,
                           int64_t ldy);
// Dequantize-then-float reference: activations quantized by the same rule and dequantized
// ((xq - offset)·input_scale, or xq·token scale), weights dequantized (Wq·weight_scale, or
// Wq·deq_scale/input_scale), products summed in double, plus the float bias a static layer's
// quant_bias encodes ((quant_bias + offset·Σ_k Wq)·deq_scale). Checks the format's algebra.
void linear_int8_dequant_reference(const float* x, int64_t m, const tensor::WeightView& w, float* y,
                                   int64_t ldy);

// Symmetric per-row quantization of f32 rows [rows, cols] (W8A8_DYNAMIC's weight rule):
// s = max|w|/127, Wq = clamp(round(w / s)). Fills `out` (dtype kI8) and calls finish_int8.
void quantize_weight_rows(const float* w, int64_t rows, int64_t cols, tensor::WeightMatrix& out);
// The same rule on an F32 or BF16 matrix, one row at a time (no f32 copy of the whole matrix):
// chunkpipe's optional int8 lm_head.
tensor::WeightMatrix quantize_weight_rows(const tensor::WeightView& w);

}  // namespace kernels
