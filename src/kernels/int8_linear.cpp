// W8A8 linear: activation quantization, dispatch, the AVX2 body (int8 sign-extended to int16
// and multiplied with vpmaddwd: exact, no saturation, unlike vpmaddubsw on signed data), the
// reference and the weight quantizer. Hand-written because no Debian library offers an int8
// GEMV at DRAM speed; oneDNN 2.7 (Debian 12) has u8s8 matmul but not per-token dynamic scales
// fused into one call, and its small-M path is the decode case that matters most here.
#include "kernels/int8_linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm_paths.h"
#include "kernels/int8_paths.h"
#include "kernels/simd.h"
#include "tensor/aligned_buffer.h"

namespace kernels {
namespace {

using tensor::WeightView;

// Tokens from which the AMX tiles (32 tokens per pass, weights packed per call) beat the VNNI
// dot products: chunkpipe_bench gives 1.1x at 16 tokens, 2x at 32, 3-4x from 64.
constexpr int64_t kAmxMinTokens = 16;

inline int8_t quantize_value(float x, float inv_scale, float offset) {
  const float v = std::nearbyint(x * inv_scale + offset);
  return static_cast<int8_t>(std::clamp(v, -128.0f, 127.0f));
}

// NB weight rows against MB quantized tokens. kStream: the rows are read once (decode), so the
// lines ahead are prefetched.
template <int NB, int MB, bool kStream>
inline void dot_tile(const int8_t* xq, const float* act_scale, int64_t k, const WeightView& w,
                     int64_t n0, float* y, int64_t ldy) {
  const int8_t* rows[NB];
  for (int nb = 0; nb < NB; ++nb) rows[nb] = w.i8() + (n0 + nb) * k;
  __m256i acc[NB][MB];
  for (int nb = 0; nb < NB; ++nb)
    for (int mb = 0; mb < MB; ++mb) acc[nb][mb] = _mm256_setzero_si256();
  int64_t i = 0;
  // Decode: 64 bytes (a cache line) of each row per pass, with the lines kPrefetchBytes ahead
  // asked for now: sign-extending costs more instructions per byte than VNNI's dot products,
  // and without the prefetch decode streamed at ~70% of the read bandwidth instead of ~85%.
  // (Prefill re-reads each row from cache for every token pair: no prefetch there; it cost
  // a fifth of the AVX2 prefill.)
  constexpr int64_t kPrefetchBytes = 4096;
  for (; kStream && i + 64 <= k; i += 64) {
    for (int nb = 0; nb < NB; ++nb)
      _mm_prefetch(reinterpret_cast<const char*>(rows[nb] + i + kPrefetchBytes), _MM_HINT_T0);
    for (int64_t j = i; j < i + 64; j += 16) {
      __m256i xv[MB];
      for (int mb = 0; mb < MB; ++mb)
        xv[mb] = _mm256_cvtepi8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + mb * k + j)));
      for (int nb = 0; nb < NB; ++nb) {
        const __m256i wv =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[nb] + j)));
        for (int mb = 0; mb < MB; ++mb)
          acc[nb][mb] = _mm256_add_epi32(acc[nb][mb], _mm256_madd_epi16(wv, xv[mb]));
      }
    }
  }
  for (; i + 16 <= k; i += 16) {
    __m256i xv[MB];
    for (int mb = 0; mb < MB; ++mb)
      xv[mb] =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + mb * k + i)));
    for (int nb = 0; nb < NB; ++nb) {
      const __m256i wv =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[nb] + i)));
      for (int mb = 0; mb < MB; ++mb)
        acc[nb][mb] = _mm256_add_epi32(acc[nb][mb], _mm256_madd_epi16(wv, xv[mb]));
    }
  }
  for (int nb = 0; nb < NB; ++nb) {
    for (int mb = 0; mb < MB; ++mb) {
      int64_t dot = simd::hsum(acc[nb][mb]);
      for (int64_t j = i; j < k; ++j) dot += int32_t(rows[nb][j]) * xq[mb * k + j];
      y[mb * ldy + n0 + nb] = detail::int8_output(dot, n0 + nb, act_scale[mb], w.quant);
    }
  }
}

template <int NB>
inline void tokens_for_weight_block(const int8_t* xq, const float* act_scale, int64_t m,
                                    const WeightView& w, int64_t n, float* y, int64_t ldy) {
  const int64_t k = w.cols;
  if (m == 1) return dot_tile<NB, 1, true>(xq, act_scale, k, w, n, y, ldy);
  if (m == 2) return dot_tile<NB, 2, true>(xq, act_scale, k, w, n, y, ldy);
  int64_t r = 0;
  for (; r + 2 <= m; r += 2)
    dot_tile<NB, 2, false>(xq + r * k, act_scale + r, k, w, n, y + r * ldy, ldy);
  if (r < m) dot_tile<NB, 1, false>(xq + r * k, act_scale + r, k, w, n, y + r * ldy, ldy);
}

