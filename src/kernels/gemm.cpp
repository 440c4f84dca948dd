// Linear-layer kernels: dispatch by CPU features, the AVX2 streaming body, the AVX2 tiled
// kernel's driver and the OpenBLAS tiles (kept for comparison only). The kernels are ours
// because no Debian library has a bf16-weight GEMV that runs at DRAM speed (OpenBLAS sgemv
// reaches ~5 GB/s here, see docs/ARCHITECTURE.md) nor a GEMM whose per-output sums stay the
// same across shapes, thread splits and machines ("Batch invariance").
#include "kernels/gemm.h"

#include <cblas.h>
#include <algorithm>
#include <cmath>
#include <mutex>

#include "common/check.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm_paths.h"
#include "kernels/int8_linear.h"
#include "kernels/int8_paths.h"
#include "kernels/simd.h"
#include "tensor/aligned_buffer.h"

namespace kernels {
namespace {

using tensor::DType;
using tensor::WeightView;

// OpenBLAS threads would fight with our pool; every call we make is single-threaded.
void ensure_blas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// How the AVX2 streaming kernel forms each output's dot product: K runs in blocks of 8 values,
// block b accumulates into chain b % kStreamChains (one accumulator per chain, blocks in order),
// the chains are added in a fixed tree, the lanes reduced, and the last K % 8 products added in
// order. One FMA chain per output could not read a weight row at DRAM speed (8 values per
// 4-cycle FMA latency is 4 bytes of BF16 per cycle); two overlap. Every tile forms outputs this
// way, so a token's outputs do not depend on the batch beside it. (The AVX-512 kernel keeps one
// chain: gemm_avx512.cpp.)
constexpr int kStreamChains = 2;

using simd::WeightKind;
using simd::WeightRow;

constexpr int64_t element_bytes(WeightKind kind) {
  return kind == WeightKind::kF32 ? 4 : kind == WeightKind::kBf16 ? 2 : 1;
}

// acc[nb][mb] += the 8-value block at i of weight row nb against activation row mb. Always
// inlined, so the accumulators stay in registers.
template <WeightKind kKind, int NB, int MB>
__attribute__((always_inline)) inline void stream_block(__m256 (&acc)[NB][MB], const float* x,
                                                        int64_t k, const WeightRow (&rows)[NB],
                                                        const __m256 (&scale)[NB], int64_t i) {
  __m256 xv[MB];
  for (int mb = 0; mb < MB; ++mb) xv[mb] = _mm256_loadu_ps(x + mb * k + i);
  for (int nb = 0; nb < NB; ++nb) {
    const __m256 wv = simd::load8<kKind>(rows[nb], i, scale[nb]);
    for (int mb = 0; mb < MB; ++mb) acc[nb][mb] = _mm256_fmadd_ps(wv, xv[mb], acc[nb][mb]);
  }
}

// Adds the chains, reduces the lanes, adds the scalar tail from `tail` on, and stores.
template <WeightKind kKind, int NB, int MB>
__attribute__((always_inline)) inline void stream_finish(
    const __m256 (&chains)[kStreamChains][NB][MB], const float* x, int64_t k,
    const WeightRow (&rows)[NB], int64_t tail, int64_t n0, float* y, int64_t ldy) {
  static_assert(kStreamChains == 2, "the tree below adds two chains");
  for (int nb = 0; nb < NB; ++nb) {
    for (int mb = 0; mb < MB; ++mb) {
      float s = simd::hsum(_mm256_add_ps(chains[0][nb][mb], chains[1][nb][mb]));
      // An explicit FMA per tail value, as the tiled kernel adds them (gemm_tiled_avx2.cpp).
      for (int64_t j = tail; j < k; ++j)
        s = std::fma(simd::load1<kKind>(rows[nb], j), x[mb * k + j], s);
      y[mb * ldy + n0 + nb] = s;
    }
  }
}

// Weight row n of w as the streaming kernels read it.
template <WeightKind kKind>
WeightRow weight_row(const WeightView& w, int64_t n) {
  WeightRow row{static_cast<const char*>(w.data) + n * w.cols * element_bytes(kKind)};
  if constexpr (kKind == WeightKind::kFp8) {
    row.scale = w.fp8.row(n);
    row.scale_log2 = w.fp8.block_cols_log2;
  }
  return row;
}

// NB weight rows against MB activation rows, the chains in lockstep: NB · MB · kStreamChains
// accumulators, so at most 3 × 2 tiles in the 16 registers. With kStream (decode's one row at
// a time, read once in address order), each step also asks for the lines 4 KiB ahead, as the
// int8 GEMV does.
template <WeightKind kKind, int NB, int MB, bool kStream>
void stream_tile(const float* x, const WeightView& w, int64_t n0, float* y, int64_t ldy) {
  constexpr int64_t elem = element_bytes(kKind), step = 8 * kStreamChains;
  const int64_t k = w.cols;
  WeightRow rows[NB];
  for (int nb = 0; nb < NB; ++nb) rows[nb] = weight_row<kKind>(w, n0 + nb);
  const WeightRow(&rows_ref)[NB] = rows;
  __m256 acc[kStreamChains][NB][MB];
  for (auto& chain : acc)
    for (auto& row : chain)
      for (auto& v : row) v = _mm256_setzero_ps();
  // K in segments that share an FP8 scale block (all of K for the other kinds), each block's
  // scale broadcast once; the FMAs run in the same order either way.
  const int64_t segment = kKind == WeightKind::kFp8 ? int64_t{1} << w.fp8.block_cols_log2 : k;
  __m256 scale[NB];
  const __m256(&scale_ref)[NB] = scale;
  int64_t i = 0;
  for (int64_t end = std::min(k, segment); i + step <= k; end = std::min(k, end + segment)) {
    for (int nb = 0; nb < NB; ++nb) scale[nb] = simd::block_scale8<kKind>(rows[nb], i);
    for (; i + step <= end; i += step) {
      if constexpr (kStream) {
        for (int64_t byte = 0; byte < step * elem; byte += 64)
          _mm_prefetch(static_cast<const char*>(rows[0].data) + i * elem + byte + 4096,
                       _MM_HINT_T0);
      }
      for (int c = 0; c < kStreamChains; ++c)
        stream_block<kKind, NB, MB>(acc[c], x, k, rows_ref, scale_ref, i + 8 * c);
    }
  }
  if (i + 8 <= k)
    for (int nb = 0; nb < NB; ++nb) scale[nb] = simd::block_scale8<kKind>(rows[nb], i);
  for (int c = 0; i + 8 <= k; i += 8, ++c)
    stream_block<kKind, NB, MB>(acc[c], x, k, rows_ref, scale_ref, i);
  stream_finish<kKind, NB, MB>(acc, x, k, rows_ref, i, n0, y, ldy);
}

template <WeightKind kKind>
void streaming_range_avx2_t(const float* x, int64_t m, const WeightView& w, float* y, int64_t ldy,
                            int64_t n_begin, int64_t n_end) {
  const int64_t k = w.cols;
  int64_t n = n_begin;
  // At most kSequentialMaxRows rows: one weight row at a time, in address order (below).
  for (; m > detail::kSequentialMaxRows && n + 3 <= n_end; n += 3) {
    int64_t r = 0;
    for (; r + 2 <= m; r += 2) stream_tile<kKind, 3, 2, false>(x + r * k, w, n, y + r * ldy, ldy);
    if (r < m) stream_tile<kKind, 3, 1, false>(x + r * k, w, n, y + r * ldy, ldy);
  }
  for (; n < n_end; ++n) {
    int64_t r = 0;
    for (; r + 2 <= m; r += 2) stream_tile<kKind, 1, 2, true>(x + r * k, w, n, y + r * ldy, ldy);
    if (r < m) stream_tile<kKind, 1, 1, true>(x + r * k, w, n, y + r * ldy, ldy);
  }
}

// Per-thread scratch for bf16 -> f32 weight tiles.
tensor::AlignedBuffer<float>& tile_scratch(size_t size) {
  thread_local tensor::AlignedBuffer<float> buffer;
  if (buffer.size() < size) buffer.resize(size);
  return buffer;
}

bool g_reference_linear = false;
ActivationPrecision g_activation_precision = ActivationPrecision::kF32;

}  // namespace

ScopedReferenceLinear::ScopedReferenceLinear() : saved_(g_reference_linear) {
  g_reference_linear = true;
}
ScopedReferenceLinear::~ScopedReferenceLinear() {
  g_reference_linear = saved_;
}

void set_activation_precision(ActivationPrecision precision) {
  g_activation_precision = precision;
}
ActivationPrecision activation_precision() {
  return g_activation_precision;
}
ScopedActivationPrecision::ScopedActivationPrecision(ActivationPrecision precision)
    : saved_(g_activation_precision) {
  g_activation_precision = precision;
}
ScopedActivationPrecision::~ScopedActivationPrecision() {
  g_activation_precision = saved_;
}

void round_to_bf16(const float* x, int64_t n, float* out) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i rounded =
        _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), high);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i kept = _mm256_and_si256(_mm256_or_si256(u, quiet), high);
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_blendv_epi8(rounded, kept, nan)));
  }
  for (; i < n; ++i) out[i] = tensor::bf16_to_f32(tensor::f32_to_bf16(x[i]));
}

