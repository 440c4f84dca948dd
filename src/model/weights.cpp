// Weight loading: name mapping, shape checks against config.json, dtype conversion, FP8 weights
// kept as stored with their block scales (or block-dequantized to F32 where the kernels cannot
// read them in place), and random initialization for benchmarks.
#include "model/weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/logging.h"
#include "common/timer.h"
#include "kernels/int8_linear.h"
#include "model/load_parallel.h"
#include "model/quant_description.h"
#include "model/w8a8_weights.h"

namespace model {
namespace {

using common::Result;
using common::Status;
using tensor::DType;
using tensor::WeightMatrix;

// Copies n FP8 codes; true when one is a NaN (0x7f or 0xff). The test is branch-free so the
// loop vectorizes: (c & 0x7f) + 1 reaches 0x80 only for the NaN pattern.
bool copy_fp8_row(const uint8_t* src, uint8_t* dst, int64_t n) {
  uint8_t seen = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t c = src[j];
    dst[j] = c;
    seen |= static_cast<uint8_t>((c & 0x7f) + 1);
  }
  return (seen & 0x80) != 0;
}

// memcpy, on every thread when large (load_parallel.h).
void copy_bytes(const void* src, void* dst, size_t n) {
  constexpr int64_t kPiece = 1 << 20;
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  for_each_row_range((int64_t(n) + kPiece - 1) / kPiece, kPiece, [&](int64_t b, int64_t e) {
    const size_t begin = size_t(b * kPiece), end = std::min(n, size_t(e * kPiece));
    std::memcpy(d + begin, s + begin, end - begin);
  });
}

std::string shape_str(int64_t rows, int64_t cols) {
  return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

std::string file_of(const TensorInfo& t) {
  return std::filesystem::path(t.file).filename().string();
}

// Rows [row_begin, row_end) and columns [col_begin, col_end) of a tensor; -1: to the end.
struct Slice {
  int64_t row_begin = 0, row_end = -1, col_begin = 0, col_end = -1;
  static Slice rows(ShardRange r) { return {r.begin, r.end, 0, -1}; }
  static Slice cols(ShardRange c) { return {0, -1, c.begin, c.end}; }
};

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& ck, const ModelConfig& cfg, const TensorParallel& tp,
               const DataParallelExperts& dp_experts = {}, const QuantDescription* quant = nullptr)
      : ck_(ck), cfg_(cfg), tp_(tp), dp_experts_(dp_experts), quant_(quant) {}

