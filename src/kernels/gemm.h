// Linear layers: y[M, N] = x[M, K] · W[N, K]ᵀ with f32 activations and F32, BF16 or FP8 weights.
// Small M (decode) streams the weights once through an AVX2 or AVX-512 kernel (cpu_features());
// larger M runs AMX-BF16 on BF16 weights where the CPU has it, else our AVX2 tiled kernel or the
// AVX-512 streaming kernel in blocks of rows. Each of those forms a token's outputs the same way
// whatever the batch and the thread count (docs/ARCHITECTURE.md, "Batch invariance"). With
// ActivationPrecision::kBf16, BF16 weights see bf16-rounded activations (vdpbf16ps on
// AVX512_BF16). Thread-safe for distinct outputs; uses per-thread scratch.
#pragma once

#include <cstdint>

#include "common/thread_pool.h"
#include "tensor/aligned_buffer.h"
#include "tensor/weight_matrix.h"

namespace kernels {

// Rows of x at or below which the streaming (GEMV-style) kernel beats tiled sgemm. Measured
// with chunkpipe_bench (docs/ARCHITECTURE.md, "GEMM choice"): bf16 weights ~48 rows (the
// conversion to f32 costs the BLAS path), f32 weights ~16.
inline constexpr int64_t kStreamingMaxRowsBf16 = 48;
inline constexpr int64_t kStreamingMaxRowsF32 = 16;
// FP8 weights (e4m3 with 128x128 block scales, held as stored) are widened in registers by the
// AVX2 streaming kernel up to this many rows, and beyond it widened per 16-row panel into f32
// for the AVX2 tiled kernel, on every machine: each output has the bits the AVX2 F32 kernels
// give on the dequantized values (so within rounding of the AVX-512 F32 kernels' bits), the same
// whatever the batch, the thread count and the CPU.
inline constexpr int64_t kStreamingMaxRowsFp8 = 16;
// The AVX-512 streaming kernel (4 weight rows × 4 tokens, 16 lanes) keeps 90-97% of the FMA peak
// on BF16 weights up to 256 rows, where sgemm on weights converted per tile reaches 73-76% (2
// cores of a Zen 4 EPYC, chunkpipe_bench, N 1024-2048, K 2048-7168; at K 512 they tie at 256).
inline constexpr int64_t kStreamingMaxRowsBf16Avx512 = 256;
// With AMX-BF16, bf16 weights take the tiles from this many rows: one core, N 512, K 2048 (an
// expert of the `small` model), the tiles run 144 GFLOP/s at 24 rows against the streaming
// kernel's 110, and 97 against 105 at 16 (docs/ARCHITECTURE.md, "Kernel paths").
inline constexpr int64_t kAmxMinRowsBf16 = 24;
// With K a multiple of 32, bf16 weights take the row-major AMX form (no weight packing) from
// 8 to 256 rows. One core (chunkpipe_bench, docs/ARCHITECTURE.md "Kernel paths"): at N 2048,
// K 7168 (DeepSeek-V3's hidden size) 195 / 388 / 424 GFLOP/s at 8 / 16 / 128 rows, against the
// streaming kernel's 119 / 123 and the packed form's 330 at 128; at 4 rows the streaming kernel
// ties (104 against 99). On the CPP model's expert (N 512, K 512) the packed form wins from 256
// rows (419 against 408).
inline constexpr int64_t kAmxRowMajorMinRows = 8;
inline constexpr int64_t kAmxRowMajorMaxRows = 256;

// The numerics of the activations that enter BF16-weight linears. kF32 (the default) keeps them
// f32, so that the forward matches the f32 reference. kBf16 rounds them to bf16 first (round to
// nearest even), as serving in bfloat16 on a GPU and llama.cpp's BF16 path do: every product is
// then exact in f32, and AVX512_BF16's vdpbf16ps runs them at twice the f32 FMA rate. F32 and I8
// weights (the MoE router is F32 in memory) and the attention are not affected (the attention's
// own switch is CHUNKPIPE_ATTENTION, mla_attention.h).
// Process-wide: set it before forwards run on other threads (serve's --dtype bfloat16 does, at
// start-up).
enum class ActivationPrecision { kF32, kBf16 };
void set_activation_precision(ActivationPrecision precision);
ActivationPrecision activation_precision();
class ScopedActivationPrecision {
 public:
  explicit ScopedActivationPrecision(ActivationPrecision precision);
  ~ScopedActivationPrecision();
  ScopedActivationPrecision(const ScopedActivationPrecision&) = delete;
  ScopedActivationPrecision& operator=(const ScopedActivationPrecision&) = delete;

