// chunkpipe_bench: prints the CPU line and kernel paths, the machine's FP32 FMA peak (AVX2 and,
// when active, AVX-512), vdpbf16ps peak and memory read bandwidth, GEMM GFLOP/s for the main
// shapes, a decode GEMV's read rate from memory, and prefill / decode tokens per second of a
// random-weight DeepSeek-V3-shaped model (docs perf-targets: `tiny` and `small` dims) at the
// requested thread counts, each as a percentage of its roof: FMA peak for prefill (attention
// excluded; a third of the AMX-BF16 tile peak for BF16 weights on AMX; the vdpbf16ps peak with
// --activations bf16 without AMX), bandwidth for decode. Decode runs in 8 windows with a pass of
// the read roof before each, and a second line gives its read rate against that roof.
//
//   chunkpipe_bench [--model small|tiny] [--threads 1,2] [--prefill 512] [--decode 128]
//                   [--model-dir DIR]  (a checkpoint instead, loaded as serve loads it: FP8 in
//                   place, BF16, W8A8; its MTP layers left out)
//                   [--long-prefill 4096] [--skip-gemm] [--skip-model] [--dtype bf16|f32|w8a8]
//                   [--lm-head-int8]  (the lm_head in int8, model::LoadOptions::lm_head_int8)
//                   [--activations auto|f32|bf16]  (kernels::ActivationPrecision of the model
//                   run; auto is what `serve --dtype auto` picks for these weights: bf16 for
//                   BF16 and W8A8 checkpoints, whose torch_dtype is bfloat16, f32 for f32)
//                   [--decode-depth N]  (decode after N tokens of context, as llama-bench's
//                   -d N; the roof then counts the latent cache's bytes per step too)
//                   [--kv-cache-dtype f32|bf16]  (the latent cache's dtype, model::KvCacheDtype)
//                   [--decode-attention 1024,16384]  (mla_decode_attention alone, one query
//                   token of the model's dims over an f32 cache of each context length)
//                   [--v3-linears]  (DeepSeek-V3's own linears in FP8, BF16, I8 and F32: decode
//                   GEMV from memory and prefill of --prefill rows)
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "common/timer.h"
#include "cpu_line.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/int8_linear.h"
#include "kernels/mla_attention.h"
#include "model/deepseek_v3.h"
#include "model/kv_cache.h"
#include "model/weight_census.h"
#include "tensor/aligned_buffer.h"

namespace {

// Runs body(t) on `threads` threads at once and returns the GFLOP/s of flops_per_thread each;
// body returns a value of its chains so that the compiler keeps them.
double gflops_on_threads(int threads, double flops_per_thread,
                         const std::function<float(int)>& body) {
  std::vector<std::thread> workers;
  std::vector<float> sink(threads);
  const double t0 = common::now_seconds();
  for (int t = 0; t < threads; ++t) workers.emplace_back([&, t] { sink[t] = body(t); });
  for (auto& w : workers) w.join();
  const double secs = common::now_seconds() - t0;
  return threads * flops_per_thread / secs / 1e9 + 0.0 * sink[0];
}

// Ten independent FMA chains per thread keep both FMA ports busy.
double fma_peak_gflops(int threads) {
  const int64_t iters = 100'000'000;
  return gflops_on_threads(threads, iters * 10.0 * 16.0, [&](int t) {
    __m256 acc[10];
    for (int i = 0; i < 10; ++i) acc[i] = _mm256_set1_ps(0.001f * (i + t));
    const __m256 a = _mm256_set1_ps(0.9999f), b = _mm256_set1_ps(0.0001f);
    for (int64_t it = 0; it < iters; ++it) {
      for (int i = 0; i < 10; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    }
    __m256 s = acc[0];
    for (int i = 1; i < 10; ++i) s = _mm256_add_ps(s, acc[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0];
  });
}

// The same with 512-bit registers (two FMA units on most AVX-512 server parts, one on some).
double fma_peak_gflops_avx512(int threads) {
  const int64_t iters = 100'000'000;
  return gflops_on_threads(
      threads, iters * 10.0 * 32.0, [&](int t) __attribute__((target("avx512f"))) {
        __m512 acc[10];
        for (int i = 0; i < 10; ++i) acc[i] = _mm512_set1_ps(0.001f * (i + t));
        const __m512 a = _mm512_set1_ps(0.9999f), b = _mm512_set1_ps(0.0001f);
        for (int64_t it = 0; it < iters; ++it) {
          for (int i = 0; i < 10; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
        }
        __m512 s = acc[0];
        for (int i = 1; i < 10; ++i) s = _mm512_add_ps(s, acc[i]);
        alignas(64) float out[16];
        _mm512_store_ps(out, s);
        return out[0];
      });
}

// vdpbf16ps peak: ten independent chains per thread, 64 FLOP each (16 lanes of two bf16
// products). Call only when cpu_features().avx512_bf16.
double dpbf16_peak_gflops(int threads) {
  const int64_t iters = 50'000'000;
  return gflops_on_threads(
      threads, iters * 10.0 * 64.0, [&](int t) __attribute__((target("avx512f,avx512bf16"))) {
        __m512 acc[10];
        for (int i = 0; i < 10; ++i) acc[i] = _mm512_set1_ps(0.001f * (i + t));
        const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);
        const __m512bh b = (__m512bh)_mm512_set1_epi32(0x38003800);
        for (int64_t it = 0; it < iters; ++it) {
          for (int i = 0; i < 10; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        }
        __m512 s = acc[0];
        for (int i = 1; i < 10; ++i) s = _mm512_add_ps(s, acc[i]);
        alignas(64) float out[16];
        _mm512_store_ps(out, s);
        return out[0];
      });
}

// AMX-BF16 tile peak: four independent tdpbf16ps chains per thread (16×16 f32 tiles, 32 bf16
// deep: 16384 FLOP each). Call only when kernels::amx_bf16_active().
__attribute__((target("amx-tile,amx-bf16"))) double amx_bf16_peak_gflops(int threads) {
  const int64_t iters = 20'000'000;
  std::vector<std::thread> workers;
  const double t0 = common::now_seconds();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([]() __attribute__((target("amx-tile,amx-bf16"))) {
      alignas(64) uint8_t cfg[64] = {};
      cfg[0] = 1;  // palette 1: bytes 16.. hold each tile's bytes per row, 48.. its rows
      for (int tile = 0; tile < 8; ++tile) {
        cfg[16 + 2 * tile] = 64;
        cfg[48 + tile] = 16;
      }
      alignas(64) static thread_local uint16_t data[16 * 32];
      asm volatile("" : : "r"(cfg) : "memory");  // GCC 12 dropped the stores above
      _tile_loadconfig(cfg);
      _tile_loadd(4, data, 64);
      _tile_loadd(5, data, 64);
      _tile_loadd(6, data, 64);
      _tile_loadd(7, data, 64);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t it = 0; it < iters; ++it) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_release();
    });
  }
  for (auto& w : workers) w.join();
  const double secs = common::now_seconds() - t0;
  return threads * iters * 4.0 * 16384.0 / secs / 1e9;
}

// Memory read rate: each thread sums its slice of a buffer far beyond the caches. An
// AlignedBuffer, as the weights are: transparent huge pages where the kernel grants them (THP
// "madvise"), so the roof is not lowered by TLB misses the weights do not pay. On a 2-core Zen 4,
// 4 KiB pages read 31.6-32.5 GB/s on two threads, huge pages 33.9-35.3.
class ReadRoof {
 public:
  explicit ReadRoof(size_t bytes) : buffer_(bytes / sizeof(float)) {
    std::fill(buffer_.data(), buffer_.data() + buffer_.size(), 1.0f);
  }
  size_t bytes() const { return buffer_.size() * sizeof(float); }

  // Seconds one pass over the whole buffer takes on `threads` threads.
  double pass_seconds(int threads) const {
    std::vector<std::thread> workers;
    std::vector<float> sink(threads);
    const double t0 = common::now_seconds();
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const size_t per = buffer_.size() / threads, b = per * t, e = b + per;
        const float* p = buffer_.data();
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t i = b; i + 32 <= e; i += 32) {
          a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
          a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
          a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
          a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
        }
        float out[8];
        _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        sink[t] = out[0];
      });
    }
    for (auto& w : workers) w.join();
    return common::now_seconds() - t0 + 0.0 * sink[0];
  }

 private:
  tensor::AlignedBuffer<float> buffer_;
};