struct QuantScratch {
  tensor::AlignedBuffer<int8_t> xq;
  tensor::AlignedBuffer<float> scale;
};

QuantScratch& quant_scratch(int64_t m, int64_t k) {
  thread_local QuantScratch s;
  if (s.xq.size() < size_t(m * k)) s.xq.resize(size_t(m * k));
  if (s.scale.size() < size_t(m)) s.scale.resize(size_t(m));
  return s;
}

detail::Int8Range pick_range() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512_vnni) return detail::int8_range_avx512_vnni;
  if (f.avx_vnni) return detail::int8_range_avx_vnni;
  return detail::int8_range_avx2;
}

}  // namespace

void detail::int8_range_avx2(const int8_t* xq, const float* act_scale, int64_t m,
                             const WeightView& w, float* y, int64_t ldy, int64_t n_begin,
                             int64_t n_end) {
  int64_t n = n_begin;
  if (m > kSequentialMaxRows)  // else one weight row at a time, in address order
    for (; n + 4 <= n_end; n += 4) tokens_for_weight_block<4>(xq, act_scale, m, w, n, y, ldy);
  for (; n < n_end; ++n) tokens_for_weight_block<1>(xq, act_scale, m, w, n, y, ldy);
}

void quantize_activations(const float* x, int64_t m, int64_t k, const tensor::Int8Quant& quant,
                          int8_t* xq, float* act_scale) {
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * k;
    float inv_scale = 1.0f / quant.input_scale, offset = quant.input_offset;
    act_scale[r] = 1.0f;
    if (!quant.static_activation) {
      const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
      __m256 vmax = _mm256_setzero_ps();
      int64_t c = 0;
      for (; c + 8 <= k; c += 8)
        vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(row + c), abs_mask));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, vmax);
      float amax = 0.0f;
      for (float v : lanes) amax = std::max(amax, v);
      for (; c < k; ++c) amax = std::max(amax, std::abs(row[c]));
      act_scale[r] = amax / 127.0f;
      inv_scale = amax > 0.0f ? 127.0f / amax : 0.0f;
      offset = 0.0f;
    }
    // Eight at a time with the scalar rule's exact steps: x·inv, + offset, round to nearest
    // even, clamp (so the vector and scalar parts agree bit for bit).
    const __m256 vinv = _mm256_set1_ps(inv_scale), voff = _mm256_set1_ps(offset);
    const __m256 vmin = _mm256_set1_ps(-128.0f), vmax = _mm256_set1_ps(127.0f);
    int8_t* out = xq + r * k;
    int64_t c = 0;
    for (; c + 8 <= k; c += 8) {
      __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(row + c), vinv), voff);
      v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256i i32 = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, vmin), vmax));
      const __m128i i16 =
          _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + c), _mm_packs_epi16(i16, i16));
    }
    for (; c < k; ++c) out[c] = quantize_value(row[c], inv_scale, offset);
  }
}