void pack_bf16_pairs(const float* x, int64_t ldx, int64_t m, int64_t k, Bf16PairActivations& out,
                     common::ThreadPool& pool) {
  CHECK(k % 2 == 0 && cpu_features().avx512_bf16)
      << "pack_bf16_pairs: needs an even K and AVX512_BF16";
  const int64_t blocks = (m + 15) / 16;
  const size_t size = size_t(blocks * 8 * k);
  if (out.blocks.size() < size) out.blocks.resize(size);
  out.m = m;
  out.k = k;
  uint32_t* packed = out.blocks.data();
  pool.parallel_for(blocks, 1, [&](int64_t b, int64_t e, int) {
    detail::pack_bf16_pairs_avx512(x, ldx, m, k, b, e, packed);
  });
}

void linear_bf16_packed_serial(const Bf16PairActivations& x, const uint16_t* w, int64_t n_begin,
                               int64_t n_end, float* y, int64_t ldy) {
  if (x.m <= 0 || n_begin >= n_end) return;
  detail::bf16_pairs_range_avx512(x.blocks.data(), x.m, w, x.k, y, ldy, n_begin, n_end);
}

void linear_bf16_packed(const Bf16PairActivations& x, const uint16_t* w, int64_t n, float* y,
                        int64_t ldy, common::ThreadPool& pool) {
  if (x.m <= 0 || n <= 0) return;
  pool.parallel_for(
      n, 16, [&](int64_t b, int64_t e, int) { linear_bf16_packed_serial(x, w, b, e, y, ldy); });
}