// The roof: best of 3 passes over 1 GiB, in GB/s.
double read_bandwidth_gbs(int threads) {
  const ReadRoof roof(size_t{1} << 30);
  double best = 1e30;
  for (int pass = 0; pass < 3; ++pass) best = std::min(best, roof.pass_seconds(threads));
  return roof.bytes() / best / 1e9;
}

template <typename Fn>
double best_seconds(Fn fn, double min_total = 0.3, int min_reps = 3) {
  fn();  // warm-up
  double best = 1e30, total = 0;
  for (int rep = 0; rep < min_reps || total < min_total; ++rep) {
    const double t0 = common::now_seconds();
    fn();
    const double dt = common::now_seconds() - t0;
    best = std::min(best, dt);
    total += dt;
    if (rep > 200) break;
  }
  return best;
}

// Decode's GEMV from memory: one activation row through linear() (BF16) or linear_int8() (W8A8)
// against 512 MB of matrices of one shape laid end to end (far past any last-level cache, on
// huge pages as the weights are), each read once per pass. Prints the weight bytes read per
// second and their percentage of the read roof; the best of three passes.
void bench_gemv_from_memory(const std::vector<int>& thread_counts,
                            const std::vector<double>& bandwidths) {
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {{"small expert down", 2048, 512},
                          {"small expert gate_up", 1024, 2048},
                          {"small o_proj", 2048, 2048}};
  const int64_t total_bytes = int64_t{512} << 20;
  std::printf("\n== decode GEMV from memory: 1 activation row, 512 MB of weights per pass ==\n");
  std::printf("%-22s %-5s %6s %6s | %7s %26s\n", "shape", "W", "N", "K", "threads",
              "GB/s (% of read roof)");
  for (const Shape& shape : shapes) {
    for (const tensor::DType dt : {tensor::DType::kBF16, tensor::DType::kI8}) {
      const int64_t per = shape.n * shape.k, elem = tensor::dtype_size_bytes(dt);
      const int64_t count = total_bytes / (per * elem);
      tensor::AlignedBuffer<uint8_t> weights(static_cast<size_t>(count * per * elem));
      for (size_t i = 0; i < weights.size(); ++i)
        weights[i] = dt == tensor::DType::kI8 ? static_cast<uint8_t>(i * 37 + 11)
                                              : static_cast<uint8_t>(i & 1 ? 0x3f : 0x80 + (i & 6));
      // Per-row parameters shared by every int8 matrix (the GEMV reads them once per row).
      std::vector<float> row_scale(static_cast<size_t>(shape.n), 0.01f);
      std::vector<int32_t> row_sum(static_cast<size_t>(shape.n), 0);
      std::vector<float> x(shape.k, 0.5f), y(shape.n);
      for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
        common::ThreadPool pool(thread_counts[ti]);
        const double seconds = best_seconds(
            [&] {
              for (int64_t j = 0; j < count; ++j) {
                tensor::WeightView w;
                w.dtype = dt;
                w.rows = shape.n;
                w.cols = shape.k;
                w.data = weights.data() + j * per * elem;
                if (dt == tensor::DType::kI8) {
                  w.quant.row_scale = row_scale.data();
                  w.quant.row_sum = row_sum.data();
                  kernels::linear_int8(x.data(), 1, w, y.data(), shape.n, pool);
                } else {
                  kernels::linear(x.data(), 1, w, y.data(), pool);
                }
              }
            },
            0.0, 3);
        const double gbs = double(count * per * elem) / seconds / 1e9;
        std::printf("%-22s %-5s %6lld %6lld | %7d %14.1f (%3.0f%%)\n", shape.name,
                    std::string(tensor::dtype_name(dt)).c_str(), static_cast<long long>(shape.n),
                    static_cast<long long>(shape.k), thread_counts[ti], gbs,
                    100 * gbs / bandwidths[ti]);
      }
    }
  }
}