  // A [rows, cols] tensor, or the part `slice` cuts from it (a TP shard: only those rows and
  // columns are read from the mapped file). Rows past the tensor's end (`pad_rows_to`, a
  // padded vocabulary shard) are zeros. BF16 stays BF16 unless force_f32; all else is F32.
  Result<WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols,
                              bool force_f32 = false, Slice slice = {}) const {
    Result<WeightMatrix> m = matrix_copy(name, rows, cols, force_f32, slice);
    // Copied: its mapped pages need not stay resident beside the copy.
    if (auto t = ck_.find(name); t.ok()) release_pages(**t);
    if (m.ok()) loaded_bytes_ += int64_t(m->size_bytes());
    return m;
  }

  Result<WeightMatrix> matrix_copy(const std::string& name, int64_t rows, int64_t cols,
                                   bool force_f32, Slice slice) const {
    CP_ASSIGN_OR_RETURN(const TensorInfo* t, ck_.find(name));
    // W8A8: the description's type decides (a tensor it leaves out is FLOAT unless stored I8).
    if (quant_ != nullptr && (quant_->types.count(name) || t->dtype == DType::kI8)) {
      CP_ASSIGN_OR_RETURN(QuantType type, quant_->type_of(name));
      if (type != QuantType::kFloat) {
        if (force_f32) {
          return common::invalid_argument(quant_->path + ": tensor '" + name + "' is listed as " +
                                          quant_->types.at(name) +
                                          ", but chunkpipe keeps it FLOAT (kv_b_proj and the "
                                          "router), as msmodelslim writes it");
        }
        const int64_t r1 = slice.row_end < 0 ? rows : slice.row_end;
        const int64_t c1 = slice.col_end < 0 ? cols : slice.col_end;
        CHECK(0 <= slice.row_begin && slice.row_begin <= r1 && 0 <= slice.col_begin &&
              slice.col_begin <= c1 && c1 <= cols)
            << "bad slice of " << name;
        // quant_bias is added once: on TP rank 0 of a row-parallel (column-sliced) layer.
        const bool whole_rows = slice.col_begin == 0 && c1 == cols;
        return read_int8_linear(
            ck_, name, type, rows, cols,
            {slice.row_begin, r1, slice.col_begin, c1, whole_rows || tp_.rank == 0, mix_static_});
      }
    }
    if (t->dtype == DType::kI8) {
      return common::invalid_argument(
          file_of(*t) + ": tensor '" + name + "' is I8, " +
          (quant_ ? "but " + quant_->path + " lists it as FLOAT"
                  : std::string("but the directory has no ") + kQuantDescriptionFile +
                        " (int8 weights load as msmodelslim's W8A8: --quantization ascend)"));
    }
    if (t->shape.size() != 2 || t->shape[0] != rows || t->shape[1] != cols) {
      return common::invalid_argument(file_of(*t) + ": tensor '" + name + "' has shape " +
                                      t->shape_string() + " but config.json implies " +
                                      shape_str(rows, cols));
    }
    const int64_t r0 = slice.row_begin, c0 = slice.col_begin;
    const int64_t r1 = slice.row_end < 0 ? rows : slice.row_end;
    const int64_t c1 = slice.col_end < 0 ? cols : slice.col_end;
    CHECK(0 <= r0 && r0 <= r1 && 0 <= c0 && c0 <= c1 && c1 <= cols) << "bad slice of " << name;
    const int64_t out_rows = r1 - r0, out_cols = c1 - c0;
    const int64_t real_rows = std::max<int64_t>(0, std::min(r1, rows) - r0);
    if (t->dtype == DType::kF8E4M3 && !force_f32 && !fp8_dequantize_) {
      CP_ASSIGN_OR_RETURN(std::optional<WeightMatrix> kept,
                          fp8_matrix(*t, rows, cols, r0, r1, c0, c1));
      if (kept) return std::move(*kept);
    }
    // A new WeightMatrix is zero-filled, so padding rows need no writes.
    if (t->dtype == DType::kBF16 && !force_f32) {
      WeightMatrix m(DType::kBF16, out_rows, out_cols);
      uint16_t* dst = m.mutable_bf16();
      for_each_row_range(real_rows, out_cols * 2, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          std::memcpy(dst + i * out_cols, t->data + 2 * ((r0 + i) * cols + c0),
                      size_t(out_cols) * 2);
      });
      return m;
    }
    WeightMatrix m(DType::kF32, out_rows, out_cols);
    float* out = m.mutable_f32();
    if (t->dtype == DType::kF8E4M3) {
      CP_RETURN_IF_ERROR(dequantize_fp8(*t, rows, cols, r0, r0 + real_rows, c0, c1, out));
      return m;
    }
    for (int64_t i = 0; i < real_rows; ++i) {
      const uint8_t* src =
          t->data + size_t(tensor::dtype_size_bytes(t->dtype)) * size_t((r0 + i) * cols + c0);
      float* dst = out + i * out_cols;
      switch (t->dtype) {
        case DType::kF32:
          std::memcpy(dst, src, size_t(out_cols) * 4);
          break;
        case DType::kBF16:
        case DType::kF16:
          for (int64_t j = 0; j < out_cols; ++j) {
            uint16_t bits;
            std::memcpy(&bits, src + 2 * j, 2);
            dst[j] =
                t->dtype == DType::kBF16 ? tensor::bf16_to_f32(bits) : tensor::f16_to_f32(bits);
          }
          break;
        default:
          return common::invalid_argument(file_of(*t) + ": tensor '" + name +
                                          "' has an unsupported dtype");
      }
    }
    return m;
  }

  // The smoothing bias msmodelslim may add after an RMSNorm's scale; empty when absent.
  Result<Vector> optional_vector(const std::string& name, int64_t n) const {
    if (!ck_.contains(name)) return Vector();
    return vector(name, n);
  }

  Result<Vector> vector(const std::string& name, int64_t n) const {
    CP_ASSIGN_OR_RETURN(const TensorInfo* t, ck_.find(name));
    if (t->shape.size() != 1 || t->shape[0] != n) {
      return common::invalid_argument(file_of(*t) + ": tensor '" + name + "' has shape " +
                                      t->shape_string() + " but config.json implies [" +
                                      std::to_string(n) + "]");
    }
    if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
      return common::invalid_argument(file_of(*t) + ": tensor '" + name + "' has dtype " +
                                      std::string(tensor::dtype_name(t->dtype)) +
                                      ", expected a float type");
    }
    CP_ASSIGN_OR_RETURN(WeightMatrix m, matrix_from_vector(*t, n));
    return Vector(m.mutable_f32(), m.mutable_f32() + n);
  }

  // gate_proj and up_proj fused into one [2·part, H] matrix, for intermediate columns `part`
  // of `inter` (a TP shard: gate/up column-parallel, down row-parallel).
  Result<MlpWeights> mlp(const std::string& prefix, int64_t inter, ShardRange part) const {
    const int64_t h = cfg_.hidden_size;
    auto load = [&](bool force_f32, WeightMatrix* gate, WeightMatrix* up) -> Status {
      CP_ASSIGN_OR_RETURN(
          *gate, matrix(prefix + "gate_proj.weight", inter, h, force_f32, Slice::rows(part)));
      CP_ASSIGN_OR_RETURN(
          *up, matrix(prefix + "up_proj.weight", inter, h, force_f32, Slice::rows(part)));
      return {};
    };
    WeightMatrix gate, up;
    CP_RETURN_IF_ERROR(load(false, &gate, &up));
    MlpWeights w;
    CP_ASSIGN_OR_RETURN(w.down,
                        matrix(prefix + "down_proj.weight", h, inter, false, Slice::cols(part)));
    if (gate.dtype() == DType::kI8 || up.dtype() == DType::kI8) {
      CP_ASSIGN_OR_RETURN(w.gate_up, concat_int8_rows(gate, up, prefix + "{gate,up}_proj"));
      return w;
    }
    // FP8 halves stack only when gate's rows end on a scale block; else both become F32.
    const bool fp8 = gate.dtype() == DType::kF8E4M3;
    if (gate.dtype() != up.dtype() || (fp8 && gate.rows() % gate.view().fp8.block_rows != 0))
      CP_RETURN_IF_ERROR(load(true, &gate, &up));
    w.gate_up = WeightMatrix(gate.dtype(), 2 * part.size(), h);
    copy_bytes(gate.view().data, w.gate_up.mutable_bytes(), gate.size_bytes());
    copy_bytes(up.view().data, w.gate_up.mutable_bytes() + gate.size_bytes(), up.size_bytes());
    if (gate.dtype() == DType::kF8E4M3) {
      const tensor::Fp8BlockScale& g = gate.view().fp8;
      float* scale = w.gate_up.mutable_fp8_scale(g.block_rows, g.block_cols_log2);
      std::memcpy(scale, g.scale, gate.fp8_scale_count() * sizeof(float));
      std::memcpy(scale + gate.fp8_scale_count(), up.view().fp8.scale,
                  up.fp8_scale_count() * sizeof(float));
    }
    return w;
  }

  // This rank's vocabulary shard of a [V, H] table (embedding or head), zero-padded: of the
  // TP group, or of `split` when given (lmhead_tensor_parallel_size).
  Result<WeightMatrix> vocab_table(const std::string& name,
                                   const TensorParallel* split = nullptr) const {
    const TensorParallel& by = split != nullptr ? *split : tp_;
    const int64_t v = cfg_.vocab_size, per = vocab_shard_rows(v, by);
    CP_ASSIGN_OR_RETURN(WeightMatrix m, matrix(name, v, cfg_.hidden_size, false,
                                               {per * by.rank, per * (by.rank + 1), 0, -1}));
    if (m.dtype() == DType::kI8) {
      return common::invalid_argument(quant_->path + ": tensor '" + name +
                                      "' must be FLOAT (embeddings and heads are not quantized)");
    }
    return m;
  }
  void set_mix_static(bool mix_static) { mix_static_ = mix_static; }
  void set_fp8_dequantize(bool dequantize) { fp8_dequantize_ = dequantize; }
  void set_head_split(const LmHeadParallel& l) {
    if (l.active()) head_split_ = TensorParallel{l.rank, l.size, false};
  }
  const TensorParallel* head_split() const { return head_split_ ? &*head_split_ : nullptr; }
  // Bytes of the matrices loaded so far (thread-safe).
  int64_t loaded_bytes() const { return loaded_bytes_.load(); }

  Result<DecoderLayerWeights> decoder_layer(int layer) const {
    const ModelConfig& c = cfg_;
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    const int64_t h = c.hidden_size, nh = c.num_attention_heads, r = c.kv_lora_rank;
    const int64_t qk = c.qk_head_dim(), dn = c.qk_nope_head_dim, dv = c.v_head_dim;
    const ShardRange heads = even_shard(nh, tp_);
    DecoderLayerWeights w;
    CP_ASSIGN_OR_RETURN(w.input_layernorm, vector(p + "input_layernorm.weight", h));
    CP_ASSIGN_OR_RETURN(w.post_attention_layernorm,
                        vector(p + "post_attention_layernorm.weight", h));
    CP_ASSIGN_OR_RETURN(w.input_layernorm_bias, optional_vector(p + "input_layernorm.bias", h));
    CP_ASSIGN_OR_RETURN(w.post_attention_layernorm_bias,
                        optional_vector(p + "post_attention_layernorm.bias", h));
    AttentionWeights& a = w.attn;
    // Column-parallel by head: q_b (or q) and kv_b rows; row-parallel: o_proj's columns.
    const Slice q_rows = Slice::rows({heads.begin * qk, heads.end * qk});
    if (c.q_lora_rank) {
      const int64_t rq = *c.q_lora_rank;
      CP_ASSIGN_OR_RETURN(a.q_a_proj, matrix(p + "self_attn.q_a_proj.weight", rq, h));
      CP_ASSIGN_OR_RETURN(a.q_a_layernorm, vector(p + "self_attn.q_a_layernorm.weight", rq));
      CP_ASSIGN_OR_RETURN(a.q_a_layernorm_bias,
                          optional_vector(p + "self_attn.q_a_layernorm.bias", rq));
      CP_ASSIGN_OR_RETURN(a.q_b_proj,
                          matrix(p + "self_attn.q_b_proj.weight", nh * qk, rq, false, q_rows));
    } else {
      CP_ASSIGN_OR_RETURN(a.q_proj,
                          matrix(p + "self_attn.q_proj.weight", nh * qk, h, false, q_rows));
    }
    CP_ASSIGN_OR_RETURN(
        a.kv_a_proj, matrix(p + "self_attn.kv_a_proj_with_mqa.weight", r + c.qk_rope_head_dim, h));
    CP_ASSIGN_OR_RETURN(a.kv_a_layernorm, vector(p + "self_attn.kv_a_layernorm.weight", r));
    CP_ASSIGN_OR_RETURN(a.kv_a_layernorm_bias,
                        optional_vector(p + "self_attn.kv_a_layernorm.bias", r));
    CP_ASSIGN_OR_RETURN(a.kv_b_proj,
                        matrix(p + "self_attn.kv_b_proj.weight", nh * (dn + dv), r, true,
                               Slice::rows({heads.begin * (dn + dv), heads.end * (dn + dv)})));
    CP_ASSIGN_OR_RETURN(a.o_proj, matrix(p + "self_attn.o_proj.weight", h, nh * dv, false,
                                         Slice::cols({heads.begin * dv, heads.end * dv})));
    add_absorbed_projections(a, dn, dv);
    if (c.is_moe_layer(layer)) {
      MoeWeights m;
      const int64_t e = c.n_routed_experts, inter = c.moe_intermediate_size;
      CP_ASSIGN_OR_RETURN(m.router, matrix(p + "mlp.gate.weight", e, h, true));
      if (c.topk_method == kernels::TopkMethod::kNoauxTc) {
        CP_ASSIGN_OR_RETURN(m.correction_bias, vector(p + "mlp.gate.e_score_correction_bias", e));
      }
      // Expert parallel: whole experts, this rank's share of them; else every expert's
      // intermediate columns are split like a dense MLP's.
      // Over DP x TP ranks, this rank's share of all the experts, whole.
      const ShardRange experts =
          dp_experts_.active()
              ? even_shard(e, TensorParallel{dp_experts_.rank, dp_experts_.size, true})
          : tp_.expert_parallel ? even_shard(e, tp_)
                                : ShardRange{0, e};
      const ShardRange expert_part =
          tp_.expert_parallel ? ShardRange{0, inter} : even_shard(inter, tp_);
      m.first_expert = static_cast<int>(experts.begin);
      CP_ASSIGN_OR_RETURN(m.experts, load_experts(p, experts, inter, expert_part));
      for (const MlpWeights& ew : m.experts) m.expert_views.push_back(ew.view());
      if (c.n_shared_experts > 0) {
        const int64_t shared = inter * c.n_shared_experts;
        CP_ASSIGN_OR_RETURN(
            m.shared, mlp(p + "mlp.shared_experts.", shared,
                          tp_.expert_parallel ? ShardRange{0, shared} : even_shard(shared, tp_)));
      }
      w.moe = std::move(m);
    } else {
      CP_ASSIGN_OR_RETURN(
          w.dense_mlp, mlp(p + "mlp.", c.intermediate_size, even_shard(c.intermediate_size, tp_)));
    }
    return w;
  }

  // Experts [range.begin, range.end) of the layer at `prefix`, on every hardware thread: the
  // copies (and FP8's NaN scan) run at memory speed instead of one core's. The first failure in
  // expert order is returned.
  Result<std::vector<MlpWeights>> load_experts(const std::string& prefix, ShardRange range,
                                               int64_t inter, ShardRange part) const {
    const int64_t count = range.size();
    std::vector<std::optional<Result<MlpWeights>>> loaded(static_cast<size_t>(count));
    std::atomic<int64_t> next{0};
    auto work = [&] {
      ParallelLoadScope scope;  // each expert's copies stay on its thread
      for (int64_t i; (i = next.fetch_add(1)) < count;) {
        loaded[size_t(i)].emplace(
            mlp(prefix + "mlp.experts." + std::to_string(range.begin + i) + ".", inter, part));
      }
    };
    const int threads = static_cast<int>(std::min<int64_t>(count, load_threads()));
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t) workers.emplace_back(work);
    work();
    for (std::thread& w : workers) w.join();
    std::vector<MlpWeights> out;
    out.reserve(size_t(count));
    for (auto& r : loaded) {
      if (!r->ok()) return r->status();
      out.push_back(std::move(**r));
    }
    return out;
  }

  // A whole [rows, cols] matrix in f32, whatever the description says (rot.weight).
  Result<WeightMatrix> float_matrix(const std::string& name, int64_t rows, int64_t cols) const {
    return matrix(name, rows, cols, true);
  }

  Result<MtpWeights> mtp_layer(int layer) const {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    const int64_t h = cfg_.hidden_size;
    MtpWeights w;
    CP_ASSIGN_OR_RETURN(w.enorm, vector(p + "enorm.weight", h));
    CP_ASSIGN_OR_RETURN(w.hnorm, vector(p + "hnorm.weight", h));
    CP_ASSIGN_OR_RETURN(w.shared_head_norm, vector(p + "shared_head.norm.weight", h));
    CP_ASSIGN_OR_RETURN(w.eh_proj, matrix(p + "eh_proj.weight", h, 2 * h));
    if (ck_.contains(p + "embed_tokens.weight")) {
      CP_ASSIGN_OR_RETURN(w.embed_tokens, vocab_table(p + "embed_tokens.weight"));
    }
    if (ck_.contains(p + "shared_head.head.weight")) {
      CP_ASSIGN_OR_RETURN(w.shared_head_head,
                          vocab_table(p + "shared_head.head.weight", head_split()));
    }
    CP_ASSIGN_OR_RETURN(w.layer, decoder_layer(layer));
    return w;
  }

 private:
  Result<WeightMatrix> matrix_from_vector(const TensorInfo& t, int64_t n) const {
    WeightMatrix m(DType::kF32, 1, n);
    float* out = m.mutable_f32();
    for (int64_t i = 0; i < n; ++i) {
      if (t.dtype == DType::kF32) {
        std::memcpy(out + i, t.data + 4 * i, 4);
      } else {
        uint16_t bits;
        std::memcpy(&bits, t.data + 2 * i, 2);
        out[i] = t.dtype == DType::kBF16 ? tensor::bf16_to_f32(bits) : tensor::f16_to_f32(bits);
      }
    }
    return m;
  }

  // An FP8 weight's weight_scale_inv, checked against its shape and the block size.
  struct Fp8Scales {
    const TensorInfo* tensor = nullptr;
    int64_t block_rows = 0, block_cols = 0, scale_cols = 0;
  };
  Result<Fp8Scales> fp8_scales(const TensorInfo& t, int64_t rows, int64_t cols) const {
    const std::string& name = t.name;
    if (name.size() < 6 || name.compare(name.size() - 6, 6, "weight") != 0) {
      return common::invalid_argument(file_of(t) + ": FP8 tensor '" + name + "' is not a weight");
    }
    const std::string scale_name = name.substr(0, name.size() - 6) + "weight_scale_inv";
    CP_ASSIGN_OR_RETURN(const TensorInfo* s, ck_.find(scale_name));
    const int64_t br = cfg_.quantization ? cfg_.quantization->weight_block_rows : 128;
    const int64_t bc = cfg_.quantization ? cfg_.quantization->weight_block_cols : 128;
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    if (s->dtype != DType::kF32 || s->shape.size() != 2 || s->shape[0] != sr || s->shape[1] != sc) {
      return common::invalid_argument(
          file_of(*s) + ": tensor '" + scale_name + "' must be F32 " + shape_str(sr, sc) + " for " +
          shape_str(rows, cols) + " in " + std::to_string(br) + "x" + std::to_string(bc) +
          " blocks, got " + std::string(tensor::dtype_name(s->dtype)) + " " + s->shape_string());
    }
    return Fp8Scales{s, br, bc, sc};
  }

  // Rows [r0, r1) and columns [c0, c1) of an FP8 weight held as stored: its codes and the scale
  // blocks that cover them. nullopt where the kernels cannot read it in place, which then
  // becomes F32 as before: a slice that starts inside a scale block, a block width that is not
  // a power of two of at least 16, padding rows, or a scale too large to carry the kernels'
  // factor of 256 (simd.h). A NaN code (0x7f / 0xff) fails the load.
  Result<std::optional<WeightMatrix>> fp8_matrix(const TensorInfo& t, int64_t rows, int64_t cols,
                                                 int64_t r0, int64_t r1, int64_t c0,
                                                 int64_t c1) const {
    CP_ASSIGN_OR_RETURN(Fp8Scales s, fp8_scales(t, rows, cols));
    const int64_t br = s.block_rows, bc = s.block_cols;
    const bool pow2 = bc >= 16 && (bc & (bc - 1)) == 0;
    if (!pow2 || r0 % br != 0 || c0 % bc != 0 || r1 > rows) return std::optional<WeightMatrix>();
    const int64_t out_rows = r1 - r0, out_cols = c1 - c0;
    int log2 = 0;
    while ((int64_t{1} << log2) < bc) ++log2;
    WeightMatrix m(DType::kF8E4M3, out_rows, out_cols);
    float* scale = m.mutable_fp8_scale(br, log2);
    const int64_t scale_rows = (out_rows + br - 1) / br, scale_cols = (out_cols + bc - 1) / bc;
    const float* src_scale = reinterpret_cast<const float*>(s.tensor->data);
    for (int64_t i = 0; i < scale_rows; ++i) {
      for (int64_t j = 0; j < scale_cols; ++j) {
        float v;
        std::memcpy(&v, src_scale + (r0 / br + i) * s.scale_cols + c0 / bc + j, sizeof(v));
        if (!(std::fabs(v) < 0x1p100f)) return std::optional<WeightMatrix>();
        scale[i * scale_cols + j] = v;
      }
    }
    // Copies and scans for NaN codes (0x7f / 0xff) in one pass over the mapped bytes.
    uint8_t* codes = m.mutable_bytes();
    std::atomic<int64_t> first_nan_row{out_rows};
    for_each_row_range(out_rows, out_cols, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        if (copy_fp8_row(t.data + (r0 + i) * cols + c0, codes + i * out_cols, out_cols)) {
          int64_t seen = first_nan_row.load();
          while (i < seen && !first_nan_row.compare_exchange_weak(seen, i)) {
          }
          return;
        }
      }
    });
    if (const int64_t i = first_nan_row.load(); i < out_rows) {
      const uint8_t* row = codes + i * out_cols;
      int64_t j = 0;
      while ((row[j] & 0x7f) != 0x7f) ++j;
      return common::data_loss(file_of(t) + ": FP8 tensor '" + t.name + "' holds a NaN code at " +
                               shape_str(r0 + i, c0 + j) + " (a corrupt checkpoint)");
    }
    return std::optional<WeightMatrix>(std::move(m));
  }

  // W[i, j] = fp8(W_q[i, j]) · weight_scale_inv[i / block_rows, j / block_cols].
  // Rows [r0, r1) and columns [c0, c1) only: a shard boundary may cut a scale block, and
  // each element still takes its own block's scale.
  Status dequantize_fp8(const TensorInfo& t, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                        int64_t c0, int64_t c1, float* out) const {
    CP_ASSIGN_OR_RETURN(Fp8Scales fs, fp8_scales(t, rows, cols));
    const TensorInfo* s = fs.tensor;
    const int64_t br = fs.block_rows, bc = fs.block_cols, sc = fs.scale_cols;
    std::vector<float> scales(static_cast<size_t>(s->shape[0] * sc));
    std::memcpy(scales.data(), s->data, scales.size() * sizeof(float));
    const int64_t w = c1 - c0;
    for_each_row_range(r1 - r0, w * 4, [&](int64_t b, int64_t e) {
      for (int64_t i = r0 + b; i < r0 + e; ++i) {
        const float* srow = scales.data() + (i / br) * sc;
        for (int64_t j = c0; j < c1; ++j) {
          out[(i - r0) * w + (j - c0)] =
              tensor::fp8_e4m3_to_f32(t.data[i * cols + j]) * srow[j / bc];
        }
      }
    });
    return {};
  }

  const Checkpoint& ck_;
  const ModelConfig& cfg_;
  TensorParallel tp_;
  DataParallelExperts dp_experts_;
  const QuantDescription* quant_;  // W8A8 checkpoints; null otherwise
  bool mix_static_ = false;
  bool fp8_dequantize_ = false;
  mutable std::atomic<int64_t> loaded_bytes_{0};
  std::optional<TensorParallel> head_split_;
};