void linear_bf16_dot(const float* x, int64_t m, const WeightView& w, float* y, int64_t ldy,
                     common::ThreadPool& pool) {
  CHECK(w.dtype == DType::kBF16 && w.cols % 2 == 0 && cpu_features().avx512_bf16)
      << "linear_bf16_dot: needs BF16 weights with an even K and AVX512_BF16";
  if (m <= 0 || w.rows == 0) return;
  // The caller's scratch, reached by the workers through a pointer (see linear_amx_row_major).
  thread_local Bf16PairActivations packed;
  pack_bf16_pairs(x, w.cols, m, w.cols, packed, pool);
  linear_bf16_packed(packed, w.bf16(), w.rows, y, ldy, pool);
}

void linear_bf16_gemv(const float* x, int64_t m, const WeightView& w, float* y, int64_t ldy,
                      common::ThreadPool& pool) {
  CHECK(w.dtype == DType::kBF16 && cpu_features().avx512_bf16)
      << "linear_bf16_gemv: needs BF16 weights and AVX512_BF16";
  if (m <= 0 || w.rows == 0) return;
  const int64_t k = w.cols;
  // The caller's scratch, reached by the workers through a pointer (see linear_amx_row_major).
  thread_local tensor::AlignedBuffer<uint16_t> rounded_scratch;
  if (rounded_scratch.size() < size_t(m * k)) rounded_scratch.resize(size_t(m * k));
  uint16_t* xb = rounded_scratch.data();
  detail::round_bf16_rows_avx512(x, m * k, xb);
  auto body = [&](int64_t b, int64_t e, int) {
    detail::bf16_gemv_range_avx512(xb, m, w.bf16(), k, y, ldy, b, e);
  };
  detail::for_weight_rows(pool, w.rows, m, body);
}

void detail::streaming_range_avx2(const float* x, int64_t m, const WeightView& w, float* y,
                                  int64_t ldy, int64_t n_begin, int64_t n_end) {
  switch (w.dtype) {
    case DType::kBF16:
      return streaming_range_avx2_t<WeightKind::kBf16>(x, m, w, y, ldy, n_begin, n_end);
    case DType::kF8E4M3:
      return streaming_range_avx2_t<WeightKind::kFp8>(x, m, w, y, ldy, n_begin, n_end);
    default:
      return streaming_range_avx2_t<WeightKind::kF32>(x, m, w, y, ldy, n_begin, n_end);
  }
}

