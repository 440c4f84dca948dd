// AVX-512 instantiation of the blocked MLA prefill attention (mla_flash.h): 16 lanes, 6 queries
// × 64 keys per register tile (24 accumulators), and a 16-lane exp with exp8's constants, so both
// ISA paths agree to rounding order. Compiled for AVX-512 by a target pragma that covers only
// this file's own functions; runs only when cpu_features().avx512 is set. Thread-safe.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/mla_attention.h"
#include "kernels/simd.h"
#include "kernels/vec_exp.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#endif

#include "kernels/mla_flash.h"
#include "kernels/vec_exp512.h"

namespace kernels::detail {
namespace {

struct Avx512 {
  using Vec = __m512;
  static constexpr int kWidth = 16;
  static constexpr int kRows = 6;
  static __mmask16 prefix(int n) {
    if (n <= 0) return 0;
    return n >= kWidth ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
  }
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(prefix(n), p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Vec fill_from(Vec v, int n, float x) {
    return _mm512_mask_blend_ps(prefix(n), _mm512_set1_ps(x), v);
  }
  static float hmax(Vec v) { return _mm512_reduce_max_ps(v); }
  static float hsum(Vec v) { return _mm512_reduce_add_ps(v); }
  static Vec exp(Vec x) { return exp16(x); }  // exp8's function on 16 lanes (vec_exp512.h)
};

}  // namespace

void mla_prefill_items_avx512(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                              MlaPrefillState& state, std::atomic<int64_t>& next) {
  FlashPrefill<Avx512>(a, key_begin, key_end, state).run(next);
}

}  // namespace kernels::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