// splitmix64 + Box-Muller: fast enough to fill a billion-parameter model in seconds.
class FastRandom {
 public:
  explicit FastRandom(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform() + 1e-300, u2 = uniform();
    double mag = std::sqrt(-2.0 * std::log(u1));
    spare_ = mag * std::sin(2 * M_PI * u2);
    has_spare_ = true;
    return mag * std::cos(2 * M_PI * u2);
  }

 private:
  uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

// kI8 means msmodelslim's DeepSeek layout: the projections and MLPs W8A8_DYNAMIC (int8,
// per-channel scales), everything else (embedding, lm_head, eh_proj) BF16; kv_b_proj and the
// router are F32 in memory in every mode, holding values exact in bf16 unless dtype is kF32 (as
// when a BF16 checkpoint is loaded).
class RandomFiller {
 public:
  RandomFiller(DType dtype, uint64_t seed) : dtype_(dtype), rng_(seed) {}
  WeightMatrix matrix(int64_t rows, int64_t cols, double stddev, bool force_f32 = false) {
    DType d = force_f32 ? DType::kF32 : float_dtype();
    const bool bf16_values = float_dtype() == DType::kBF16;
    WeightMatrix m(d, rows, cols);
    for (int64_t i = 0; i < rows * cols; ++i) {
      float v = static_cast<float>(rng_.normal() * stddev);
      if (d == DType::kF32) {
        m.mutable_f32()[i] = bf16_values ? tensor::bf16_to_f32(tensor::f32_to_bf16(v)) : v;
      } else {
        m.mutable_bf16()[i] = tensor::f32_to_bf16(v);
      }
    }
    return m;
  }
  // A projection or MLP matrix: int8 in W8A8 mode.
  WeightMatrix linear(int64_t out, int64_t in, bool force_f32 = false) {
    const double stddev = 1.0 / std::sqrt(static_cast<double>(in));
    if (dtype_ != DType::kI8 || force_f32) return matrix(out, in, stddev, force_f32);
    std::vector<float> values(static_cast<size_t>(out * in));
    for (float& v : values) v = static_cast<float>(rng_.normal() * stddev);
    WeightMatrix m;
    kernels::quantize_weight_rows(values.data(), out, in, m);
    return m;
  }
  // A matrix W8A8 checkpoints keep FLOAT.
  WeightMatrix float_linear(int64_t out, int64_t in) {
    return matrix(out, in, 1.0 / std::sqrt(static_cast<double>(in)));
  }
  Vector norm(int64_t n) {
    Vector v(n);
    for (auto& x : v) x = static_cast<float>(0.8 + 0.4 * rng_.uniform());
    return v;
  }
  Vector uniform(int64_t n, double scale) {
    Vector v(n);
    for (auto& x : v) x = static_cast<float>(scale * rng_.uniform());
    return v;
  }
  MlpWeights mlp(int64_t inter, int64_t h) {
    MlpWeights w;
    w.gate_up = linear(2 * inter, h);
    w.down = linear(h, inter);
    return w;
  }

