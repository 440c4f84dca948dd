// WeightMatrix: an owned row-major [rows, cols] matrix in the storage dtype the kernels consume
// (F32, BF16, FP8 e4m3 with its block scales, or I8 with its W8A8 quantization parameters), plus
// WeightView, the non-owning view passed to kernels. Immutable after construction; safe to read
// from many threads. Invariants: I8's row_scale and row_sum hold `rows` entries, row_bias is
// empty or `rows`; FP8's block scales cover [ceil(rows / block_rows), ceil(cols / block_cols)].
#pragma once

#include <cstdint>

#include "tensor/aligned_buffer.h"
#include "tensor/dtype.h"

namespace tensor {

// W8A8 as msmodelslim writes it (w8a8-mtp.md 1b): activations are quantized to int8 per token
// (dynamic: scale max|x_t|/127, no offset) or with one fixed scale and offset (static), then
//   y[t, n] = (Σ_k xq[t, k]·Wq[n, k] + row_bias[n]) · act_scale[t] · row_scale[n]
// with act_scale[t] = the token's scale (dynamic) or 1 (static, whose deq_scale = s_in·s_w).
struct Int8Quant {
  bool static_activation = false;
  float input_scale = 1.0f;           // static: xq = clamp(round(x / input_scale + offset))
  float input_offset = 0.0f;          // static: a whole number
  const float* row_scale = nullptr;   // [N]: weight_scale (dynamic) or deq_scale (static)
  const int32_t* row_bias = nullptr;  // [N] or null: quant_bias (static)
  const int32_t* row_sum = nullptr;   // [N]: Σ_k Wq[n, k], for kernels that offset xq by 128
};

// FP8 block scaling as DeepSeek-V3's checkpoints store it (weight_scale_inv): element (r, c) is
// fp8(Wq[r, c]) · scale[(r / block_rows) · scale_cols + c / block_cols]. block_cols is a power
// of two, at least 16, so that a kernel's 8- or 16-value vector shares one scale
// (block_cols_log2 finds it with a shift).
struct Fp8BlockScale {
  const float* scale = nullptr;
  int64_t scale_cols = 0;
  int64_t block_rows = 128;
  int block_cols_log2 = 7;
  const float* row(int64_t r) const { return scale + (r / block_rows) * scale_cols; }
};

struct WeightView {
  DType dtype = DType::kF32;  // kF32, kBF16, kF8E4M3 or kI8
  int64_t rows = 0;           // output features (N)
  int64_t cols = 0;           // input features (K)
  const void* data = nullptr;
  Int8Quant quant;    // kI8 only
  Fp8BlockScale fp8;  // kF8E4M3 only

  const float* f32() const { return static_cast<const float*>(data); }
  const uint16_t* bf16() const { return static_cast<const uint16_t*>(data); }
  const int8_t* i8() const { return static_cast<const int8_t*>(data); }
  // Rows [begin, begin + count) in place, with their I8 per-row parameters (FP8: begin a
  // multiple of block_rows).
  WeightView row_range(int64_t begin, int64_t count) const {
    WeightView v = *this;
    if (dtype == DType::kF8E4M3) v.fp8.scale = fp8.row(begin);
    v.data = static_cast<const uint8_t*>(data) + begin * cols * dtype_size_bytes(dtype);
    v.rows = count;
    if (quant.row_scale) v.quant.row_scale += begin;
    if (quant.row_bias) v.quant.row_bias += begin;
    if (quant.row_sum) v.quant.row_sum += begin;
    return v;
  }
  // Element (r, c) as f32 (I8: dequantized, Wq · row_scale / input_scale when static), for
  // reference code and tests.
  float at(int64_t r, int64_t c) const {
    switch (dtype) {
      case DType::kF32:
        return f32()[r * cols + c];
      case DType::kBF16:
        return bf16_to_f32(bf16()[r * cols + c]);
      case DType::kF8E4M3:
        return fp8_e4m3_to_f32(static_cast<const uint8_t*>(data)[r * cols + c]) *
               fp8.row(r)[c >> fp8.block_cols_log2];
      default:
        return float(i8()[r * cols + c]) * quant.row_scale[r] /
               (quant.static_activation ? quant.input_scale : 1.0f);
    }
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
  int8_t* mutable_i8() { return reinterpret_cast<int8_t*>(bytes_.data()); }

  // I8 only: per-row scales [rows] to fill, then finish_int8() once the weights are written.
  float* mutable_row_scale() {
    if (row_scale_.size() != size_t(rows_)) row_scale_.resize(size_t(rows_));
    return row_scale_.data();
  }
  // I8 static only: quant_bias [rows].
  int32_t* mutable_row_bias() {
    if (row_bias_.size() != size_t(rows_)) row_bias_.resize(size_t(rows_));
    return row_bias_.data();
  }
  // FP8 only: the block scales [ceil(rows / block_rows), ceil(cols / 2^block_cols_log2)] to
  // fill.
  float* mutable_fp8_scale(int64_t block_rows, int block_cols_log2) {
    fp8_block_rows_ = block_rows;
    fp8_block_cols_log2_ = block_cols_log2;
    const int64_t bc = int64_t{1} << block_cols_log2;
    fp8_scale_cols_ = (cols_ + bc - 1) / bc;
    fp8_scale_.resize(size_t((rows_ + block_rows - 1) / block_rows * fp8_scale_cols_));
    return fp8_scale_.data();
  }
  size_t fp8_scale_count() const { return fp8_scale_.size(); }

  // Records the activation quantization and computes the row sums the kernels need.
  void finish_int8(bool static_activation, float input_scale = 1.0f, float input_offset = 0.0f) {
    static_activation_ = static_activation;
    input_scale_ = input_scale;
    input_offset_ = input_offset;
    mutable_row_scale();
    row_sum_.resize(size_t(rows_));
    const int8_t* w = mutable_i8();
    for (int64_t r = 0; r < rows_; ++r) {
      int32_t sum = 0;
      for (int64_t c = 0; c < cols_; ++c) sum += w[r * cols_ + c];
      row_sum_.data()[r] = sum;
    }
  }

  WeightView view() const {
    WeightView v{dtype_, rows_, cols_, bytes_.data()};
    if (dtype_ == DType::kI8) {
      v.quant = {static_activation_,
                 input_scale_,
                 input_offset_,
                 row_scale_.data(),
                 row_bias_.size() ? row_bias_.data() : nullptr,
                 row_sum_.data()};
    }
    if (dtype_ == DType::kF8E4M3) {
      v.fp8 = {fp8_scale_.data(), fp8_scale_cols_, fp8_block_rows_, fp8_block_cols_log2_};
    }
    return v;
  }

 private:
  DType dtype_ = DType::kF32;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  AlignedBuffer<uint8_t> bytes_;
  // I8 only.
  bool static_activation_ = false;
  float input_scale_ = 1.0f, input_offset_ = 0.0f;
  AlignedBuffer<float> row_scale_;
  AlignedBuffer<int32_t> row_bias_, row_sum_;
  // FP8 only.
  AlignedBuffer<float> fp8_scale_;
  int64_t fp8_scale_cols_ = 0, fp8_block_rows_ = 128;
  int fp8_block_cols_log2_ = 7;
};

}  // namespace tensor
