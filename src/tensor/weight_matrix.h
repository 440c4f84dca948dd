// WeightMatrix: an owned row-major [rows, cols] matrix in the storage dtype the kernels consume
// (F32 or BF16), plus WeightView, the non-owning view passed to kernels.
// Immutable after construction; safe to read from many threads.
#pragma once

#include <cstdint>

#include "tensor/aligned_buffer.h"
#include "tensor/dtype.h"

namespace tensor {

struct WeightView {
  DType dtype = DType::kF32;  // kF32 or kBF16
  int64_t rows = 0;           // output features (N)
  int64_t cols = 0;           // input features (K)
  const void* data = nullptr;

  const float* f32() const { return static_cast<const float*>(data); }
  const uint16_t* bf16() const { return static_cast<const uint16_t*>(data); }
  // Element (r, c) as f32, for reference code and tests.
  float at(int64_t r, int64_t c) const {
    return dtype == DType::kF32 ? f32()[r * cols + c] : bf16_to_f32(bf16()[r * cols + c]);
  }
};

class WeightMatrix {
 public:
  WeightMatrix() = default;
  WeightMatrix(DType dtype, int64_t rows, int64_t cols)
      : dtype_(dtype),
        rows_(rows),
        cols_(cols),
        bytes_(static_cast<size_t>(rows * cols * dtype_size_bytes(dtype))) {}

  DType dtype() const { return dtype_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  bool empty() const { return rows_ == 0; }
  size_t size_bytes() const { return bytes_.size(); }
  uint8_t* mutable_bytes() { return bytes_.data(); }
  float* mutable_f32() { return reinterpret_cast<float*>(bytes_.data()); }
  uint16_t* mutable_bf16() { return reinterpret_cast<uint16_t*>(bytes_.data()); }
  WeightView view() const { return {dtype_, rows_, cols_, bytes_.data()}; }

 private:
  DType dtype_ = DType::kF32;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  AlignedBuffer<uint8_t> bytes_;
};

}  // namespace tensor