 private:
  DType float_dtype() const { return dtype_ == DType::kI8 ? DType::kBF16 : dtype_; }

  DType dtype_;
  FastRandom rng_;
};

DecoderLayerWeights random_layer(const ModelConfig& c, int layer, RandomFiller& rf) {
  const int64_t h = c.hidden_size, nh = c.num_attention_heads, r = c.kv_lora_rank;
  DecoderLayerWeights w;
  w.input_layernorm = rf.norm(h);
  w.post_attention_layernorm = rf.norm(h);
  if (c.q_lora_rank) {
    w.attn.q_a_proj = rf.linear(*c.q_lora_rank, h);
    w.attn.q_a_layernorm = rf.norm(*c.q_lora_rank);
    w.attn.q_b_proj = rf.linear(nh * c.qk_head_dim(), *c.q_lora_rank);
  } else {
    w.attn.q_proj = rf.linear(nh * c.qk_head_dim(), h);
  }
  w.attn.kv_a_proj = rf.linear(r + c.qk_rope_head_dim, h);
  w.attn.kv_a_layernorm = rf.norm(r);
  w.attn.kv_b_proj = rf.linear(nh * (c.qk_nope_head_dim + c.v_head_dim), r, true);
  w.attn.o_proj = rf.linear(h, nh * c.v_head_dim);
  add_absorbed_projections(w.attn, c.qk_nope_head_dim, c.v_head_dim);
  if (c.is_moe_layer(layer)) {
    MoeWeights m;
    m.router = rf.linear(c.n_routed_experts, h, true);
    if (c.topk_method == kernels::TopkMethod::kNoauxTc)
      m.correction_bias = rf.uniform(c.n_routed_experts, 0.2);
    for (int e = 0; e < c.n_routed_experts; ++e)
      m.experts.push_back(rf.mlp(c.moe_intermediate_size, h));
    for (const MlpWeights& ew : m.experts) m.expert_views.push_back(ew.view());
    if (c.n_shared_experts > 0) m.shared = rf.mlp(c.moe_intermediate_size * c.n_shared_experts, h);
    w.moe = std::move(m);
  } else {
    w.dense_mlp = rf.mlp(c.intermediate_size, h);
  }
  return w;
}

}  // namespace