// A [n, k] weight of DeepSeek-V3's shapes in `dt` (FP8 with 128x128 block scales, BF16, I8
// per-row W8A8 or F32), with deterministic values of the checkpoint's magnitudes.
tensor::WeightMatrix v3_weight(tensor::DType dt, int64_t n, int64_t k) {
  const int64_t count = n * k;
  if (dt == tensor::DType::kI8) {
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) v[i] = float((i * 2654435761u) % 1000) * 1e-5f - 5e-3f;
    tensor::WeightMatrix m;
    kernels::quantize_weight_rows(v.data(), n, k, m);
    return m;
  }
  tensor::WeightMatrix m(dt, n, k);
  for (int64_t i = 0; i < count; ++i) {
    const float v = float((i * 2654435761u) % 1000) * 1e-5f - 5e-3f;
    if (dt == tensor::DType::kF8E4M3) {
      m.mutable_bytes()[i] = static_cast<uint8_t>((i * 37 + 11) & 0xfe);  // no NaN code
    } else if (dt == tensor::DType::kBF16) {
      m.mutable_bf16()[i] = tensor::f32_to_bf16(v);
    } else {
      m.mutable_f32()[i] = v;
    }
  }
  if (dt == tensor::DType::kF8E4M3) {
    float* scale = m.mutable_fp8_scale(128, 7);
    for (size_t i = 0; i < m.fp8_scale_count(); ++i) scale[i] = 1e-4f * float(1 + i % 7);
  }
  return m;
}

// DeepSeek-V3's own linears (hidden 7168, 128 heads, experts of 2048, TP 1) through linear()
// for each weight dtype: decode's GEMV from memory (copies laid end to end past 512 MB, each
// read once per pass; GB/s and % of the read roof, and the weight rows per second) and prefill
// of `prefill_rows` tokens (GFLOP/s and % of the FMA peak).
void bench_v3_linears(const std::vector<int>& thread_counts, const std::vector<double>& peaks,
                      const std::vector<double>& bandwidths, int64_t prefill_rows) {
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {{"q_a_proj", 1536, 7168},       {"q_b_proj", 24576, 1536},
                          {"kv_a_proj", 576, 7168},       {"o_proj", 7168, 16384},
                          {"expert gate_up", 4096, 7168}, {"expert down", 7168, 2048}};
  const tensor::DType dtypes[] = {tensor::DType::kF8E4M3, tensor::DType::kBF16, tensor::DType::kI8,
                                  tensor::DType::kF32};
  std::printf(
      "\n== DeepSeek-V3 linears: decode GEMV from memory (GB/s of weights, %% of read roof, "
      "microseconds per matrix) and prefill M=%lld (GFLOP/s, %% of FMA peak) ==\n",
      static_cast<long long>(prefill_rows));
  std::printf("%-15s %-7s %6s %6s | %7s %22s %10s %20s\n", "shape", "W", "N", "K", "threads",
              "decode GB/s (% roof)", "us/matrix", "prefill GFLOP/s (%)");
  for (const Shape& s : shapes) {
    for (const tensor::DType dt : dtypes) {
      const tensor::WeightMatrix one = v3_weight(dt, s.n, s.k);
      const int64_t bytes = int64_t(one.size_bytes());
      const int64_t copies = std::max<int64_t>(1, (int64_t{512} << 20) / bytes + 1);
      std::vector<tensor::WeightMatrix> mats;
      for (int64_t c = 0; c < copies; ++c) mats.push_back(v3_weight(dt, s.n, s.k));
      std::vector<float> x(static_cast<size_t>(prefill_rows * s.k)), y(size_t(prefill_rows * s.n));
      for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 17) * 0.01f - 0.08f;
      for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
        common::ThreadPool pool(thread_counts[ti]);
        const double decode_s = best_seconds(
            [&] {
              for (const auto& m : mats) kernels::linear(x.data(), 1, m.view(), y.data(), pool);
            },
            0.0, 3);
        const double gbs = double(copies * bytes) / decode_s / 1e9;
        const double prefill_s = best_seconds(
            [&] { kernels::linear(x.data(), prefill_rows, one.view(), y.data(), pool); }, 0.0, 2);
        const double gflops = 2.0 * double(prefill_rows * s.n * s.k) / prefill_s / 1e9;
        std::printf("%-15s %-7s %6lld %6lld | %7d %14.1f (%3.0f%%) %10.1f %12.1f (%3.0f%%)\n",
                    s.name, std::string(tensor::dtype_name(dt)).c_str(),
                    static_cast<long long>(s.n), static_cast<long long>(s.k), thread_counts[ti],
                    gbs, 100 * gbs / bandwidths[ti], 1e6 * decode_s / double(copies), gflops,
                    100 * gflops / peaks[ti]);
        std::fflush(stdout);
      }
    }
  }
}

