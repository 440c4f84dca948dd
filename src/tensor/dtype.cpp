// dtype names and the f16 / fp8 e4m3fn decoders (fp8 through a 256-entry table).
#include "tensor/dtype.h"

#include <array>
#include <cmath>
#include <limits>

namespace tensor {

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "I8") return DType::kI8;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  return std::nullopt;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI8:
      return "I8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

int dtype_size_bytes(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF8E4M3:
    case DType::kI8:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  return 0;
}

float f16_to_f32(uint16_t bits) {
  const int sign = (bits >> 15) & 1;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value =
        mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    value = std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
  }
  return sign ? -value : value;
}

namespace {

std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> table{};
  for (int b = 0; b < 256; ++b) {
    const int sign = (b >> 7) & 1;
    const int exponent = (b >> 3) & 0xf;
    const int mantissa = b & 0x7;
    float value;
    if ((b & 0x7f) == 0x7f) {
      value = std::numeric_limits<float>::quiet_NaN();
    } else if (exponent == 0) {
      value = std::ldexp(static_cast<float>(mantissa), -9);  // 2^-6 * m/8
    } else {
      value = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);  // 2^(e-7) * (1+m/8)
    }
    table[b] = sign ? -value : value;
  }
  return table;
}

}  // namespace

float fp8_e4m3_to_f32(uint8_t bits) {
  static const std::array<float, 256> kTable = make_e4m3_table();
  return kTable[bits];
}

uint8_t f32_to_fp8_e4m3(float v) {
  const float a = std::abs(v);
  // Codes 0 .. 0x7E decode to increasing values 0 .. 448: the last one at or below a, then its
  // upper neighbour if that is strictly nearer.
  int lo = 0, hi = 0x7E;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (fp8_e4m3_to_f32(static_cast<uint8_t>(mid)) <= a) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  int code = lo;
  if (code < 0x7E) {
    const float below = std::abs(fp8_e4m3_to_f32(static_cast<uint8_t>(code)) - a);
    const float above = std::abs(fp8_e4m3_to_f32(static_cast<uint8_t>(code + 1)) - a);
    if (above < below) ++code;
  }
  return static_cast<uint8_t>(code | (v < 0 ? 0x80 : 0));
}

}  // namespace tensor