void add_absorbed_projections(AttentionWeights& a, int64_t qk_nope_head_dim, int64_t v_head_dim) {
  const tensor::WeightView kv_b = a.kv_b_proj.view();
  CHECK(kv_b.dtype == DType::kF32) << "kv_b_proj is kept F32";
  const int64_t dn = qk_nope_head_dim, dv = v_head_dim, r = kv_b.cols;
  const int64_t nh = kv_b.rows / (dn + dv);
  CHECK(nh * (dn + dv) == kv_b.rows) << "kv_b_proj rows are not whole heads";
  const float* src = kv_b.f32();
  bool exact = true;
  for (int64_t i = 0; exact && i < kv_b.rows * r; ++i)
    exact = tensor::bf16_to_f32(tensor::f32_to_bf16(src[i])) == src[i];
  const DType d = exact ? DType::kBF16 : DType::kF32;
  a.absorb_uk_t = WeightMatrix(d, nh * r, dn);
  a.absorb_uv = WeightMatrix(d, nh * dv, r);
  auto put = [&](WeightMatrix& m, int64_t i, float v) {
    if (exact) {
      m.mutable_bf16()[i] = tensor::f32_to_bf16(v);
    } else {
      m.mutable_f32()[i] = v;
    }
  };
  for (int64_t h = 0; h < nh; ++h) {
    const float* uk = src + h * (dn + dv) * r;  // [dn, r]
    const float* uv = uk + dn * r;              // [dv, r]
    for (int64_t j = 0; j < r; ++j)
      for (int64_t d = 0; d < dn; ++d) put(a.absorb_uk_t, (h * r + j) * dn + d, uk[d * r + j]);
    for (int64_t i = 0; i < dv * r; ++i) put(a.absorb_uv, h * dv * r + i, uv[i]);
  }
}

