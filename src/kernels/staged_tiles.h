// The loop the AVX-512 dot-product tiles on row-major weights share (vdpbf16ps in
// gemm_avx512_bf16.cpp, vpdpbusd in int8_tiles_avx512_vnni.cpp; include it after their target
// pragma): token blocks of 16 in passes that stay in L2, weight rows in chunks of kChunkRows whose
// tiles (kTileRows rows × up to kMaxTokenVectors token vectors) write a [64 tokens][kChunkRows]
// stage in L1, then one flush per (token group, chunk) writes the stage out. Stateless.
//
// Why a stage: written straight into y, a tile's 64 token rows are ldy apart, and at ldy a
// multiple of 4 KiB (N 1024, 2048, 3072) they all fall in one L1 set, so every tile missed on
// every row (one Zen 5 core: N 2048 × K 512 at 141 GFLOP/s with, 365 without).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kernels::detail {

// Weight rows per tile: with four 16-token vectors, 24 accumulators, 4 activation registers and
// one broadcast of the 32 zmm registers.
inline constexpr int kTileRows = 6;
inline constexpr int kMaxTokenVectors = 4;
inline constexpr int64_t kChunkRows = 8 * kTileRows;

// fn(std::integral_constant<int, TV>) for a runtime token-vector count tv in [1, 4].
template <typename Fn>
inline void with_token_vectors(int tv, Fn&& fn) {
  switch (tv) {
    case 4:
      return fn(std::integral_constant<int, 4>{});
    case 3:
      return fn(std::integral_constant<int, 3>{});
    case 2:
      return fn(std::integral_constant<int, 2>{});
    default:
      return fn(std::integral_constant<int, 1>{});
  }
}

// Weight rows [n_begin, n_end) against num_blocks token blocks, pass_blocks at a time (a
// multiple of kMaxTokenVectors). tile(NR, TV, b, n, stage) runs rows n .. n + NR against token
// vectors b .. b + TV (NR and TV as integral_constants), writing token t's output of row n + r
// at stage[t * kChunkRows + r]; flush(b, tv, nc, cols, stage) then takes the chunk's rows
// nc .. nc + cols for those tokens.
template <typename T, typename Tile, typename Flush>
inline void staged_tiles(int64_t num_blocks, int64_t pass_blocks, int64_t n_begin, int64_t n_end,
                         Tile&& tile, Flush&& flush) {
  for (int64_t pb = 0; pb < num_blocks; pb += pass_blocks) {
    const int64_t pe = std::min(num_blocks, pb + pass_blocks);
    for (int64_t nc = n_begin; nc < n_end; nc += kChunkRows) {
      const int64_t ce = std::min(n_end, nc + kChunkRows);
      for (int64_t b = pb; b < pe; b += kMaxTokenVectors) {
        const int tv = static_cast<int>(std::min<int64_t>(kMaxTokenVectors, pe - b));
        alignas(64) T stage[kMaxTokenVectors * 16 * kChunkRows];
        with_token_vectors(tv, [&](auto vectors) {
          int64_t n = nc;
          for (; n + kTileRows <= ce; n += kTileRows)
            tile(std::integral_constant<int, kTileRows>{}, vectors, b, n, stage + (n - nc));
          for (; n < ce; ++n)
            tile(std::integral_constant<int, 1>{}, vectors, b, n, stage + (n - nc));
        });
        flush(b, tv, nc, ce - nc, stage);
      }
    }
  }
}

// Token blocks per pass whose packed activations (block_bytes each) fit in 512 KiB of L2.
constexpr int64_t l2_pass_blocks(int64_t block_bytes) {
  return std::max<int64_t>(kMaxTokenVectors, (int64_t{512} << 10) /
                                                 std::max<int64_t>(1, block_bytes) /
                                                 kMaxTokenVectors * kMaxTokenVectors);
}

}  // namespace kernels::detail