void detail::dequantize_fp8_rows(const WeightView& w, int64_t n0, int64_t count, float* out) {
  const int64_t k = w.cols;
  for (int64_t r = 0; r < count; ++r) {
    const WeightRow row = weight_row<WeightKind::kFp8>(w, n0 + r);
    float* dst = out + r * k;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
      const __m256 scale = simd::block_scale8<WeightKind::kFp8>(row, i);
      _mm256_storeu_ps(dst + i, simd::load8<WeightKind::kFp8>(row, i, scale));
    }
    for (; i < k; ++i) dst[i] = simd::load1<WeightKind::kFp8>(row, i);
  }
}

void detail::PanelRows::get(int64_t n0, int64_t count, int64_t slots, const void** rows) {
  const int64_t k = w_.cols;
  if (w_.dtype == DType::kF8E4M3) {
    if (scratch_.size() < size_t(slots * k)) scratch_.resize(size_t(slots * k));
    dequantize_fp8_rows(w_, n0, count, scratch_.data());
  }
  for (int64_t o = 0; o < slots; ++o) {
    if (o >= count) {
      rows[o] = nullptr;
    } else if (w_.dtype == DType::kF8E4M3) {
      rows[o] = scratch_.data() + o * k;
    } else {
      rows[o] =
          static_cast<const char*>(w_.data) + (n0 + o) * k * tensor::dtype_size_bytes(w_.dtype);
    }
  }
}

void bf16_to_f32_row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, simd::load8<true>(src, i));
  for (; i < n; ++i) dst[i] = tensor::bf16_to_f32(src[i]);
}

namespace {
// FP8 weights take the AVX2 kernels on every machine: widening e4m3 costs more vector work per
// weight than the 512-bit forms repay on a CPU that splits them in two (Zen 4: 526 against 777
// microseconds for V3's q_a_proj at batch 1, chunkpipe_bench --v3-linears), and one kernel
// family gives FP8 outputs the same bits on every machine.
bool avx512_for(const WeightView& w) {
  return cpu_features().avx512 && w.dtype != DType::kF8E4M3;
}
auto streaming_range(const WeightView& w) {
  return avx512_for(w) ? detail::streaming_range_avx512 : detail::streaming_range_avx2;
}
}  // namespace

void linear_streaming(const float* x, int64_t m, const WeightView& w, float* y, int64_t ldy,
                      common::ThreadPool& pool) {
  const auto range = streaming_range(w);
  auto body = [&](int64_t b, int64_t e, int) { range(x, m, w, y, ldy, b, e); };
  detail::for_weight_rows(pool, w.rows, m, body);
}

void linear_streaming_serial(const float* x, int64_t m, const WeightView& w, float* y,
                             int64_t ldy) {
  CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16 || w.dtype == DType::kF8E4M3)
      << "linear_streaming_serial: unsupported weight dtype";
  if (m > 0) streaming_range(w)(x, m, w, y, ldy, 0, w.rows);
}

void sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, bool b_transposed, float beta, float* c, int64_t ldc) {
  ensure_blas_single_threaded();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void linear_blas(const float* x, int64_t m, const WeightView& w, float* y, int64_t ldy,
                 common::ThreadPool& pool) {
  CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16) << "linear_blas: F32 or BF16 weights";
  const int64_t k = w.cols;
  // Weight tiles of ~4 MiB of f32: wide enough for sgemm to reach its full rate.
  const int64_t tile_n =
      std::max<int64_t>(64, (int64_t{1} << 20) / std::max<int64_t>(k, 1) / 16 * 16);
  pool.parallel_for(w.rows, 16, [&](int64_t b, int64_t e, int) {
    if (w.dtype == DType::kF32) {
      sgemm(m, e - b, k, 1.0f, x, k, w.f32() + b * k, k, true, 0.0f, y + b, ldy);
      return;
    }
    auto& scratch = tile_scratch(static_cast<size_t>(tile_n * k));
    for (int64_t n0 = b; n0 < e; n0 += tile_n) {
      const int64_t nt = std::min(tile_n, e - n0);
      bf16_to_f32_row(w.bf16() + n0 * k, scratch.data(), nt * k);
      sgemm(m, nt, k, 1.0f, x, k, scratch.data(), k, true, 0.0f, y + n0, ldy);
    }
  });
}

