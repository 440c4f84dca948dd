// The AVX-512 tiled linear kernel for larger M with f32 activations: each output the same bits
// as the AVX-512 streaming kernel (gemm_avx512.cpp) gives it, whatever the batch and the thread
// count. That kernel forms an output from 16 sub-sums: sub-sum s is one FMA chain, in order,
// over k = 16t + s for every 16-block of K, the last one zero-padded (its masked loads), then
// reduce16's tree. Here the sub-sums come from an outer-product micro-kernel: weights packed per
// panel of 32 outputs and activations per tile of 6 rows (8 lanes apart) as [s][t][lanes], 32
// outputs in two vectors against 6 broadcast rows, one pass over t per sub-sum, the tree then
// applied across 16 outputs at once. Compiled for AVX-512 by a target pragma over this file's
// own functions; runs only when cpu_features().avx512 is set.
#include <algorithm>

#include "kernels/gemm_paths.h"
#include "kernels/simd.h"
#include "kernels/target_region.h"
#include "tensor/aligned_buffer.h"

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq")

namespace kernels::detail {
namespace {

constexpr int64_t kRows = kSubSumTileRows;  // activation rows per tile
constexpr int64_t kLanes = 8;               // packed lanes per tile step (rows 6 and 7 are zero)
constexpr int64_t kOutputs = 32;            // outputs per weight panel
constexpr int kSubSums = 16;
constexpr int64_t kGroupTiles = 4;  // as in the AVX2 kernel

struct Layout {
  int64_t steps = 0;  // per sub-sum: ceil(K / 16)
  int64_t offset[kSubSums] = {};
  explicit Layout(int64_t k) : steps((k + 15) / 16) {
    for (int s = 0; s < kSubSums; ++s) offset[s] = s * steps;
  }
  int64_t total_steps() const { return steps * kSubSums; }
};

using TileSums = float[kSubSums][kRows][kOutputs];

void subsum_pass(const float* xs, const float* ws, int64_t steps, int s, TileSums& sub) {
  static_assert(kRows == 6 && kOutputs == 32, "the accumulators below are 6 x 2 vectors");
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
  __m512 a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
  for (int64_t t = 0; t < steps; ++t, ws += kOutputs, xs += kLanes) {
    const __m512 w0 = _mm512_loadu_ps(ws), w1 = _mm512_loadu_ps(ws + 16);
    __m512 b = _mm512_set1_ps(xs[0]);
    a00 = _mm512_fmadd_ps(w0, b, a00);
    a01 = _mm512_fmadd_ps(w1, b, a01);
    b = _mm512_set1_ps(xs[1]);
    a10 = _mm512_fmadd_ps(w0, b, a10);
    a11 = _mm512_fmadd_ps(w1, b, a11);
    b = _mm512_set1_ps(xs[2]);
    a20 = _mm512_fmadd_ps(w0, b, a20);
    a21 = _mm512_fmadd_ps(w1, b, a21);
    b = _mm512_set1_ps(xs[3]);
    a30 = _mm512_fmadd_ps(w0, b, a30);
    a31 = _mm512_fmadd_ps(w1, b, a31);
    b = _mm512_set1_ps(xs[4]);
    a40 = _mm512_fmadd_ps(w0, b, a40);
    a41 = _mm512_fmadd_ps(w1, b, a41);
    b = _mm512_set1_ps(xs[5]);
    a50 = _mm512_fmadd_ps(w0, b, a50);
    a51 = _mm512_fmadd_ps(w1, b, a51);
  }
  float(*out)[kOutputs] = sub[s];
  _mm512_store_ps(out[0], a00);
  _mm512_store_ps(out[0] + 16, a01);
  _mm512_store_ps(out[1], a10);
  _mm512_store_ps(out[1] + 16, a11);
  _mm512_store_ps(out[2], a20);
  _mm512_store_ps(out[2] + 16, a21);
  _mm512_store_ps(out[3], a30);
  _mm512_store_ps(out[3] + 16, a31);
  _mm512_store_ps(out[4], a40);
  _mm512_store_ps(out[4] + 16, a41);
  _mm512_store_ps(out[5], a50);
  _mm512_store_ps(out[5] + 16, a51);
}

// reduce16's tree (gemm_paths.h) across 16 outputs from o0 of row r: the same additions.
inline __m512 reduce_outputs(const TileSums& sub, int r, int o0) {
  __m512 h8[8];
  for (int j = 0; j < 8; ++j)
    h8[j] = _mm512_add_ps(_mm512_load_ps(sub[8 + j][r] + o0), _mm512_load_ps(sub[j][r] + o0));
  __m512 h4[4];
  for (int j = 0; j < 4; ++j) h4[j] = _mm512_add_ps(h8[4 + j], h8[j]);
  const __m512 h20 = _mm512_add_ps(h4[0], h4[2]), h21 = _mm512_add_ps(h4[1], h4[3]);
  return _mm512_add_ps(h20, h21);
}

}  // namespace

int64_t tiled_avx512_tile_rows() {
  return kRows;
}

int64_t tiled_avx512_packed_size(int64_t m, int64_t k) {
  return (m + kRows - 1) / kRows * kLanes * Layout(k).total_steps();
}

void pack_tiled_avx512_rows(const float* x, int64_t m, int64_t k, int64_t tile_begin,
                            int64_t tile_end, float* out) {
  const Layout L(k);
  pack_subsum_tiles(x, m, k, L.total_steps(), L.offset, tile_begin, tile_end, out);
}

void tiled_range_avx512(const float* packed_x, int64_t m, const tensor::WeightView& w, float* y,
                        int64_t ldy, int64_t n_begin, int64_t n_end, int64_t tile_begin,
                        int64_t tile_end) {
  const int64_t k = w.cols;
  const bool bf16 = w.dtype == tensor::DType::kBF16;
  const int64_t elem = bf16 ? 2 : 4;
  const Layout L(k);
  const int64_t tile_values = L.total_steps() * kLanes;
  thread_local tensor::AlignedBuffer<float> panel_scratch, sums_scratch;
  if (panel_scratch.size() < size_t(L.total_steps() * kOutputs))
    panel_scratch.resize(size_t(L.total_steps() * kOutputs));
  constexpr size_t kTileSums = sizeof(TileSums) / sizeof(float);
  if (sums_scratch.size() < size_t(kGroupTiles) * kTileSums)
    sums_scratch.resize(size_t(kGroupTiles) * kTileSums);
  float* panel = panel_scratch.data();
  TileSums* sums = reinterpret_cast<TileSums*>(sums_scratch.data());
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kOutputs) {
    const int64_t outputs = std::min(kOutputs, n_end - n0);
    const void* rows[kOutputs];
    for (int64_t o = 0; o < kOutputs; ++o)
      rows[o] = o < outputs ? static_cast<const char*>(w.data) + (n0 + o) * k * elem : nullptr;
    pack_subsum_lanes(rows, bf16, kOutputs, k, L.total_steps(), L.offset, panel);
    for (int64_t g0 = tile_begin; g0 < tile_end; g0 += kGroupTiles) {
      const int64_t group = std::min(kGroupTiles, tile_end - g0);
      for (int s = 0; s < kSubSums; ++s) {
        for (int64_t i = 0; i < group; ++i) {
          subsum_pass(packed_x + (g0 + i) * tile_values + L.offset[s] * kLanes,
                      panel + L.offset[s] * kOutputs, L.steps, s, sums[i]);
        }
      }
      for (int64_t i = 0; i < group; ++i) {
        const int64_t r0 = (g0 + i) * kRows, tile_rows = std::min(kRows, m - r0);
        for (int64_t r = 0; r < tile_rows; ++r) {
          float* yr = y + (r0 + r) * ldy + n0;
          for (int o0 = 0; o0 < outputs; o0 += 16) {
            const int64_t left = std::min<int64_t>(16, outputs - o0);
            _mm512_mask_storeu_ps(yr + o0, __mmask16((1u << left) - 1u),
                                  reduce_outputs(sums[i], int(r), o0));
          }
        }
      }
    }
  }
}

}  // namespace kernels::detail

CHUNKPIPE_TARGET_END()