 private:
  ActivationPrecision saved_;
};

// With kBf16 and AVX512_BF16 (and no AMX, whose tiles are faster still on the rounded values),
// BF16 weights with an even K take linear_bf16_dot from this many rows; below it (any K),
// linear_bf16_gemv. One core of a Zen 4 EPYC (chunkpipe_bench, N 2048, K 2048 / 7168): the
// dot kernel, which fills m / 16 of its lanes, runs 112 / 103 GFLOP/s at 8 rows against the
// GEMV's 175 / 98, and 224 / 205 against 147 / 116 at 16.
inline constexpr int64_t kBf16DotMinRows = 12;

// y (row stride ldy, >= N) = x (row stride K) · Wᵀ. I8 weights go to linear_int8 (W8A8).
// Under ActivationPrecision::kBf16, BF16 weights see x rounded to bf16 on every path.
void linear(const float* x, int64_t m, const tensor::WeightView& w, float* y, int64_t ldy,
            common::ThreadPool& pool);
inline void linear(const float* x, int64_t m, const tensor::WeightView& w, float* y,
                   common::ThreadPool& pool) {
  linear(x, m, w, y, w.rows, pool);
}

// While one is alive, linear() runs I8 weights through linear_int8_reference instead of the
// int8 kernels (float weights keep their fast paths): the W8A8 model-level test that the fast
// forward equals the reference forward bit for bit. Set it before forwards run on other threads.
class ScopedReferenceLinear {
 public:
  ScopedReferenceLinear();
  ~ScopedReferenceLinear();
  ScopedReferenceLinear(const ScopedReferenceLinear&) = delete;
  ScopedReferenceLinear& operator=(const ScopedReferenceLinear&) = delete;