void bench_gemm(const std::vector<int>& thread_counts, const std::vector<double>& peaks,
                const std::vector<double>& dpbf16_peaks) {
  struct Shape {
    int64_t n, k;
    const char* what;
  };
  const Shape shapes[] = {{2048, 2048, "square 2048"},
                          {1024, 2048, "expert gate_up (small)"},
                          {512, 512, "expert gate_up (cpp)"},
                          {2048, 7168, "K=7168"}};
  std::printf(
      "\n== GEMM y[M,N] = x[M,K]·W[N,K]^T, f32 activations (GFLOP/s, %% of FMA peak; bf16-act-dot "
      "and -gemv: activations rounded to bf16, %% of the vdpbf16ps peak) ==\n");
  std::printf("%-24s %-5s %5s %7s %7s | %-8s", "shape", "W", "M", "N", "K", "threads");
  std::printf(" %17s %17s %17s %17s %17s %17s %17s\n", "streaming(ours)", "openblas-tiles",
              "amx-packed", "amx-row-major", "linear()", "bf16-act-dot", "bf16-act-gemv");
  for (const Shape& s : shapes) {
    for (tensor::DType dt : {tensor::DType::kBF16, tensor::DType::kF32, tensor::DType::kI8}) {
      tensor::WeightMatrix w(dt == tensor::DType::kI8 ? tensor::DType::kF32 : dt, s.n, s.k);
      for (int64_t i = 0; i < s.n * s.k; ++i) {
        float v = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        if (dt == tensor::DType::kBF16) {
          w.mutable_bf16()[i] = tensor::f32_to_bf16(v);
        } else {
          w.mutable_f32()[i] = v;
        }
      }
      if (dt == tensor::DType::kI8) {
        tensor::WeightMatrix q;
        kernels::quantize_weight_rows(w.mutable_f32(), s.n, s.k, q);
        w = std::move(q);
      }
      const bool int8 = dt == tensor::DType::kI8;
      for (int64_t m : {1, 4, 8, 16, 24, 32, 64, 128, 256, 512, 2048}) {
        std::vector<float> x(m * s.k, 0.01f), y(m * s.n);
        for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
          common::ThreadPool pool(thread_counts[ti]);
          const double flops = 2.0 * m * s.n * s.k;
          auto run = [&](auto fn) { return flops / best_seconds(fn) / 1e9; };
          double g_stream = m <= 256 && !int8 ? run([&] {
            kernels::linear_streaming(x.data(), m, w.view(), y.data(), s.n, pool);
          })
                                              : 0;
          double g_blas =
              int8 ? 0
                   : run([&] { kernels::linear_blas(x.data(), m, w.view(), y.data(), s.n, pool); });
          // The two AMX-BF16 forms (BF16 weights): weights packed per call, and read in place.
          const bool amx = dt == tensor::DType::kBF16 && kernels::amx_bf16_active();
          double g_amx_packed = 0, g_amx_row_major = 0;
          if (amx) {
            kernels::Bf16x3Activations split;
            g_amx_packed = run([&] {
              kernels::split_bf16x3(x.data(), s.k, m, s.k, split, pool);
              kernels::linear_amx(split, kernels::AmxWeightRows{w.view().bf16(), nullptr}, s.n,
                                  kernels::AmxOutput{y.data(), s.n}, pool);
            });
            g_amx_row_major = run(
                [&] { kernels::linear_amx_row_major(x.data(), m, w.view(), y.data(), s.n, pool); });
          }
          double g_auto = run([&] { kernels::linear(x.data(), m, w.view(), y.data(), pool); });
          // Activations rounded to bf16 (ActivationPrecision::kBf16), vdpbf16ps.
          const double g_dot =
              dt == tensor::DType::kBF16 && kernels::cpu_features().avx512_bf16 ? run([&] {
                kernels::linear_bf16_dot(x.data(), m, w.view(), y.data(), s.n, pool);
              })
                                                                                : 0;
          // Its GEMV form, which linear() takes below kBf16DotMinRows rows.
          const double g_gemv =
              dt == tensor::DType::kBF16 && kernels::cpu_features().avx512_bf16 && m <= 32
                  ? run([&] {
                      kernels::linear_bf16_gemv(x.data(), m, w.view(), y.data(), s.n, pool);
                    })
                  : 0;
          auto cell = [&](double g, double peak) {
            char buf[32];
            if (g == 0) return std::string("-");
            std::snprintf(buf, sizeof(buf), "%7.1f (%3.0f%%)", g, 100 * g / peak);
            return std::string(buf);
          };
          const double p = peaks[ti];
          std::printf(
              "%-24s %-5s %5lld %7lld %7lld | %-8d %17s %17s %17s %17s %17s %17s %17s\n", s.what,
              std::string(tensor::dtype_name(dt)).c_str(), static_cast<long long>(m),
              static_cast<long long>(s.n), static_cast<long long>(s.k), thread_counts[ti],
              cell(g_stream, p).c_str(), cell(g_blas, p).c_str(), cell(g_amx_packed, p).c_str(),
              cell(g_amx_row_major, p).c_str(), cell(g_auto, p).c_str(),
              cell(g_dot, dpbf16_peaks[ti]).c_str(), cell(g_gemv, dpbf16_peaks[ti]).c_str());
        }
      }
    }
  }
}

