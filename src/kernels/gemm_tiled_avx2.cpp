// The AVX2 tiled linear kernel for larger M (prefill): y = x · Wᵀ with F32, BF16 or FP8 weights
// (FP8 panels widened to f32 rows first, gemm_paths.h's PanelRows), each
// output the same bits as the AVX2 streaming kernel (gemm.cpp) gives it, so that a token's
// outputs depend neither on the rows beside it nor on the thread count. OpenBLAS cannot promise
// that: its kernels and blocking change with the shape of each call and with the machine.
//
// The streaming kernel forms an output from 16 sub-sums: sub-sum s is one FMA chain, in order,
// over k = 16t + s (lane s % 8 of chain s / 8), for the full 16-blocks of K and, for s < 8, the
// leftover 8-block; the sub-sums are reduced in a fixed tree and the K % 8 tail added in order.
// Here the sub-sums come from an outer-product micro-kernel: weights packed per panel of 16
// outputs and activations per tile of 6 rows (8 lanes apart) as [s][t][lanes], 16 outputs in two
// vectors against 6 broadcast rows (12 accumulators), one pass over t per sub-sum.
#include "kernels/gemm_paths.h"

#include <algorithm>
#include <cmath>

#include "kernels/simd.h"
#include "tensor/aligned_buffer.h"
#include "tensor/dtype.h"