// Logs a load's progress: a line per layer at most every 2 s, and the total at the end of a load
// of 256 MiB or more (small test models load silently: their commands' stderr stays clean).
class LoadProgress {
 public:
  LoadProgress(const WeightLoader& loader, int layers)
      : loader_(loader), layers_(layers), start_(common::now_seconds()), last_(start_) {}
  void layer_done(int layer) {
    ++done_;
    const double now = common::now_seconds();
    if (now - last_ < 2.0 || done_ == layers_) return;
    last_ = now;
    logged_ = true;
    LOG(INFO) << "Loading weights: " << done_ << " of " << layers_ << " layers (to layer " << layer
              << "), " << line(now);
  }
  void finish() const {
    if (loader_.loaded_bytes() < (int64_t{256} << 20) && !logged_) return;
    LOG(INFO) << "Loaded the weights: " << line(common::now_seconds()) << " on " << load_threads()
              << " thread(s)";
  }

 private:
  std::string line(double now) const {
    const double bytes = double(loader_.loaded_bytes()), s = std::max(now - start_, 1e-9);
    std::ostringstream out;
    out << std::fixed << std::setprecision(2) << bytes / double(1 << 30) << " GiB in "
        << std::setprecision(1) << s << " s (" << std::setprecision(2) << bytes / s / 1e9
        << " GB/s)";
    return out.str();
  }
  const WeightLoader& loader_;
  const int layers_;
  const double start_;
  double last_;
  int done_ = 0;
  bool logged_ = false;
};