void linear_int8(const float* x, int64_t m, const WeightView& w, float* y, int64_t ldy,
                 common::ThreadPool& pool) {
  CHECK(w.dtype == tensor::DType::kI8 && w.quant.row_scale && w.quant.row_sum)
      << "linear_int8: not a finished int8 weight";
  if (m <= 0 || w.rows == 0) return;
  const int64_t k = w.cols;
  QuantScratch& s = quant_scratch(m, k);
  int8_t* xq = s.xq.data();
  float* scale = s.scale.data();
  pool.parallel_for(m, 4, [&](int64_t b, int64_t e, int) {
    quantize_activations(x + b * k, e - b, k, w.quant, xq + b * k, scale + b);
  });
  if (m >= kAmxMinTokens && cpu_features().amx_int8 && detail::amx_tiles_usable()) {
    // AMX reads whole 32-token × 64-byte tiles: a zero-padded copy of the quantized rows.
    const int64_t kp = (k + 63) / 64 * 64, mp = (m + 31) / 32 * 32;
    thread_local tensor::AlignedBuffer<int8_t> padded;
    if (padded.size() < size_t(mp * kp)) padded.resize(size_t(mp * kp));
    int8_t* xp = padded.data();
    pool.parallel_for(mp, 8, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r) {
        int8_t* row = xp + r * kp;
        if (r < m) {
          std::memcpy(row, xq + r * k, size_t(k));
          std::memset(row + k, 0, size_t(kp - k));
        } else {
          std::memset(row, 0, size_t(kp));
        }
      }
    });
    pool.parallel_for(w.rows, 32, [&](int64_t b, int64_t e, int) {
      detail::int8_range_amx(xp, kp, scale, m, w, y, ldy, b, e);
    });
    return;
  }
  if (m >= detail::kInt8TilesMinTokens && cpu_features().avx512_vnni) {
    const int64_t blocks = (m + 15) / 16, quads = (k + 3) / 4;
    thread_local tensor::AlignedBuffer<uint32_t> packed_scratch;
    if (packed_scratch.size() < size_t(blocks * 16 * quads))
      packed_scratch.resize(size_t(blocks * 16 * quads));
    uint32_t* packed = packed_scratch.data();
    pool.parallel_for(blocks, 1, [&](int64_t b, int64_t e, int) {
      detail::pack_int8_quads_avx512(xq, m, k, b, e, packed);
    });
    pool.parallel_for(w.rows, 16, [&](int64_t b, int64_t e, int) {
      detail::int8_tiles_range_avx512_vnni(packed, scale, m, w, y, ldy, b, e);
    });
    return;
  }
  const detail::Int8Range range = pick_range();
  // Tokens in blocks of about 512 KiB of quantized activations, so that a block stays in L2
  // while every weight row of the thread's range passes over it once.
  const int64_t block =
      std::clamp<int64_t>((int64_t{512} << 10) / std::max<int64_t>(k, 1) / 4 * 4, 16, 256);
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t t0 = 0; t0 < m; t0 += block) {
      range(xq + t0 * k, scale + t0, std::min(block, m - t0), w, y + t0 * ldy, ldy, b, e);
    }
  };
  detail::for_weight_rows(pool, w.rows, m, body);
}

void linear_int8_reference(const float* x, int64_t m, const WeightView& w, float* y, int64_t ldy) {
  std::vector<int8_t> xq(static_cast<size_t>(m * w.cols));
  std::vector<float> scale(static_cast<size_t>(m));
  quantize_activations(x, m, w.cols, w.quant, xq.data(), scale.data());
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t n = 0; n < w.rows; ++n) {
      int64_t dot = 0;
      for (int64_t c = 0; c < w.cols; ++c)
        dot += int64_t(xq[r * w.cols + c]) * w.i8()[n * w.cols + c];
      y[r * ldy + n] = detail::int8_output(dot, n, scale[r], w.quant);
    }
  }
}

void linear_int8_dequant_reference(const float* x, int64_t m, const WeightView& w, float* y,
                                   int64_t ldy) {
  const int64_t k = w.cols;
  const tensor::Int8Quant& q = w.quant;
  std::vector<int8_t> xq(static_cast<size_t>(m * k));
  std::vector<float> scale(static_cast<size_t>(m));
  quantize_activations(x, m, k, q, xq.data(), scale.data());
  std::vector<double> xd(static_cast<size_t>(k));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const double v = xq[size_t(r * k + c)];
      xd[size_t(c)] =
          q.static_activation ? (v - q.input_offset) * q.input_scale : v * scale[size_t(r)];
    }
    for (int64_t n = 0; n < w.rows; ++n) {
      const double w_scale =
          q.static_activation ? double(q.row_scale[n]) / q.input_scale : q.row_scale[n];
      double s = 0;
      for (int64_t c = 0; c < k; ++c) s += xd[size_t(c)] * (w.i8()[n * k + c] * w_scale);
      if (q.static_activation && q.row_bias) {
        s += (double(q.row_bias[n]) + double(q.input_offset) * q.row_sum[n]) * q.row_scale[n];
      }
      y[r * ldy + n] = static_cast<float>(s);
    }
  }
}

void quantize_weight_rows(const float* w, int64_t rows, int64_t cols, tensor::WeightMatrix& out) {
  out = tensor::WeightMatrix(tensor::DType::kI8, rows, cols);
  float* scale = out.mutable_row_scale();
  int8_t* q = out.mutable_i8();
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::abs(w[r * cols + c]));
    scale[r] = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = quantize_value(w[r * cols + c], inv, 0);
  }
  out.finish_int8(false);
}

tensor::WeightMatrix quantize_weight_rows(const tensor::WeightView& w) {
  tensor::WeightMatrix out(tensor::DType::kI8, w.rows, w.cols);
  float* scale = out.mutable_row_scale();
  int8_t* q = out.mutable_i8();
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < w.cols; ++c) amax = std::max(amax, std::abs(row[c] = w.at(r, c)));
    scale[r] = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t c = 0; c < w.cols; ++c) q[r * w.cols + c] = quantize_value(row[c], inv, 0);
  }
  out.finish_int8(false);
  return out;
}

}  // namespace kernels