namespace kernels::detail {
namespace {

constexpr int64_t kRows = kSubSumTileRows;  // activation rows per tile
constexpr int64_t kLanes = 8;               // packed lanes per tile step (rows 6 and 7 are zero)
constexpr int64_t kOutputs = 16;            // outputs per weight panel
constexpr int kSubSums = 16;
// Tiles that share each pass over a panel's sub-sum (its 1/16 of the panel stays in L1 across
// them). On the Zen 4 (2 threads, N 512-2048, K 512-7168, M 64-2048) 4 beat 1 and 8 by 2-10%.
constexpr int64_t kGroupTiles = 4;

// Where each sub-sum's steps lie in a packed operand (in units of one step: kRows or kOutputs
// values). K8 = K rounded down to 8: the vector part; the rest is the scalar tail.
struct SubSumLayout {
  int64_t k = 0, k8 = 0;
  int64_t steps[kSubSums] = {};
  int64_t offset[kSubSums] = {};
  explicit SubSumLayout(int64_t k_in) : k(k_in), k8(k_in / 8 * 8) {
    const int64_t full = k / 16;
    const bool leftover = k % 16 >= 8;  // one more 8-block, on chain 0
    int64_t at = 0;
    for (int s = 0; s < kSubSums; ++s) {
      steps[s] = full + (s < 8 && leftover ? 1 : 0);
      offset[s] = at;
      at += steps[s];
    }
  }
  int64_t total_steps() const { return k8; }  // one per vector-part value of K
};

// Transposes the 8 x 8 block rows[0..8) (each 8 floats) into cols[j] = (rows[0][j], ...).
inline void transpose8(__m256 (&r)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// One tile's sub-sums: sub[s][r][o] for kRows activation rows against kOutputs outputs.
using TileSums = float[kSubSums][kRows][kOutputs];

// Sub-sum s of one tile: xs and ws are the tile's and the panel's steps of s. The twelve
// accumulators are named one by one: GCC kept an array of them in memory.
void subsum_pass(const float* xs, const float* ws, int64_t steps, int s, TileSums& sub) {
  static_assert(kRows == 6 && kOutputs == 16, "the accumulators below are 6 x 2 vectors");
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
  __m256 a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
  for (int64_t t = 0; t < steps; ++t, ws += kOutputs, xs += kLanes) {
    const __m256 w0 = _mm256_loadu_ps(ws), w1 = _mm256_loadu_ps(ws + 8);
    __m256 b = _mm256_broadcast_ss(xs);
    a00 = _mm256_fmadd_ps(w0, b, a00);
    a01 = _mm256_fmadd_ps(w1, b, a01);
    b = _mm256_broadcast_ss(xs + 1);
    a10 = _mm256_fmadd_ps(w0, b, a10);
    a11 = _mm256_fmadd_ps(w1, b, a11);
    b = _mm256_broadcast_ss(xs + 2);
    a20 = _mm256_fmadd_ps(w0, b, a20);
    a21 = _mm256_fmadd_ps(w1, b, a21);
    b = _mm256_broadcast_ss(xs + 3);
    a30 = _mm256_fmadd_ps(w0, b, a30);
    a31 = _mm256_fmadd_ps(w1, b, a31);
    b = _mm256_broadcast_ss(xs + 4);
    a40 = _mm256_fmadd_ps(w0, b, a40);
    a41 = _mm256_fmadd_ps(w1, b, a41);
    b = _mm256_broadcast_ss(xs + 5);
    a50 = _mm256_fmadd_ps(w0, b, a50);
    a51 = _mm256_fmadd_ps(w1, b, a51);
  }
  float(*out)[kOutputs] = sub[s];
  _mm256_store_ps(out[0], a00);
  _mm256_store_ps(out[0] + 8, a01);
  _mm256_store_ps(out[1], a10);
  _mm256_store_ps(out[1] + 8, a11);
  _mm256_store_ps(out[2], a20);
  _mm256_store_ps(out[2] + 8, a21);
  _mm256_store_ps(out[3], a30);
  _mm256_store_ps(out[3] + 8, a31);
  _mm256_store_ps(out[4], a40);
  _mm256_store_ps(out[4] + 8, a41);
  _mm256_store_ps(out[5], a50);
  _mm256_store_ps(out[5] + 8, a51);
}

// out[o] = the streaming kernel's reduction of sub[.][r][o] for 8 outputs from o0: the two
// chains added lane by lane, then simd::hsum's tree ((v0+v4)+(v1+v5)) + ((v2+v6)+(v3+v7)),
// here across eight outputs at once (the same additions, so the same bits).
inline __m256 reduce8(const TileSums& sub, int r, int o0) {
  __m256 v[8];
  for (int j = 0; j < 8; ++j)
    v[j] = _mm256_add_ps(_mm256_load_ps(sub[j][r] + o0), _mm256_load_ps(sub[8 + j][r] + o0));
  const __m256 l0 = _mm256_add_ps(v[0], v[4]), l1 = _mm256_add_ps(v[1], v[5]);
  const __m256 l2 = _mm256_add_ps(v[2], v[6]), l3 = _mm256_add_ps(v[3], v[7]);
  return _mm256_add_ps(_mm256_add_ps(l0, l1), _mm256_add_ps(l2, l3));
}

template <bool kBf16>
void tiled_range(const float* xp, const float* x, int64_t m, const tensor::WeightView& w, float* y,
                 int64_t ldy, int64_t n_begin, int64_t n_end, int64_t tile_begin,
                 int64_t tile_end) {
  const int64_t k = w.cols;
  const SubSumLayout L(k);
  const int64_t tile_values = L.total_steps() * kLanes;
  thread_local tensor::AlignedBuffer<float> panel_scratch, sums_scratch, fp8_scratch;
  if (panel_scratch.size() < size_t(L.total_steps() * kOutputs))
    panel_scratch.resize(size_t(L.total_steps() * kOutputs));
  PanelRows panel_rows(w, fp8_scratch);
  constexpr size_t kTileSums = sizeof(TileSums) / sizeof(float);
  if (sums_scratch.size() < size_t(kGroupTiles) * kTileSums)
    sums_scratch.resize(size_t(kGroupTiles) * kTileSums);
  float* panel = panel_scratch.data();
  TileSums* sums = reinterpret_cast<TileSums*>(sums_scratch.data());
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kOutputs) {
    const int64_t outputs = std::min(kOutputs, n_end - n0);
    const void* rows[kOutputs];
    panel_rows.get(n0, outputs, kOutputs, rows);
    pack_subsum_lanes(rows, kBf16, kOutputs, k, L.k8, L.offset, panel);
    for (int64_t g0 = tile_begin; g0 < tile_end; g0 += kGroupTiles) {
      const int64_t group = std::min(kGroupTiles, tile_end - g0);
      // One sub-sum at a time over the group's tiles: its share of the panel stays in L1.
      for (int s = 0; s < kSubSums; ++s) {
        for (int64_t i = 0; i < group; ++i) {
          subsum_pass(xp + (g0 + i) * tile_values + L.offset[s] * kLanes,
                      panel + L.offset[s] * kOutputs, L.steps[s], s, sums[i]);
        }
      }
      for (int64_t i = 0; i < group; ++i) {
        const int64_t r0 = (g0 + i) * kRows, tile_rows = std::min(kRows, m - r0);
        for (int64_t r = 0; r < tile_rows; ++r) {
          float* yr = y + (r0 + r) * ldy + n0;
          if (outputs == kOutputs && L.k8 == k) {  // no tail: the reduced vectors are the outputs
            _mm256_storeu_ps(yr, reduce8(sums[i], int(r), 0));
            _mm256_storeu_ps(yr + 8, reduce8(sums[i], int(r), 8));
            continue;
          }
          alignas(32) float out[kOutputs];
          _mm256_store_ps(out, reduce8(sums[i], int(r), 0));
          _mm256_store_ps(out + 8, reduce8(sums[i], int(r), 8));
          const float* xr = x + (r0 + r) * k;
          for (int64_t o = 0; o < outputs; ++o) {
            float acc = out[o];  // then the tail in order, as stream_finish adds it
            for (int64_t j = L.k8; j < k; ++j)
              acc = std::fma(simd::load1<kBf16>(rows[o], j), xr[j], acc);
            yr[o] = acc;
          }
        }
      }
    }
  }
}

}  // namespace

void pack_subsum_lanes(const void* const* rows, bool bf16, int64_t lanes, int64_t k, int64_t k_end,
                       const int64_t* offset, float* out) {
  const int64_t full = std::min(k, k_end) / 8 * 8;  // 8-blocks read whole
  for (int64_t g = 0; g < lanes; g += 8) {
    for (int64_t kb = 0; kb < k_end; kb += 8) {
      __m256 v[8];
      for (int j = 0; j < 8; ++j) {
        const void* row = rows[g + j];
        if (row == nullptr) {
          v[j] = _mm256_setzero_ps();
        } else if (kb < full) {
          v[j] = bf16 ? simd::load8<true>(row, kb) : simd::load8<false>(row, kb);
        } else {  // past K: zeros
          alignas(32) float part[8] = {};
          for (int64_t i = kb; i < std::min(k, kb + 8); ++i)
            part[i - kb] = bf16 ? simd::load1<true>(row, i) : simd::load1<false>(row, i);
          v[j] = _mm256_load_ps(part);
        }
      }
      transpose8(v);
      const int s0 = static_cast<int>(kb % 16);
      const int64_t t = kb / 16;
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(out + (offset[s0 + j] + t) * lanes + g, v[j]);
    }
  }
}

void pack_subsum_tiles(const float* x, int64_t m, int64_t k, int64_t k_end, const int64_t* offset,
                       int64_t tile_begin, int64_t tile_end, float* out) {
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const void* rows[8] = {};
    for (int64_t r = 0; r < kSubSumTileRows; ++r)
      if (tile * kSubSumTileRows + r < m) rows[r] = x + (tile * kSubSumTileRows + r) * k;
    pack_subsum_lanes(rows, false, 8, k, k_end, offset, out + tile * k_end * 8);
  }
}

int64_t tiled_avx2_packed_size(int64_t m, int64_t k) {
  return (m + kRows - 1) / kRows * kLanes * (k / 8 * 8);
}

void pack_tiled_avx2_rows(const float* x, int64_t m, int64_t k, int64_t tile_begin,
                          int64_t tile_end, float* out) {
  const SubSumLayout L(k);
  pack_subsum_tiles(x, m, k, L.k8, L.offset, tile_begin, tile_end, out);
}

int64_t tiled_avx2_tile_rows() {
  return kRows;
}

void tiled_range_avx2(const float* packed_x, const float* x, int64_t m, const tensor::WeightView& w,
                      float* y, int64_t ldy, int64_t n_begin, int64_t n_end, int64_t tile_begin,
                      int64_t tile_end) {
  if (w.dtype == tensor::DType::kBF16) {
    tiled_range<true>(packed_x, x, m, w, y, ldy, n_begin, n_end, tile_begin, tile_end);
  } else {  // F32, or FP8 through PanelRows' f32 rows
    tiled_range<false>(packed_x, x, m, w, y, ldy, n_begin, n_end, tile_begin, tile_end);
  }
}

}  // namespace kernels::detail