Result<ModelWeights> load_weights(const Checkpoint& ck, const ModelConfig& c,
                                  const LoadOptions& options) {
  CP_RETURN_IF_ERROR(validate_tensor_parallel(c, options.tp));
  CP_RETURN_IF_ERROR(validate_dp_experts(c, options.dp_experts, options.tp));
  std::optional<QuantDescription> quant;
  if (options.quantization.empty() || options.quantization == "ascend") {
    CP_ASSIGN_OR_RETURN(quant, load_quant_description(ck.dir()));
    if (!quant && options.quantization == "ascend") {
      return common::invalid_argument("--quantization ascend needs " +
                                      std::string(kQuantDescriptionFile) + " in " + ck.dir() +
                                      " (msmodelslim writes it beside the weights)");
    }
  }
  WeightLoader loader(ck, c, options.tp, options.dp_experts, quant ? &*quant : nullptr);
  loader.set_mix_static(options.w8a8_mix_static);
  loader.set_fp8_dequantize(options.fp8_dequantize);
  loader.set_head_split(options.lmhead_tp);
  ModelWeights w;
  const int64_t h = c.hidden_size;
  const int end = options.layer_end < 0 ? c.num_hidden_layers : options.layer_end;
  if (options.layer_begin < 0 || options.layer_begin > end || end > c.num_hidden_layers) {
    return common::invalid_argument("layer range [" + std::to_string(options.layer_begin) + ", " +
                                    std::to_string(end) + ") is outside the model's " +
                                    std::to_string(c.num_hidden_layers) + " layers");
  }
  if (options.load_embedding) {
    CP_ASSIGN_OR_RETURN(w.embed_tokens, loader.vocab_table("model.embed_tokens.weight"));
  }
  if (options.load_head) {
    CP_ASSIGN_OR_RETURN(w.norm, loader.vector("model.norm.weight", h));
    CP_ASSIGN_OR_RETURN(w.lm_head, loader.vocab_table("lm_head.weight", loader.head_split()));
  }
  w.layers.resize(c.num_hidden_layers);
  LoadProgress progress(loader, end - options.layer_begin);
  for (int layer = options.layer_begin; layer < end; ++layer) {
    CP_ASSIGN_OR_RETURN(w.layers[layer], loader.decoder_layer(layer));
    progress.layer_done(layer);
  }
  if (options.load_mtp && options.load_head) {
    for (int k = 0; k < c.num_nextn_predict_layers; ++k) {
      CP_ASSIGN_OR_RETURN(MtpWeights m, loader.mtp_layer(c.num_hidden_layers + k));
      // An MTP layer without its own embedding copy embeds with the main table, which a last
      // pipeline stage then needs too.
      if (m.embed_tokens.empty() && w.embed_tokens.empty()) {
        CP_ASSIGN_OR_RETURN(w.embed_tokens, loader.vocab_table("model.embed_tokens.weight"));
      }
      w.mtp.push_back(std::move(m));
    }
    // QuaRot (is_rot_used): the main model is rotated, the MTP layer is not, so the hidden
    // state it receives is rotated back by rot.weight first.
    if (quant && quant->is_rot_used && c.num_nextn_predict_layers > 0) {
      if (!ck.contains("rot.weight")) {
        return common::invalid_argument(quant->path +
                                        ": is_rot_used is true but the checkpoint has no "
                                        "'rot.weight'");
      }
      CP_ASSIGN_OR_RETURN(w.mtp_rotation, loader.float_matrix("rot.weight", h, h));
    }
  }
  if (options.lm_head_int8) quantize_lm_head_int8(w);
  progress.finish();
  return w;
}

