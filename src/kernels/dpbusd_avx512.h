// vpdpbusd through inline assembly, for the AVX512-VNNI files only: include it after their
// target pragma. GCC 12 compiles _mm512_dpbusd_epi32 on a register accumulator with a copy of
// it around every call (48 vmovdqa per 24 vpdpbusd in a six-row tile, against 4 for the
// identical vdpbf16ps loop), which held the int8 tiles to 60% of the bf16 ones' rate.
// Stateless; acc += Σ of 4 products u8(x) · s8(w) per 32-bit lane.
#pragma once

#include <immintrin.h>

namespace kernels::detail {

inline __m512i dpbusd(__m512i acc, __m512i x_u8, __m512i w_s8) {
  asm("vpdpbusd %[w], %[x], %[acc]" : [acc] "+v"(acc) : [x] "v"(x_u8), [w] "vm"(w_s8));
  return acc;
}

}  // namespace kernels::detail
