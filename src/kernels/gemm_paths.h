// Internal to kernels: the per-ISA bodies behind kernels::linear, each computing outputs
// [n_begin, n_end) of y = x · Wᵀ for all m rows. gemm.cpp picks one by cpu_features().
// Thread-safe for disjoint output ranges.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/gemm.h"
#include "tensor/aligned_buffer.h"
#include "tensor/weight_matrix.h"

namespace kernels::detail {

// F32 or BF16 weights (and FP8 on AVX2 only, widened in registers: simd.h), f32 activations;
// weights streamed once per pair (AVX2) or quad (AVX-512) of activation rows.
void streaming_range_avx2(const float* x, int64_t m, const tensor::WeightView& w, float* y,
                          int64_t ldy, int64_t n_begin, int64_t n_end);
void streaming_range_avx512(const float* x, int64_t m, const tensor::WeightView& w, float* y,
                            int64_t ldy, int64_t n_begin, int64_t n_end);
// The AVX2 tiled kernel (gemm_tiled_avx2.cpp), each output the AVX2 streaming kernel's bits:
// x [m, k] packed in tiles of tiled_avx2_tile_rows() rows (tiled_avx2_packed_size floats;
// pack_tiled_avx2_rows packs tiles [tile_begin, tile_end)), then outputs [n_begin, n_end) of
// the rows of tiles [tile_begin, tile_end) from the packed rows (x itself for the K % 8 tail).
// Packs `lanes` (a multiple of 8) rows (F32, or BF16 when `bf16`; null rows pack as zeros) for
// the tiled kernels: value k' < k_end of row l goes to out[(offset[k' % 16] + k' / 16) · lanes +
// l], zero past k. Baseline code that the AVX-512 tiled kernel calls too.
void pack_subsum_lanes(const void* const* rows, bool bf16, int64_t lanes, int64_t k, int64_t k_end,
                       const int64_t* offset, float* out);
// The activations for the tiled kernels: tiles [tile_begin, tile_end) of kSubSumTileRows rows of
// x [m, k], each packed by pack_subsum_lanes as 8 lanes (the rows past a tile's 6, and past m,
// are zero) at out + tile · k_end · 8.
inline constexpr int64_t kSubSumTileRows = 6;
void pack_subsum_tiles(const float* x, int64_t m, int64_t k, int64_t k_end, const int64_t* offset,
                       int64_t tile_begin, int64_t tile_end, float* out);
// The weight rows of the AVX2 tiled kernel's panel as pack_subsum_lanes reads them: F32 or BF16
// rows in place, FP8 rows widened into `scratch` as the f32 values fp8 · scale (the same bits as
// dequantizing at load gives), so that every FP8 output equals the AVX2 F32 kernels' on those
// values. Baseline code; one per thread (the scratch is the caller's).
class PanelRows {
 public:
  PanelRows(const tensor::WeightView& w, tensor::AlignedBuffer<float>& scratch)
      : w_(w), scratch_(scratch) {}
  // rows[o] for o < slots: weight row n0 + o, or null at and past `count`.
  void get(int64_t n0, int64_t count, int64_t slots, const void** rows);

