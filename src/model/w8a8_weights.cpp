// W8A8 side tensors: weight_scale / weight_offset (dynamic), input_scale / input_offset /
// deq_scale / quant_bias (static), and int4 pairs unpacked to int8 (W4A8: the kernels are the
// int8 ones; the weights take twice the packed bytes in memory).
#include "model/w8a8_weights.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

namespace model {
namespace {

using common::Result;
using common::Status;
using tensor::DType;

std::string where(const TensorInfo& t) {
  return std::filesystem::path(t.file).filename().string() + ": tensor '" + t.name + "'";
}

// A side tensor of n values ([n] or [n, 1]) as f32; F32, BF16 and F16 are accepted, and I64
// when `int64_bits` (deq_scale's f32 bit pattern in the low 32 bits).
Result<std::vector<float>> side_values(const Checkpoint& ck, const std::string& name, int64_t n,
                                       bool int64_bits = false) {
  CP_ASSIGN_OR_RETURN(const TensorInfo* t, ck.find(name));
  const bool shape_ok = (t->shape.size() == 1 && t->shape[0] == n) ||
                        (t->shape.size() == 2 && t->shape[0] == n && t->shape[1] == 1);
  if (!shape_ok) {
    return common::invalid_argument(where(*t) + " has shape " + t->shape_string() + ", expected [" +
                                    std::to_string(n) + "] or [" + std::to_string(n) + ", 1]");
  }
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    switch (t->dtype) {
      case DType::kF32:
        std::memcpy(&v[i], t->data + 4 * i, 4);
        break;
      case DType::kBF16:
      case DType::kF16: {
        uint16_t bits;
        std::memcpy(&bits, t->data + 2 * i, 2);
        v[i] = t->dtype == DType::kBF16 ? tensor::bf16_to_f32(bits) : tensor::f16_to_f32(bits);
        break;
      }
      case DType::kI64:
        if (int64_bits) {
          uint64_t raw;
          std::memcpy(&raw, t->data + 8 * i, 8);
          const uint32_t low = static_cast<uint32_t>(raw);
          std::memcpy(&v[i], &low, 4);
          break;
        }
        [[fallthrough]];
      default:
        return common::invalid_argument(
            where(*t) + " has dtype " + std::string(tensor::dtype_name(t->dtype)) +
            (int64_bits ? ", expected F32, BF16, F16 or I64" : ", expected F32, BF16 or F16"));
    }
    if (!std::isfinite(v[i])) {
      return common::invalid_argument(where(*t) + " holds a non-finite value at " +
                                      std::to_string(i));
    }
  }
  return v;
}

// The prefix of "<prefix>weight".
std::string prefix_of(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - std::string("weight").size());
}

Status copy_weight(const TensorInfo& t, QuantType type, int64_t rows, int64_t cols,
                   const Int8Part& part, tensor::WeightMatrix& out) {
  const bool int4 = type == QuantType::kW4A8Dynamic;
  const int64_t stored_rows = int4 ? rows / 2 : rows;
  if (t.dtype != DType::kI8) {
    return common::invalid_argument(where(t) + " has dtype " +
                                    std::string(tensor::dtype_name(t.dtype)) +
                                    ", but its quantization type needs I8");
  }
  if ((int4 && rows % 2 != 0) || t.shape.size() != 2 || t.shape[0] != stored_rows ||
      t.shape[1] != cols) {
    return common::invalid_argument(where(t) + " has shape " + t.shape_string() +
                                    " but config.json implies [" + std::to_string(stored_rows) +
                                    ", " + std::to_string(cols) + "]" +
                                    (int4 ? " (int4 pairs packed along the output rows)" : ""));
  }
  const int64_t out_cols = part.col_end - part.col_begin;
  const int64_t real_end = std::min(part.row_end, rows);
  int8_t* dst = out.mutable_i8();
  for (int64_t r = part.row_begin; r < real_end; ++r) {
    int8_t* row = dst + (r - part.row_begin) * out_cols;
    if (!int4) {
      std::memcpy(row, t.data + r * cols + part.col_begin, size_t(out_cols));
      continue;
    }
    // byte[j, k] = (w[2j+1, k] << 4) | (w[2j, k] & 0xF), each nibble a signed int4.
    const uint8_t* packed = t.data + (r / 2) * cols + part.col_begin;
    for (int64_t c = 0; c < out_cols; ++c) {
      const int nibble = (r % 2 == 0) ? (packed[c] & 0x0F) : (packed[c] >> 4);
      row[c] = static_cast<int8_t>(nibble >= 8 ? nibble - 16 : nibble);
    }
  }
  return {};
}

}  // namespace

