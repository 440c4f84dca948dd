// Element types of checkpoint tensors and their scalar conversions to f32.
// Pure functions and constants; thread-safe. bf16 and f16 are stored as raw uint16_t bits,
// fp8 e4m3fn as raw uint8_t bits (no infinities; 0x7F/0xFF are NaN; max finite 448).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tensor {

// kI32 / kI64 appear only as W8A8 side tensors (quant_bias, deq_scale's bit patterns).
enum class DType { kF32, kF16, kBF16, kF8E4M3, kI8, kI32, kI64 };

// Safetensors dtype names ("F32", "BF16", "F8_E4M3", ...); nullopt when not supported.
std::optional<DType> dtype_from_safetensors(std::string_view name);
std::string_view dtype_name(DType dtype);
int dtype_size_bytes(DType dtype);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round-to-nearest-even, NaN preserved.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t bits);
float fp8_e4m3_to_f32(uint8_t bits);
// The nearest finite e4m3 code of |v| <= 448 (larger values saturate to 448), ties to the code of
// smaller magnitude, with v's sign: what a search over all 127 non-negative finite codes for the
// smallest |decoded - |v|| picks, found by bisection instead.
uint8_t f32_to_fp8_e4m3(float v);

}  // namespace tensor