 private:
  bool saved_;
};

// The fast paths, exposed for tests and the benchmark. linear_tiled is the AVX2 tiled kernel
// (larger M): each output equals linear_streaming's on the AVX2 path bit for bit, whatever m
// and the thread count; linear_blas (OpenBLAS sgemm) is no longer on any path of linear() and
// stays for comparison.
void linear_streaming(const float* x, int64_t m, const tensor::WeightView& w, float* y, int64_t ldy,
                      common::ThreadPool& pool);
void linear_tiled(const float* x, int64_t m, const tensor::WeightView& w, float* y, int64_t ldy,
                  common::ThreadPool& pool);
void linear_blas(const float* x, int64_t m, const tensor::WeightView& w, float* y, int64_t ldy,
                 common::ThreadPool& pool);
// The streaming kernel over all of w's rows on the calling thread, for callers that split the
// work themselves (decode's per-head projections, one head per task). Each output equals
// linear_streaming's bit for bit.
void linear_streaming_serial(const float* x, int64_t m, const tensor::WeightView& w, float* y,
                             int64_t ldy);

// The AMX-BF16 path at f32 numerics, when cpu_features().amx_bf16 and the OS grants the tile
// state (amx_bf16_active()). Activations x [m, k] are split once into three bf16 terms whose
// sum is x exactly, then reused by every weight W [n, k] that reads them: y = x·Wᵀ (AmxOutput
// places it). Not thread-safe per Bf16x3Activations.
bool amx_bf16_active();
struct Bf16x3Activations {
  int64_t m = 0, k = 0, mp = 0, kp = 0;    // mp, kp: m and k rounded up to 32
  tensor::AlignedBuffer<uint16_t> planes;  // [3][mp][kp], zero outside x
};
void split_bf16x3(const float* x, int64_t ldx, int64_t m, int64_t k, Bf16x3Activations& out,
                  common::ThreadPool& pool);
// W's rows, bf16 or f32 (f32 costs twice the tile products unless its values are exact in
// bf16): logical row i is physical row (i / group_rows) · group_stride + i % group_rows, so a
// weight's row groups (one head's keys inside [keys ‖ values] per head) are read in place.
struct AmxWeightRows {
  const uint16_t* bf16 = nullptr;
  const float* f32 = nullptr;
  int64_t group_rows = 0;  // 0: row i is physical row i
  int64_t group_stride = 0;
  int64_t physical_row(int64_t i) const {
    return group_rows == 0 ? i : i / group_rows * group_stride + i % group_rows;
  }
};
// Where output (token t, column j) goes: y[t · ldy + j], or with transposed y[j · ldy + t]; with
// group_cols, columns come in groups (one head's values) group_stride floats apart, so that
// (t, j) goes to y[(j / group_cols) · group_stride + t · ldy + j % group_cols] (not transposed).
struct AmxOutput {
  float* y = nullptr;
  int64_t ldy = 0;
  bool transposed = false;
  int64_t group_cols = 0;  // 0: one group
  int64_t group_stride = 0;
};
// Rows [row_begin, row_end) of x only (row_end -1: to x.m), with row_begin a multiple of 32;
// output row 0 is x's row row_begin.
void linear_amx(const Bf16x3Activations& x, const AmxWeightRows& w, int64_t n, const AmxOutput& out,
                common::ThreadPool& pool, int64_t row_begin = 0, int64_t row_end = -1);

// The same products for row-major BF16 weights with K a multiple of 32, without packing the
// weights: their rows are the tiles' A operand, loaded in place, and x's three terms are packed
// once per call as B tiles. Bit-identical to linear_amx (same products in the same order), and
// cheaper for short batches. Call only when amx_bf16_active().
void linear_amx_row_major(const float* x, int64_t m, const tensor::WeightView& w, float* y,
                          int64_t ldy, common::ThreadPool& pool);

// The vdpbf16ps path: y = bf16(x) · Wᵀ for BF16 w with an even K, x rounded and packed once per
// call, the weights read in place. Call only when cpu_features().avx512_bf16.
void linear_bf16_dot(const float* x, int64_t m, const tensor::WeightView& w, float* y, int64_t ldy,
                     common::ThreadPool& pool);
// The same path in two steps, for activations read by several weights (the MLA expansion of a
// bf16 latent cache): x [m, k] (row stride ldx, k even) rounded to bf16 and packed once, then
// y = packed x · Wᵀ for n row-major bf16 weight rows w [n, k]. Each output is one vdpbf16ps
// chain over k in order, so it does not depend on m, n or the tiling; linear_bf16_dot's
// outputs equal these bit for bit. Call only when cpu_features().avx512_bf16. Not thread-safe
// per Bf16PairActivations.
struct Bf16PairActivations {
  int64_t m = 0, k = 0;
  tensor::AlignedBuffer<uint32_t> blocks;  // [ceil(m / 16)][k / 2][16] pair words
};
void pack_bf16_pairs(const float* x, int64_t ldx, int64_t m, int64_t k, Bf16PairActivations& out,
                     common::ThreadPool& pool);
void linear_bf16_packed(const Bf16PairActivations& x, const uint16_t* w, int64_t n, float* y,
                        int64_t ldy, common::ThreadPool& pool);
// linear_bf16_packed's serial form for weight rows [n_begin, n_end) on the calling thread, for
// callers that split the work themselves.
void linear_bf16_packed_serial(const Bf16PairActivations& x, const uint16_t* w, int64_t n_begin,
                               int64_t n_end, float* y, int64_t ldy);
// Its GEMV form, for fewer than kBf16DotMinRows rows of x (decode): x rounded to bf16 once per
// call, lanes along K, two vdpbf16ps chains per output; any K. A token's outputs are the same
// bits whatever m is. Call only when cpu_features().avx512_bf16.
void linear_bf16_gemv(const float* x, int64_t m, const tensor::WeightView& w, float* y, int64_t ldy,
                      common::ThreadPool& pool);
// out[i] = x[i] rounded to the nearest bf16 (ties to even, NaN kept), as tensor::f32_to_bf16.
void round_to_bf16(const float* x, int64_t n, float* out);

// Naive reference: one double-accumulated dot product per output (I8: linear_int8_reference).
// It ignores activation_precision(): round x with round_to_bf16 to check the kBf16 paths.
void linear_reference(const float* x, int64_t m, const tensor::WeightView& w, float* y,
                      int64_t ldy);

// Plain f32 sgemm wrapper used by attention: C[m,n] = alpha·A[m,k]·op(B) + beta·C.
// b_transposed: B is [n, k] (row stride ldb) instead of [k, n].
void sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, bool b_transposed, float beta, float* c, int64_t ldc);

// Converts n bf16 values to f32 (AVX2).
void bf16_to_f32_row(const uint16_t* src, float* dst, int64_t n);

}  // namespace kernels