void linear_tiled(const float* x, int64_t m, const WeightView& w, float* y, int64_t ldy,
                  common::ThreadPool& pool) {
  CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16 || w.dtype == DType::kF8E4M3)
      << "linear_tiled: bad weight dtype";
  if (m <= 0 || w.rows == 0) return;
  const bool avx512 = avx512_for(w);
  const int64_t k = w.cols;
  const int64_t tile_rows =
      avx512 ? detail::tiled_avx512_tile_rows() : detail::tiled_avx2_tile_rows();
  const int64_t tiles = (m + tile_rows - 1) / tile_rows;
  // The caller's scratch, reached by the workers through a pointer (see linear_amx_row_major).
  thread_local tensor::AlignedBuffer<float> packed_scratch;
  const size_t size = size_t(avx512 ? detail::tiled_avx512_packed_size(m, k)
                                    : detail::tiled_avx2_packed_size(m, k));
  if (packed_scratch.size() < size) packed_scratch.resize(size);
  float* packed = packed_scratch.data();
  pool.parallel_for(tiles, 1, [&](int64_t b, int64_t e, int) {
    if (avx512) {
      detail::pack_tiled_avx512_rows(x, m, k, b, e, packed);
    } else {
      detail::pack_tiled_avx2_rows(x, m, k, b, e, packed);
    }
  });
  // Blocks of rows whose packed values (8 MiB) stay in the last-level cache while every weight
  // panel of a thread's share passes over them; each panel is packed once per block. On the
  // Zen 4 (2 threads, M 4096, N 2048, K 2048) 2 MiB blocks ran 5% slower and 32 MiB ones 28%.
  const int64_t block_tiles =
      std::max<int64_t>(8, (int64_t{1} << 21) / std::max<int64_t>(k, 8) / tile_rows);
  const int64_t panel = avx512 ? 32 : 16, panels = (w.rows + panel - 1) / panel;
  for (int64_t t0 = 0; t0 < tiles; t0 += block_tiles) {
    const int64_t t1 = std::min(tiles, t0 + block_tiles);
    pool.parallel_for(panels, 1, [&](int64_t b, int64_t e, int) {
      const int64_t n0 = b * panel, n1 = std::min(w.rows, e * panel);
      if (avx512) {
        detail::tiled_range_avx512(packed, m, w, y, ldy, n0, n1, t0, t1);
      } else {
        detail::tiled_range_avx2(packed, x, m, w, y, ldy, n0, n1, t0, t1);
      }
    });
  }
}

bool amx_bf16_active() {
  return cpu_features().amx_bf16 && detail::amx_tiles_usable();
}

void split_bf16x3(const float* x, int64_t ldx, int64_t m, int64_t k, Bf16x3Activations& out,
                  common::ThreadPool& pool) {
  out.m = m;
  out.k = k;
  out.mp = (m + 31) / 32 * 32;
  out.kp = (k + 31) / 32 * 32;
  const size_t size = size_t(3 * out.mp * out.kp);
  if (out.planes.size() < size) out.planes.resize(size);
  uint16_t* planes = out.planes.data();
  pool.parallel_for(out.mp, 32, [&](int64_t b, int64_t e, int) {
    detail::split_bf16x3_rows(x, ldx, k, b, e, m, planes, out.mp, out.kp);
  });
}

void linear_amx(const Bf16x3Activations& x, const AmxWeightRows& w, int64_t n, const AmxOutput& out,
                common::ThreadPool& pool, int64_t row_begin, int64_t row_end) {
  if (row_end < 0) row_end = x.m;
  CHECK(row_begin % 32 == 0 && row_begin <= row_end && row_end <= x.m) << "linear_amx: bad rows";
  // Output rows in whole panels of 32 per thread. A row range starts on a tile row; its last
  // tile may read rows past row_end (still inside the planes), whose outputs are not stored.
  pool.parallel_for((n + 31) / 32, 1, [&](int64_t b, int64_t e, int) {
    detail::bf16x3_range_amx(x.planes.data() + row_begin * x.kp, x.mp, x.kp, row_end - row_begin, w,
                             x.k, out, b * 32, std::min(n, e * 32));
  });
}