model::ModelConfig perf_model_config(const std::string& name) {
  model::ModelConfig c;
  c.model_type = "deepseek_v3";
  c.vocab_size = 32768;
  c.qk_rope_head_dim = name == "small" ? 64 : 32;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.yarn.enabled = true;
  c.yarn.factor = 40;
  c.yarn.mscale = 1;
  c.yarn.mscale_all_dim = 1;
  c.scoring_func = kernels::ScoringFunc::kSigmoid;
  c.topk_method = kernels::TopkMethod::kNoauxTc;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  c.first_k_dense_replace = 1;
  if (name == "small") {
    c.hidden_size = 2048;
    c.num_hidden_layers = 6;
    c.num_attention_heads = 16;
    c.q_lora_rank = 768;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.v_head_dim = 128;
    c.n_routed_experts = 64;
    c.num_experts_per_tok = 6;
    c.n_group = 8;
    c.topk_group = 4;
    c.n_shared_experts = 2;
    c.moe_intermediate_size = 512;
    c.intermediate_size = 4096;
  } else {
    c.hidden_size = 512;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.q_lora_rank = 256;
    c.kv_lora_rank = 128;
    c.qk_nope_head_dim = 64;
    c.v_head_dim = 64;
    c.n_routed_experts = 16;
    c.num_experts_per_tok = 4;
    c.n_group = 1;
    c.topk_group = 1;
    c.n_shared_experts = 1;
    c.moe_intermediate_size = 256;
    c.intermediate_size = 1280;
  }
  c.num_key_value_heads = c.num_attention_heads;
  c.max_position_embeddings = 163840;
  return c;
}

// Weights one token reads: elements at the weight dtype, and those kept in f32 (the router, as
// model::random_weights stores it). The embedding row is left out.
struct TokenWeights {
  double main = 0;      // projections and MLPs: int8 in W8A8
  double float_ = 0;    // lm_head: BF16 in W8A8
  double absorbed = 0;  // kv_b_proj as decode reads it (absorb_uk_t, absorb_uv): BF16 in W8A8
  double f32 = 0;
};
TokenWeights weights_per_token(const model::ModelConfig& c) {
  const double h = c.hidden_size, nh = c.num_attention_heads;
  const double qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  TokenWeights w;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    w.main += c.q_lora_rank ? h * *c.q_lora_rank + *c.q_lora_rank * nh * qk : h * nh * qk;
    w.main += h * (c.kv_lora_rank + c.qk_rope_head_dim) + nh * c.v_head_dim * h;
    w.absorbed += c.kv_lora_rank * nh * (c.qk_nope_head_dim + c.v_head_dim);
    if (layer < c.first_k_dense_replace) {
      w.main += 3 * h * c.intermediate_size;
    } else {
      w.f32 += h * c.n_routed_experts;
      w.main += (c.n_shared_experts + c.num_experts_per_tok) * 3 * h * c.moe_intermediate_size;
    }
  }
  w.float_ += double(c.vocab_size) * h;  // lm_head
  return w;
}

// Prefill of `n` tokens in one forward (fresh cache), then `decode` single-token steps after
// `depth` tokens of context.
// The absorbed-form decode attention alone (kernels::mla_decode_attention), the model's heads
// and latent over a paged cache of each context length (f32, blocks of 128 in order, far past
// the last-level cache at the longest): one query token per call, as a decode step runs it per
// layer. Prints ms per call, GFLOP/s (% of the FMA peak: the kernel is compute-bound once each
// byte is read once) and the cache bytes read per second (% of the read roof).
void bench_decode_attention(const std::string& name, const std::vector<int64_t>& contexts,
                            const std::vector<int>& thread_counts, const std::vector<double>& peaks,
                            const std::vector<double>& bandwidths) {
  const model::ModelConfig c = perf_model_config(name);
  const int heads = c.num_attention_heads, r = c.kv_lora_rank, dr = c.qk_rope_head_dim;
  const int64_t row = r + dr, bs = 128;
  std::printf("\n== decode attention of '%s' (%d heads, latent %d + %d), one query token ==\n",
              name.c_str(), heads, r, dr);
  std::printf("%8s %7s | %9s %26s %24s\n", "context", "threads", "ms", "GFLOP/s (% of FMA peak)",
              "cache GB/s (% of roof)");
  for (const int64_t ctx : contexts) {
    const int64_t blocks = (ctx + bs - 1) / bs;
    tensor::AlignedBuffer<float> cache(static_cast<size_t>(blocks * bs * row));
    for (size_t i = 0; i < cache.size(); ++i) cache[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    std::vector<float> q(static_cast<size_t>(heads * row)), out(static_cast<size_t>(heads * r));
    for (size_t i = 0; i < q.size(); ++i) q[i] = 0.003f * static_cast<float>(i % 89) - 0.1f;
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    kernels::MlaDecodeArgs a;
    a.num_heads = heads;
    a.kv_lora_rank = r;
    a.rope_dim = dr;
    a.num_queries = 1;
    a.context_len = ctx;
    a.scale = 0.05f;
    a.q = q.data();
    a.cache = cache.data();
    a.block_table = table.data();
    a.block_size = static_cast<int>(bs);
    a.out = out.data();
    const double flops = double(heads) * double(ctx) * double(2 * row + 2 * r);
    for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
      common::ThreadPool pool(thread_counts[ti]);
      const double seconds = best_seconds([&] { kernels::mla_decode_attention(a, pool); }, 0.5, 5);
      const double gflops = flops / seconds / 1e9;
      const double gbs = double(ctx * row * 4) / seconds / 1e9;
      std::printf("%8lld %7d | %9.3f %17.1f (%3.0f%%) %15.1f (%3.0f%%)\n",
                  static_cast<long long>(ctx), thread_counts[ti], seconds * 1e3, gflops,
                  100 * gflops / peaks[ti], gbs, 100 * gbs / bandwidths[ti]);
    }
  }
}

