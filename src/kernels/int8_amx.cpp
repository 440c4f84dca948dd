// AMX-INT8 body of linear_int8 for many tokens: tdpbssd on 16×64 int8 tiles, exact int32 sums
// (the other paths' bits). Per 32 weight rows the weights are gathered into AMX's B layout in
// per-thread scratch; 32 tokens × 32 rows then accumulate in four C tiles over K. The caller pads
// tokens to 32 rows and K to 64 with zeros. The tile permission is asked once per process
// (arch_prctl), the tile configuration per call; the target pragma covers only this file.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "kernels/amx_tiles.h"
#include "kernels/int8_paths.h"
#include "tensor/aligned_buffer.h"

#include "kernels/simd.h"
#include "kernels/target_region.h"

namespace kernels::detail {
namespace {

tensor::AlignedBuffer<int8_t>& packed_scratch(size_t size) {
  thread_local tensor::AlignedBuffer<int8_t> buffer;
  if (buffer.size() < size) buffer.resize(size);
  return buffer;
}

}  // namespace

bool amx_tiles_usable() {
  static const bool usable = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,amx-tile,amx-int8")

void int8_range_amx(const int8_t* xq, int64_t kp, const float* act_scale, int64_t m,
                    const tensor::WeightView& w, float* y, int64_t ldy, int64_t n_begin,
                    int64_t n_end) {
  const int64_t k = w.cols;
  const AmxTileConfig cfg = full_amx_tiles();
  _tile_loadconfig(&cfg);
  // B panel of 32 rows: [kp / 64][2 tiles][16 quads][16 rows × 4 bytes].
  int8_t* panel = packed_scratch(size_t(kp * 32)).data();
  alignas(64) int32_t c[32 * 32];
  for (int64_t n0 = n_begin; n0 < n_end; n0 += 32) {
    const int64_t rows = std::min<int64_t>(32, n_end - n0);
    const __m512i row_offsets =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(static_cast<int32_t>(k)));
    for (int64_t kb = 0; kb < kp; kb += 64) {
      for (int half = 0; half < 2; ++half) {
        int32_t* tile = reinterpret_cast<int32_t*>(panel + (kb / 64) * 2048 + half * 1024);
        if (kb + 64 <= k && half * 16 + 16 <= rows) {
          // A whole block: quad q of the 16 rows is one gather of 4-byte groups, K apart.
          const int8_t* base = w.i8() + (n0 + half * 16) * k + kb;
          for (int q = 0; q < 16; ++q)
            _mm512_store_si512(tile + q * 16, _mm512_i32gather_epi32(row_offsets, base + 4 * q, 1));
          continue;
        }
        for (int r = 0; r < 16; ++r) {
          const int64_t n = half * 16 + r;
          for (int q = 0; q < 16; ++q) {
            int32_t quad = 0;
            const int64_t k0 = kb + 4 * q;
            if (n < rows && k0 < k) {
              const int8_t* src = w.i8() + (n0 + n) * k + k0;
              if (k0 + 4 <= k) {
                std::memcpy(&quad, src, 4);
              } else {
                std::memcpy(&quad, src, size_t(k - k0));
              }
            }
            tile[q * 16 + r] = quad;
          }
        }
      }
    }
    for (int64_t t0 = 0; t0 < m; t0 += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      const int8_t* a = xq + t0 * kp;
      for (int64_t kb = 0; kb < kp; kb += 64) {
        const int8_t* b = panel + (kb / 64) * 2048;
        _tile_loadd(4, a + kb, kp);
        _tile_loadd(5, a + 16 * kp + kb, kp);
        _tile_loadd(6, b, 64);
        _tile_loadd(7, b + 1024, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
      }
      _tile_stored(0, c, 128);
      _tile_stored(1, c + 16, 128);
      _tile_stored(2, c + 16 * 32, 128);
      _tile_stored(3, c + 16 * 32 + 16, 128);
      const int64_t tokens = std::min<int64_t>(32, m - t0);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t n = 0; n < rows; ++n)
          y[(t0 + t) * ldy + n0 + n] =
              int8_output(c[t * 32 + n], n0 + n, act_scale[t0 + t], w.quant);
    }
  }
  _tile_release();
}

CHUNKPIPE_TARGET_END()

}  // namespace kernels::detail
