// Internal to kernels: the per-ISA integer dot-product bodies behind linear_int8 and the one
// epilogue they share. Each computes outputs [n_begin, n_end) for all m quantized rows.
// Thread-safe for disjoint output ranges.
#pragma once

#include <cstdint>

#include "tensor/weight_matrix.h"

namespace kernels::detail {

// y[t, n] from the exact integer dot product of token t and weight row n.
inline float int8_output(int64_t dot, int64_t n, float act_scale, const tensor::Int8Quant& q) {
  const int64_t bias = q.row_bias ? q.row_bias[n] : 0;
  return static_cast<float>(dot + bias) * act_scale * q.row_scale[n];
}

using Int8Range = void (*)(const int8_t* xq, const float* act_scale, int64_t m,
                           const tensor::WeightView& w, float* y, int64_t ldy, int64_t n_begin,
                           int64_t n_end);

void int8_range_avx2(const int8_t* xq, const float* act_scale, int64_t m,
                     const tensor::WeightView& w, float* y, int64_t ldy, int64_t n_begin,
                     int64_t n_end);
void int8_range_avx_vnni(const int8_t* xq, const float* act_scale, int64_t m,
                         const tensor::WeightView& w, float* y, int64_t ldy, int64_t n_begin,
                         int64_t n_end);
void int8_range_avx512_vnni(const int8_t* xq, const float* act_scale, int64_t m,
                            const tensor::WeightView& w, float* y, int64_t ldy, int64_t n_begin,
                            int64_t n_end);

// Tokens from which the AVX512-VNNI tiles (16-token vectors, no horizontal sums) beat its dot
// products: one core of a Zen 5 ran them at 0.9x at 16-24 tokens (a tile of one or two token
// vectors has too few accumulators), 1.0-1.2x from 32 at K 512-2048, 1.7x at K 7168.
inline constexpr int64_t kInt8TilesMinTokens = 32;
// AVX512-VNNI tiles for many tokens (int8_tiles_avx512_vnni.cpp; call only when
// cpu_features().avx512_vnni). Quantized rows [16 · block_begin, 16 · block_end) of xq [m, k]
// packed as blocks of [ceil(k / 4)][16 tokens] 32-bit quad words, each byte offset by 128 and
// bytes past k (and rows at or past m) zero; block b at out + b · 16 · ceil(k / 4).
void pack_int8_quads_avx512(const int8_t* xq, int64_t m, int64_t k, int64_t block_begin,
                            int64_t block_end, uint32_t* out);
// y (row stride ldy) for weight rows [n_begin, n_end) from the packed blocks.
void int8_tiles_range_avx512_vnni(const uint32_t* blocks, const float* act_scale, int64_t m,
                                  const tensor::WeightView& w, float* y, int64_t ldy,
                                  int64_t n_begin, int64_t n_end);

// AMX-INT8 (many tokens): xq padded to a multiple of 32 rows, each of kp bytes (K rounded up
// to 64, zeros after K). Call only when amx_tiles_usable(), which asks the OS for the tile
// state once per process.
bool amx_tiles_usable();
void int8_range_amx(const int8_t* xq, int64_t kp, const float* act_scale, int64_t m,
                    const tensor::WeightView& w, float* y, int64_t ldy, int64_t n_begin,
                    int64_t n_end);

}  // namespace kernels::detail