// Prefill and decode of a whole model `m` (see bench_model); `decode_bytes` and `prefill_flops`
// are per token, for the roofs.
void bench_model_run(model::DeepseekV3Model& m, const std::vector<int>& thread_counts,
                     const std::vector<double>& peaks, const std::vector<double>& bandwidths,
                     int prefill, int decode, int long_prefill, int depth,
                     model::KvCacheDtype kv_dtype, double decode_bytes, double prefill_flops) {
  const model::ModelConfig& c = m.config();
  const int bs = 128;
  const int64_t max_tokens = std::max({prefill + decode, long_prefill, depth + decode});
  const int64_t nb = (max_tokens + bs - 1) / bs;
  model::LatentKvCache cache(c.num_total_layers(), 0, c.num_hidden_layers, nb, bs,
                             c.kv_cache_row_dim(), 0, kv_dtype);
  std::vector<int32_t> table(nb);
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> ids(max_tokens);
  for (int64_t i = 0; i < max_tokens; ++i)
    ids[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
  std::vector<float> hidden, logits(c.vocab_size);
  auto forward = [&](common::ThreadPool& pool, int64_t start, int64_t n) {
    model::ForwardBatch batch;
    batch.sequences.push_back({std::span<const int32_t>(ids.data() + start, n), start, table});
    hidden.assign(n * c.hidden_size, 0.0f);
    CHECK(m.embed(batch, hidden.data()).ok()) << "forward failed";
    CHECK(m.run_layers(batch, 0, c.num_hidden_layers, hidden.data(), cache, pool).ok())
        << "forward failed";
    m.final_norm(hidden.data() + (n - 1) * c.hidden_size, 1, hidden.data());
    CHECK(m.compute_logits(hidden.data(), 1, logits.data(), pool).ok()) << "forward failed";
  };
  std::printf(
      "per token: %.1f MB of weights (decode reads them all), %.2f GFLOP of linear "
      "layers (prefill; attention and the last token's head excluded)\n",
      decode_bytes / 1e6, prefill_flops / 1e9);
  // A step at depth also reads the latent cache of every layer up to its position.
  const double kv_bytes = double(c.num_hidden_layers) * double(c.kv_cache_row_dim()) *
                          double(model::LatentKvCache::value_bytes(kv_dtype)) *
                          (depth + (decode - 1) / 2.0);
  if (depth > 0) {
    std::printf("decode after %d tokens of context, %s latent cache: %.1f MB of it per step\n",
                depth, model::kv_cache_dtype_name(kv_dtype), kv_bytes / 1e6);
  }
  const double step_bytes = decode_bytes + (depth > 0 ? kv_bytes : 0.0);
  std::printf("%-8s %24s %24s", "threads", "prefill tok/s (% roof)", "decode tok/s (% roof)");
  if (long_prefill > 0) std::printf(" %20s", "long prefill tok/s");
  std::printf("\n");
  for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
    const int threads = thread_counts[ti];
    const double prefill_roof = peaks[ti] * 1e9 / prefill_flops;
    const double decode_roof = bandwidths[ti] * 1e9 / step_bytes;
    common::ThreadPool pool(threads);
    const ReadRoof roof(size_t{256} << 20);
    forward(pool, 0, std::min(prefill, 64));  // warm-up
    double tp = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      const double a = common::now_seconds();
      forward(pool, 0, prefill);
      tp = std::min(tp, common::now_seconds() - a);
    }
    // The context, untimed, in chunks of at most 2048 tokens.
    for (int64_t at = 0; at < depth; at += 2048)
      forward(pool, at, std::min<int64_t>(2048, depth - at));
    // Decode from `depth` (0: an empty context, as llama-bench's tg test does), in windows with a
    // pass of the read roof before each: on a machine whose bandwidth drifts (a VM whose second
    // core comes and goes), the roof at the start can be another machine's than the decode's.
    constexpr int kWindows = 8;
    double td = 0, roof_seconds = 0, roof_bytes = 0;
    for (int wi = 0, i = 0; wi < kWindows; ++wi) {
      roof_seconds += roof.pass_seconds(threads);
      roof_bytes += double(roof.bytes());
      const double b = common::now_seconds();
      for (const int end = decode * (wi + 1) / kWindows; i < end; ++i) forward(pool, depth + i, 1);
      td += common::now_seconds() - b;
    }
    const double interleaved_gbs = roof_bytes / roof_seconds / 1e9;
    char pre[64], dec[64];
    std::snprintf(pre, sizeof(pre), "%.1f (%.0f%% of %.0f)", prefill / tp,
                  100 * prefill / tp / prefill_roof, prefill_roof);
    std::snprintf(dec, sizeof(dec), "%.1f (%.0f%% of %.1f)", decode / td,
                  100 * decode / td / decode_roof, decode_roof);
    std::printf("%-8d %24s %24s", threads, pre, dec);
    if (long_prefill > 0) {
      const double l = common::now_seconds();
      forward(pool, 0, long_prefill);
      std::printf(" %20.1f", long_prefill / (common::now_seconds() - l));
    }
    std::printf("\n");
    if (decode > 0) {
      std::printf(
          "  decode against the roof read between its %d windows (%.1f GB/s): %.1f GB/s, %.0f%%\n",
          kWindows, interleaved_gbs, decode * step_bytes / td / 1e9,
          100 * decode * step_bytes / td / 1e9 / interleaved_gbs);
    }
    std::fflush(stdout);
  }
}

