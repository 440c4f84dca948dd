// AVX512_BF16 instantiation of the blocked MLA prefill attention (mla_flash.h) for
// CHUNKPIPE_ATTENTION=bf16 (MlaPrefillArgs::bf16): q, kᵀ, v and the softmax weights p are rounded
// to bf16 (nearest even) and multiplied in pairs by vdpbf16ps, summed in f32, as bf16 attention
// runs on GPUs; the softmax itself stays f32. Compiled for AVX512_BF16 by a target pragma over this
// file's own functions; runs only when cpu_features().avx512_bf16 is set. Thread-safe.
#include <cstdint>

#include "kernels/mla_attention.h"
#include "kernels/simd.h"  // before the target region: GCC bug 105593
#include "kernels/target_region.h"

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

#include "kernels/mla_flash.h"
#include "kernels/mla_flash_avx512_traits.h"

namespace kernels::detail {
namespace {

// vcvtneps2bf16 rounds to nearest even and treats f32 denormals as zero; tensor::f32_to_bf16
// keeps them as bf16 denormals, which vdpbf16ps reads as zero, so the products agree.
struct Avx512Bf16 : Avx512 {
  static constexpr bool kBf16Pairs = true;
  using Pairs = __m512i;
  static Pairs pair_set1(uint32_t word) { return _mm512_set1_epi32(static_cast<int>(word)); }
  static Pairs pair_load(const uint32_t* p) { return _mm512_load_si512(p); }
  static Vec dot_pairs(Vec acc, Pairs a, Pairs b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
  }
  // Lane j: bf16(lo[j]) in the low half, bf16(hi[j]) in the high half; lanes >= n are 0.
  static void pack_rows(const float* lo, const float* hi, int n, uint32_t* dst) {
    const __mmask16 m = prefix(n);
    const __m512i l = _mm512_cvtepu16_epi32(
        (__m256i)_mm512_cvtneps_pbh(m ? _mm512_maskz_loadu_ps(m, lo) : _mm512_setzero_ps()));
    const __m512i h =
        hi && m ? _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, hi)))
                : _mm512_setzero_si512();
    _mm512_store_si512(dst, _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
  }
  // The 32 values p[0, 32) as 16 pair words (p[2j], p[2j + 1]).
  static void pack_consecutive(const float* p, uint32_t* dst) {
    _mm512_store_si512(dst,
                       (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p)));
  }
};

}  // namespace

void mla_prefill_items_avx512_bf16(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                                   MlaPrefillState& state, std::atomic<int64_t>& next) {
  FlashPrefill<Avx512Bf16>(a, key_begin, key_end, state).run(next);
}

void mla_prefill_pack_avx512_bf16(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                                  MlaPrefillState& state, int64_t h0, int64_t h1) {
  FlashPrefill<Avx512Bf16> flash(a, key_begin, key_end, state);
  for (int64_t h = h0; h < h1; ++h) flash.pack_head_keys(static_cast<int>(h));
}

}  // namespace kernels::detail

CHUNKPIPE_TARGET_END()
