// Internal to kernels: the AMX tile configuration both tile paths load (int8_amx.cpp,
// gemm_amx_bf16.cpp): palette 1 with tiles 0-7 of 16 rows × 64 bytes. Plain data, no ISA code,
// so it is safe to include before a file's target region. Thread-safe.
#pragma once

#include <cstdint>

namespace kernels::detail {

// The 64-byte block _tile_loadconfig reads.
struct alignas(64) AmxTileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every one of the eight tiles at its full 16 rows × 64 bytes.
inline AmxTileConfig full_amx_tiles() {
  AmxTileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}

}  // namespace kernels::detail