void bench_model(const std::string& name, tensor::DType dtype, bool lm_head_int8,
                 const std::vector<int>& thread_counts, const std::vector<double>& peaks,
                 const std::vector<double>& bandwidths, int prefill, int decode, int long_prefill,
                 int depth, model::KvCacheDtype kv_dtype) {
  model::ModelConfig c = perf_model_config(name);
  const double t0 = common::now_seconds();
  model::ModelWeights weights = model::random_weights(c, dtype, 1);
  if (lm_head_int8) model::quantize_lm_head_int8(weights);
  model::DeepseekV3Model m(c, std::move(weights));
  std::printf(
      "\n== model '%s' (%s weights%s%s, random), built in %.1f s ==\n", name.c_str(),
      dtype == tensor::DType::kBF16 ? "bf16" : (dtype == tensor::DType::kI8 ? "w8a8" : "f32"),
      lm_head_int8 ? ", int8 lm_head" : "",
      kernels::activation_precision() == kernels::ActivationPrecision::kBf16
          ? ", activations rounded to bf16 before BF16 weights"
          : "",
      common::now_seconds() - t0);
  const TokenWeights tw = weights_per_token(c);
  const bool w8a8 = dtype == tensor::DType::kI8;
  const double float_bytes = w8a8 ? 2 : tensor::dtype_size_bytes(dtype);
  const double head_bytes = lm_head_int8 ? 1 : float_bytes;
  const double decode_bytes = tw.main * tensor::dtype_size_bytes(dtype) + tw.float_ * head_bytes +
                              tw.absorbed * float_bytes + tw.f32 * 4;
  // A prefill computes the head for its last token only.
  const double prefill_flops = 2 * (tw.main + tw.absorbed + tw.f32);
  bench_model_run(m, thread_counts, peaks, bandwidths, prefill, decode, long_prefill, depth,
                  kv_dtype, decode_bytes, prefill_flops);
}

// A loaded matrix's bytes as decode streams them (FP8 with its block scales, int8 with its per-row
// scale) and its multiply-adds per token.
struct MatrixCost {
  double bytes = 0, elements = 0;
  void add(const tensor::WeightMatrix& m, double share = 1.0) {
    if (m.empty()) return;
    double b = double(m.size_bytes());
    if (m.dtype() == tensor::DType::kF8E4M3) b += double(m.fp8_scale_count()) * 4;
    if (m.dtype() == tensor::DType::kI8) b += double(m.rows()) * 4;
    bytes += share * b;
    elements += share * double(m.rows()) * double(m.cols());
  }
  void add(const model::MlpWeights& w, double share = 1.0) {
    add(w.gate_up, share);
    add(w.down, share);
  }
};

// What one token reads from a loaded model: every attention projection (the absorbed form's
// copies, not kv_b_proj), the dense MLPs, the router and shared experts, top_k of the routed
// experts (their mean), and with `head` the lm_head; the embedding row is left out.
MatrixCost per_token_cost(const model::DeepseekV3Model& m, bool head) {
  const model::ModelConfig& c = m.config();
  const model::ModelWeights& w = m.weights();
  MatrixCost cost;
  for (const model::DecoderLayerWeights& l : w.layers) {
    const model::AttentionWeights& a = l.attn;
    for (const tensor::WeightMatrix* x : {&a.q_a_proj, &a.q_b_proj, &a.q_proj, &a.kv_a_proj,
                                          &a.absorb_uk_t, &a.absorb_uv, &a.o_proj})
      cost.add(*x);
    if (l.dense_mlp) cost.add(*l.dense_mlp);
    if (l.moe) {
      cost.add(l.moe->router);
      if (l.moe->shared) cost.add(*l.moe->shared);
      const double share =
          double(c.num_experts_per_tok) / double(std::max<size_t>(l.moe->experts.size(), 1));
      for (const model::MlpWeights& e : l.moe->experts) cost.add(e, share);
    }
  }
  if (head) cost.add(w.lm_head);
  return cost;
}

// A checkpoint as `serve` loads it (its dtypes as stored: FP8 in place, BF16, W8A8), without MTP.
void bench_checkpoint(const std::string& dir, const std::vector<int>& thread_counts,
                      const std::vector<double>& peaks, const std::vector<double>& bandwidths,
                      int prefill, int decode, int long_prefill, int depth,
                      model::KvCacheDtype kv_dtype) {
  const double t0 = common::now_seconds();
  auto loaded = model::DeepseekV3Model::load(dir, {.load_mtp = false});
  if (!loaded.ok()) {
    std::fprintf(stderr, "error: %s\n", loaded.status().message().c_str());
    std::exit(1);
  }
  model::DeepseekV3Model& m = **loaded;
  const model::ModelConfig& c = m.config();
  std::printf(
      "\n== checkpoint %s: hidden %lld, %d layers (%d dense), %d experts of %lld (top %d), "
      "vocabulary %lld; %s; loaded in %.1f s ==\n",
      dir.c_str(), static_cast<long long>(c.hidden_size), c.num_hidden_layers,
      c.first_k_dense_replace, c.n_routed_experts, static_cast<long long>(c.moe_intermediate_size),
      c.num_experts_per_tok, static_cast<long long>(c.vocab_size),
      model::census_line(model::weight_census(m.weights())).c_str(), common::now_seconds() - t0);
  // Decode reads the head every token; a prefill computes it for its last token only.
  bench_model_run(m, thread_counts, peaks, bandwidths, prefill, decode, long_prefill, depth,
                  kv_dtype, per_token_cost(m, true).bytes, 2 * per_token_cost(m, false).elements);
}