void quantize_lm_head_int8(ModelWeights& w) {
  auto quantize = [](tensor::WeightMatrix& m) {
    if (!m.empty() && m.dtype() != tensor::DType::kI8) m = kernels::quantize_weight_rows(m.view());
  };
  quantize(w.lm_head);
  for (MtpWeights& m : w.mtp) quantize(m.shared_head_head);
}

ModelWeights random_weights(const ModelConfig& c, DType dtype, uint64_t seed) {
  CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kI8)
      << "random weights are F32, BF16 or I8 (W8A8)";
  RandomFiller rf(dtype, seed);
  ModelWeights w;
  const int64_t h = c.hidden_size, v = c.vocab_size;
  w.embed_tokens = rf.matrix(v, h, 1.0);
  w.lm_head = rf.float_linear(v, h);
  w.norm = rf.norm(h);
  for (int layer = 0; layer < c.num_hidden_layers; ++layer)
    w.layers.push_back(random_layer(c, layer, rf));
  for (int k = 0; k < c.num_nextn_predict_layers; ++k) {
    MtpWeights m;
    m.enorm = rf.norm(h);
    m.hnorm = rf.norm(h);
    m.shared_head_norm = rf.norm(h);
    m.eh_proj = rf.float_linear(h, 2 * h);
    m.layer = random_layer(c, c.num_hidden_layers + k, rf);
    w.mtp.push_back(std::move(m));
  }
  return w;
}

}  // namespace model