 private:
  const tensor::WeightView& w_;
  tensor::AlignedBuffer<float>& scratch_;
};
// Rows [n0, n0 + count) of the FP8 w as f32 into out [count, w.cols]: fp8 · block scale.
void dequantize_fp8_rows(const tensor::WeightView& w, int64_t n0, int64_t count, float* out);
// The AVX-512 tiled kernel (gemm_tiled_avx512.cpp), each output the AVX-512 streaming
// kernel's bits; the same three steps as the AVX2 one. Both reduce an output's 16 lanes in the
// tree of reduce16 (gemm_avx512.cpp, AVX-512 code: call it only from there).
int64_t tiled_avx512_tile_rows();
int64_t tiled_avx512_packed_size(int64_t m, int64_t k);
void pack_tiled_avx512_rows(const float* x, int64_t m, int64_t k, int64_t tile_begin,
                            int64_t tile_end, float* out);
void tiled_range_avx512(const float* packed_x, int64_t m, const tensor::WeightView& w, float* y,
                        int64_t ldy, int64_t n_begin, int64_t n_end, int64_t tile_begin,
                        int64_t tile_end);
int64_t tiled_avx2_tile_rows();
int64_t tiled_avx2_packed_size(int64_t m, int64_t k);
void pack_tiled_avx2_rows(const float* x, int64_t m, int64_t k, int64_t tile_begin,
                          int64_t tile_end, float* out);
void tiled_range_avx2(const float* packed_x, const float* x, int64_t m, const tensor::WeightView& w,
                      float* y, int64_t ldy, int64_t n_begin, int64_t n_end, int64_t tile_begin,
                      int64_t tile_end);

// Up to this many activation rows, the streaming kernels (float and int8) walk the weight rows
// one at a time in address order instead of four interleaved, so that a decode GEMV reads one
// sequential stream. On a 2-core AVX-512 EPYC (Zen 4), four interleaved rows of 1-4 KiB read
// 10-20 GB/s on one core against 30-33 for one stream, with a 30 GB/s read roof. Each output's
// sum is formed the same way in both orders, so results do not depend on this choice.
inline constexpr int64_t kSequentialMaxRows = 2;
// Those GEMVs are split into pieces (ThreadPool::parallel_for_dynamic), about eight per thread
// and a multiple of 16 rows: each thread streams through its own contiguous share, and one that
// finishes early takes the pieces the others have left. With one fixed half each and no such
// help, the thread that got the smaller share of a noisy machine's bandwidth held the other at
// every join (6.7% of a decode step was spent waiting there on the 2-core Zen 4).
inline int64_t decode_piece_rows(int64_t rows, int threads) {
  const int64_t pieces = int64_t{8} * std::max(threads, 1);
  return std::max<int64_t>(16, ((rows + pieces - 1) / pieces + 15) / 16 * 16);
}

// Runs body(row_begin, row_end, thread) over a linear's `rows` weight rows for m activation
// rows: decode-sized m in the dynamic pieces above, else in static shares of 16-row multiples.
template <typename Body>
void for_weight_rows(common::ThreadPool& pool, int64_t rows, int64_t m, const Body& body) {
  if (m <= kSequentialMaxRows) {
    pool.parallel_for_dynamic(rows, decode_piece_rows(rows, pool.num_threads()), body);
  } else {
    pool.parallel_for(rows, 16, body);
  }
}

// AMX-BF16 for BF16 weights (gemm_amx_bf16.cpp). x rows [row_begin, row_end) of [m, k] (row
// stride ldx) become three bf16 planes of [mp][kp] (mp, kp multiples of 32, zeros outside x)
// whose sum is x exactly; rows at or past m are zeroed.
void split_bf16x3_rows(const float* x, int64_t ldx, int64_t k, int64_t row_begin, int64_t row_end,
                       int64_t m, uint16_t* out, int64_t mp, int64_t kp);
// y = x · Wᵀ for logical weight rows [n_begin, n_end) of w (row length k), from the split
// planes (plane stride mp · kp; m rows from xs), placed by `out`. Call only when amx_tiles_usable()
// (int8_paths.h).
void bf16x3_range_amx(const uint16_t* xs, int64_t mp, int64_t kp, int64_t m, const AmxWeightRows& w,
                      int64_t k, const AmxOutput& out, int64_t n_begin, int64_t n_end);
// The row-major path (linear_amx_row_major): the three terms of 16-token blocks
// [block_begin, block_end) of the planes, as AMX B tiles of 16 K pairs × 16 tokens, tile
// ((block · kp / 32 + k_step) · 3 + term) at 512 values each. Needs rows up to 16 · block_end
// in the planes (mp >= that).
void pack_bf16x3_b_tiles(const uint16_t* xs, int64_t mp, int64_t kp, int64_t block_begin,
                         int64_t block_end, uint16_t* tiles);
// y (row stride ldy) = x · Wᵀ for weight rows [n_begin, n_end) (n_begin a multiple of 32) of
// the row-major BF16 w [N, k], k a multiple of 32, from m tokens' B tiles: the weight rows are
// the A tiles, loaded in place. Call only when amx_tiles_usable().
void bf16x3_row_major_range_amx(const uint16_t* tiles, int64_t m, const uint16_t* w, int64_t k,
                                float* y, int64_t ldy, int64_t n_begin, int64_t n_end);

// The bf16-activation path (gemm_avx512_bf16.cpp; call only when cpu_features().avx512_bf16).
// x rows [16 · block_begin, 16 · block_end) of [m, k] (row stride ldx, k even) rounded to bf16
// to nearest even (f32 denormals to zero), packed as blocks of [k / 2][16 tokens] 32-bit pair
// words (the even k in the low half), block b at out + b · 8 · k; rows at or past m are zero.
void pack_bf16_pairs_avx512(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t block_begin,
                            int64_t block_end, uint32_t* out);
// y (row stride ldy) = packed x · Wᵀ for rows [n_begin, n_end) of the row-major BF16 w [N, k].
void bf16_pairs_range_avx512(const uint32_t* blocks, int64_t m, const uint16_t* w, int64_t k,
                             float* y, int64_t ldy, int64_t n_begin, int64_t n_end);
// The GEMV form of that path, for fewer rows than kBf16DotMinRows (gemm_avx512_bf16.cpp):
// round_bf16_rows_avx512 rounds n values as pack_bf16_pairs_avx512 does, into plain bf16 bits;
// bf16_gemv_range_avx512 computes rows [n_begin, n_end) of y (row stride ldy) = xb · Wᵀ for m
// rounded token rows xb [m, k] and the row-major BF16 w [N, k]. Each output's sum is formed the
// same way for every m, so a token's outputs do not depend on the rows beside it.
void round_bf16_rows_avx512(const float* x, int64_t n, uint16_t* out);
void bf16_gemv_range_avx512(const uint16_t* xb, int64_t m, const uint16_t* w, int64_t k, float* y,
                            int64_t ldy, int64_t n_begin, int64_t n_end);
}  // namespace kernels::detail