Result<tensor::WeightMatrix> read_int8_linear(const Checkpoint& ck, const std::string& weight_name,
                                              QuantType type, int64_t rows, int64_t cols,
                                              const Int8Part& part) {
  CP_ASSIGN_OR_RETURN(const TensorInfo* t, ck.find(weight_name));
  const std::string prefix = prefix_of(weight_name);
  const int64_t out_rows = part.row_end - part.row_begin;
  const int64_t real_rows = std::max<int64_t>(0, std::min(part.row_end, rows) - part.row_begin);
  tensor::WeightMatrix out(DType::kI8, out_rows, part.col_end - part.col_begin);
  CP_RETURN_IF_ERROR(copy_weight(*t, type, rows, cols, part, out));
  float* row_scale = out.mutable_row_scale();
  if (type == QuantType::kW8A8 || (type == QuantType::kW8A8Mix && part.mix_static)) {
    CP_ASSIGN_OR_RETURN(auto input_scale, side_values(ck, prefix + "input_scale", 1));
    CP_ASSIGN_OR_RETURN(auto input_offset, side_values(ck, prefix + "input_offset", 1));
    CP_ASSIGN_OR_RETURN(auto deq_scale, side_values(ck, prefix + "deq_scale", rows, true));
    CP_ASSIGN_OR_RETURN(const TensorInfo* qb, ck.find(prefix + "quant_bias"));
    if (qb->dtype != DType::kI32 || qb->num_elements() != rows) {
      return common::invalid_argument(
          where(*qb) + " has dtype " + std::string(tensor::dtype_name(qb->dtype)) + " and shape " +
          qb->shape_string() + ", expected I32 [" + std::to_string(rows) + "]");
    }
    if (!(input_scale[0] > 0) || input_offset[0] != std::nearbyint(input_offset[0])) {
      return common::invalid_argument(ck.find(prefix + "input_scale").value()->file + ": '" +
                                      prefix + "input_scale' must be positive and '" + prefix +
                                      "input_offset' a whole number");
    }
    int32_t* bias = out.mutable_row_bias();
    for (int64_t i = 0; i < real_rows; ++i) {
      row_scale[i] = deq_scale[size_t(part.row_begin + i)];
      int32_t b = 0;
      if (part.with_bias) std::memcpy(&b, qb->data + 4 * (part.row_begin + i), 4);
      bias[i] = b;
    }
    out.finish_int8(true, input_scale[0], input_offset[0]);
    return out;
  }
  // W8A8_DYNAMIC, W4A8_DYNAMIC and W8A8_MIX (which carries both sets; dynamic is the form
  // upstream runs everywhere but on a decode-only KV consumer, where mix_static is set).
  CP_ASSIGN_OR_RETURN(auto weight_scale, side_values(ck, prefix + "weight_scale", rows));
  if (ck.contains(prefix + "weight_offset")) {
    CP_ASSIGN_OR_RETURN(auto offset, side_values(ck, prefix + "weight_offset", rows));
    for (int64_t i = 0; i < rows; ++i) {
      if (offset[size_t(i)] != 0.0f) {
        return common::unimplemented(ck.find(prefix + "weight_offset").value()->file + ": '" +
                                     prefix + "weight_offset' is non-zero at row " +
                                     std::to_string(i) +
                                     "; only symmetric weights (offset 0) are supported");
      }
    }
  }
  for (int64_t i = 0; i < real_rows; ++i) row_scale[i] = weight_scale[size_t(part.row_begin + i)];
  out.finish_int8(false);
  return out;
}

Result<tensor::WeightMatrix> concat_int8_rows(const tensor::WeightMatrix& a,
                                              const tensor::WeightMatrix& b,
                                              const std::string& what) {
  const tensor::WeightView va = a.view(), vb = b.view();
  if (va.dtype != DType::kI8 || vb.dtype != DType::kI8 || va.cols != vb.cols ||
      va.quant.static_activation != vb.quant.static_activation ||
      va.quant.input_scale != vb.quant.input_scale ||
      va.quant.input_offset != vb.quant.input_offset) {
    return common::invalid_argument(what +
                                    ": gate_proj and up_proj are fused into one matrix, so they "
                                    "need the same quantization type and activation scale");
  }
  tensor::WeightMatrix out(DType::kI8, va.rows + vb.rows, va.cols);
  std::memcpy(out.mutable_i8(), va.data, size_t(va.rows * va.cols));
  std::memcpy(out.mutable_i8() + va.rows * va.cols, vb.data, size_t(vb.rows * vb.cols));
  std::memcpy(out.mutable_row_scale(), va.quant.row_scale, size_t(va.rows) * 4);
  std::memcpy(out.mutable_row_scale() + va.rows, vb.quant.row_scale, size_t(vb.rows) * 4);
  if (va.quant.row_bias || vb.quant.row_bias) {
    int32_t* bias = out.mutable_row_bias();
    for (int64_t i = 0; i < va.rows; ++i) bias[i] = va.quant.row_bias ? va.quant.row_bias[i] : 0;
    for (int64_t i = 0; i < vb.rows; ++i)
      bias[va.rows + i] = vb.quant.row_bias ? vb.quant.row_bias[i] : 0;
  }
  out.finish_int8(va.quant.static_activation, va.quant.input_scale, va.quant.input_offset);
  return out;
}

}  // namespace model