template <typename T = int>
std::vector<T> parse_list(const std::string& s) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) out.push_back(static_cast<T>(std::stoll(tok)));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "small", dtype_name = "bf16", activations = "auto", model_dir;
  std::vector<int> threads = {1, 2};
  int prefill = 512, decode = 128, long_prefill = 0, depth = 0;
  std::string kv_cache_dtype = "f32";
  std::vector<int64_t> attention_contexts;
  bool skip_gemm = false, skip_model = false, lm_head_int8 = false, gemv_only = false;
  bool v3_linears = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model")
      model_name = next();
    else if (a == "--model-dir")
      model_dir = next();
    else if (a == "--threads")
      threads = parse_list(next());
    else if (a == "--prefill")
      prefill = std::stoi(next());
    else if (a == "--decode")
      decode = std::stoi(next());
    else if (a == "--long-prefill")
      long_prefill = std::stoi(next());
    else if (a == "--decode-depth")
      depth = std::stoi(next());
    else if (a == "--kv-cache-dtype")
      kv_cache_dtype = next();
    else if (a == "--decode-attention")
      attention_contexts = parse_list<int64_t>(next());
    else if (a == "--dtype")
      dtype_name = next();
    else if (a == "--activations")
      activations = next();
    else if (a == "--skip-gemm")
      skip_gemm = true;
    else if (a == "--gemv-only")
      gemv_only = skip_model = true;
    else if (a == "--skip-model")
      skip_model = true;
    else if (a == "--lm-head-int8")
      lm_head_int8 = true;
    else if (a == "--v3-linears")
      v3_linears = true;
    else {
      std::fprintf(stderr, "error: unrecognized argument: %s\n", a.c_str());
      return 2;
    }
  }
  if ((model_name != "small" && model_name != "tiny") ||
      (dtype_name != "bf16" && dtype_name != "f32" && dtype_name != "w8a8") ||
      (activations != "auto" && activations != "f32" && activations != "bf16") ||
      (kv_cache_dtype != "f32" && kv_cache_dtype != "bf16") || depth < 0 ||
      std::any_of(attention_contexts.begin(), attention_contexts.end(),
                  [](int64_t n) { return n < 1; })) {
    std::fprintf(
        stderr,
        "error: --model small|tiny, --dtype bf16|f32|w8a8, --activations auto|f32|bf16, "
        "--kv-cache-dtype f32|bf16, --decode-depth >= 0, --decode-attention contexts >= 1\n");
    return 2;
  }
  if (activations == "auto") activations = dtype_name == "f32" ? "f32" : "bf16";
  bench::print_cpu_line();
  std::printf("%s\n", kernels::kernel_paths_line().c_str());
  const bool avx512 = kernels::cpu_features().avx512;
  const bool amx_bf16 = kernels::amx_bf16_active();
  const bool dpbf16 = kernels::cpu_features().avx512_bf16;
  const bool bf16_activations = activations == "bf16";
  const kernels::ScopedActivationPrecision precision(
      bf16_activations ? kernels::ActivationPrecision::kBf16 : kernels::ActivationPrecision::kF32);
  std::vector<double> peaks, bf16_peaks, dpbf16_peaks, bandwidths;
  std::printf(
      "== roofs: FP32 FMA peak (10 independent chains per thread), memory read "
      "bandwidth ==\n");
  for (int t : threads) {
    const double avx2_peak = fma_peak_gflops(t);
    const double avx512_peak = avx512 ? fma_peak_gflops_avx512(t) : 0;
    peaks.push_back(std::max(avx2_peak, avx512_peak));
    // BF16 weights on AMX: three bf16 terms per f32 activation, so a third of the tile peak.
    const double amx_peak = amx_bf16 ? amx_bf16_peak_gflops(t) : 0;
    dpbf16_peaks.push_back(dpbf16 ? dpbf16_peak_gflops(t) : 0);
    // With activations rounded to bf16, BF16 weights run vdpbf16ps (AMX keeps its three terms).
    bf16_peaks.push_back(std::max(
        {peaks.back(), amx_peak / 3, bf16_activations && !amx_bf16 ? dpbf16_peaks.back() : 0.0}));
    bandwidths.push_back(read_bandwidth_gbs(t));
    std::printf("threads %d: FMA peak AVX2 %.1f GFLOP/s", t, avx2_peak);
    if (avx512) std::printf(", AVX-512 %.1f GFLOP/s", avx512_peak);
    if (dpbf16) std::printf(", vdpbf16ps %.1f GFLOP/s", dpbf16_peaks.back());
    if (amx_bf16) {
      std::printf(", AMX-BF16 %.1f GFLOP/s (%.1f with f32 activations as three terms)", amx_peak,
                  amx_peak / 3);
    }
    std::printf("; read bandwidth %.1f GB/s\n", bandwidths.back());
  }
  std::printf(
      "(prefill percentages are of the f32 FMA peak, or for BF16 weights on AMX of a third of "
      "the AMX-BF16 peak, or with --activations bf16 without AMX of the vdpbf16ps peak; int8 dot "
      "products can pass them)\n");
  if (!skip_gemm && !gemv_only) bench_gemm(threads, peaks, dpbf16_peaks);
  if (!skip_gemm) bench_gemv_from_memory(threads, bandwidths);
  if (v3_linears) bench_v3_linears(threads, peaks, bandwidths, prefill);
  if (!attention_contexts.empty()) {
    bench_decode_attention(model_name, attention_contexts, threads, peaks, bandwidths);
  }
  if (!model_dir.empty()) {
    // Its weights' dtype decides the peak its prefill percentage is of.
    bench_checkpoint(
        model_dir, threads, bf16_activations ? bf16_peaks : peaks, bandwidths, prefill, decode,
        long_prefill, depth,
        kv_cache_dtype == "bf16" ? model::KvCacheDtype::kBf16 : model::KvCacheDtype::kF32);
  } else if (!skip_model) {
    const tensor::DType dtype = dtype_name == "bf16"   ? tensor::DType::kBF16
                                : dtype_name == "w8a8" ? tensor::DType::kI8
                                                       : tensor::DType::kF32;
    bench_model(model_name, dtype, lm_head_int8, threads,
                dtype == tensor::DType::kBF16 ? bf16_peaks : peaks, bandwidths, prefill, decode,
                long_prefill, depth,
                kv_cache_dtype == "bf16" ? model::KvCacheDtype::kBf16 : model::KvCacheDtype::kF32);
  }
  return 0;
}