void linear_amx_row_major(const float* x, int64_t m, const WeightView& w, float* y, int64_t ldy,
                          common::ThreadPool& pool) {
  CHECK(w.dtype == DType::kBF16 && w.cols % 32 == 0) << "linear_amx_row_major: bad weight";
  if (m <= 0 || w.rows == 0) return;
  // The caller's scratch: the workers below must reach it through pointers, not by name (a
  // thread_local named in a lambda would be each worker's own).
  thread_local Bf16x3Activations split_scratch;
  thread_local tensor::AlignedBuffer<uint16_t> b_tiles;
  Bf16x3Activations& split = split_scratch;
  split_bf16x3(x, w.cols, m, w.cols, split, pool);
  const int64_t blocks = (m + 15) / 16;
  const size_t size = size_t(blocks * split.kp * 3 * 16);
  if (b_tiles.size() < size) b_tiles.resize(size);
  uint16_t* tiles = b_tiles.data();
  const uint16_t* planes = split.planes.data();
  const int64_t mp = split.mp, kp = split.kp;
  pool.parallel_for(blocks, 1, [&](int64_t b, int64_t e, int) {
    detail::pack_bf16x3_b_tiles(planes, mp, kp, b, e, tiles);
  });
  pool.parallel_for((w.rows + 31) / 32, 1, [&](int64_t b, int64_t e, int) {
    detail::bf16x3_row_major_range_amx(tiles, m, w.bf16(), w.cols, y, ldy, b * 32,
                                       std::min(w.rows, e * 32));
  });
}

void linear(const float* x, int64_t m, const WeightView& w, float* y, int64_t ldy,
            common::ThreadPool& pool) {
  if (w.dtype == DType::kI8) {
    if (g_reference_linear) return linear_int8_reference(x, m, w, y, ldy);
    return linear_int8(x, m, w, y, ldy, pool);
  }
  CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16 || w.dtype == DType::kF8E4M3)
      << "linear: unsupported weight dtype";
  if (m <= 0 || w.rows == 0) return;
  if (w.dtype == DType::kBF16 && g_activation_precision == ActivationPrecision::kBf16) {
    if (cpu_features().avx512_bf16 && !amx_bf16_active()) {
      // An odd K (no real model has one) stays on the GEMV form, which takes any K, so that its
      // outputs do not change form with the batch.
      if (m < kBf16DotMinRows || w.cols % 2 != 0) return linear_bf16_gemv(x, m, w, y, ldy, pool);
      return linear_bf16_dot(x, m, w, y, ldy, pool);
    }
    // Every other path takes the rounded rows: the products are then the same.
    thread_local tensor::AlignedBuffer<float> rounded_scratch;
    const size_t size = size_t(m * w.cols);
    if (rounded_scratch.size() < size) rounded_scratch.resize(size);
    round_to_bf16(x, m * w.cols, rounded_scratch.data());
    x = rounded_scratch.data();
  }
  if (w.dtype == DType::kBF16 && w.cols % 32 == 0 && m >= kAmxRowMajorMinRows &&
      m <= kAmxRowMajorMaxRows && amx_bf16_active()) {
    linear_amx_row_major(x, m, w, y, ldy, pool);
  } else if (w.dtype == DType::kBF16 && m >= kAmxMinRowsBf16 && amx_bf16_active()) {
    thread_local Bf16x3Activations split;
    split_bf16x3(x, w.cols, m, w.cols, split, pool);
    linear_amx(split, AmxWeightRows{w.bf16(), nullptr}, w.rows, AmxOutput{y, ldy}, pool);
  } else if (m <= (w.dtype == DType::kF32      ? kStreamingMaxRowsF32
                   : w.dtype == DType::kF8E4M3 ? kStreamingMaxRowsFp8
                   : cpu_features().avx512     ? kStreamingMaxRowsBf16Avx512
                                               : kStreamingMaxRowsBf16)) {
    linear_streaming(x, m, w, y, ldy, pool);
  } else {
    linear_tiled(x, m, w, y, ldy, pool);
  }
}

void linear_reference(const float* x, int64_t m, const WeightView& w, float* y, int64_t ldy) {
  if (w.dtype == DType::kI8) return linear_int8_reference(x, m, w, y, ldy);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t n = 0; n < w.rows; ++n) {
      double s = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) s += static_cast<double>(x[r * w.cols + c]) * w.at(n, c);
      y[r * ldy + n] = static_cast<float>(s);
    }
  }
}

}  // namespace kernels
