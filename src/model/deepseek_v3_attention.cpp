// DeepseekV3Model::attention, MLA (deepseek-v3-model.md §5): the query and latent projections,
// the latent cache write, then per sequence the absorbed form (MQA over the cached latent) or the
// expanded form (each head's k and v re-expanded from the latent a key segment at a time), and
// o_proj. One forward at a time; the kernels fan out over the pool, and the buffers are the
// calling thread's scratch (forward_internal.h).
#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "common/check.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/mla_attention.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "model/deepseek_v3.h"
#include "model/forward_internal.h"
#include "model/kv_cache.h"
#include "tensor/aligned_buffer.h"

namespace model {
namespace {

using forward::add_norm_bias;
using forward::Scratch;
using forward::scratch;
using forward::scratch_span;

// Keys per segment of the history expansion: a quarter of the chunk's queries, at least 256.
// A segment's kᵀ and v (4 KiB per key on the CPP model) stay in cache while the attention reads
// them, which is what small chunks after a long history gain most from (16 queries after 12288
// keys, 8 layers, 1 thread: 265 -> 163 ms on AMX, 468-478 -> 363-365 ms on sgemm and AVX-512). Each
// segment also costs every query a reload of its softmax state, which large chunks amortize only
// over longer segments. Measured after 8192 keys (attention_form_bench): 1024 queries ran best on
// 256-key segments (4% ahead of 1024), 2048 on 512 (256 was 4% slower), and 4096 within 1.5% on
// 1024 to 4096, but 5% slower on 256. A multiple of kMlaPrefillKeyAlign.
int64_t expansion_segment_keys(int64_t num_queries) {
  constexpr int64_t kAlign = kernels::kMlaPrefillKeyAlign;
  return std::max<int64_t>(256, (num_queries / 4 + kAlign - 1) / kAlign * kAlign);
}

// One sequence of the batch, as both forms read it.
struct SequenceAttention {
  const SequenceChunk& s;
  int nh, dn, dr, dv, qk;    // this rank's heads; per head: nope, rope, value and query widths
  int64_t r, row;            // latent rank; cache row r + dr
  int64_t n, ctx;            // the chunk's queries; keys (history and chunk)
  float scale;               // softmax scale
  const float* qs;           // queries [n, nh, qk]
  float* os;                 // outputs [n, nh, dv]
  const float* kv_b;         // kv_b_proj [nh, dn + dv, r], F32
  int64_t kv_b_head;         // (dn + dv) · r
  int bs;                    // cache block size
  const float* layer_cache;  // this layer's f32 cache, or
  const uint16_t* layer_cache_bf16;  // its bf16 one

  // The absorbed form: q_nope · W_UK per head, MQA over the latent, then W_UV per head.
  void absorbed_form(const AttentionWeights& w, common::ThreadPool& pool) const;
  // The expanded form: k and v of every head from the latent (or the expanded cache's rows),
  // and the prefill attention over them. `uk_packed` says whether this layer call has packed
  // W_UK for the bf16 expansion yet (the first sequence that needs it does).
  void expanded_form(const AttentionWeights& w, LatentKvCache& cache, int cache_layer,
                     bool& uk_packed, common::ThreadPool& pool) const;
};

void SequenceAttention::absorbed_form(const AttentionWeights& w, common::ThreadPool& pool) const {
  // A few tokens stream the per-head projections from absorb_uk_t / absorb_uv (BF16 where
  // exact: half the bytes); more run sgemm on kv_b_proj's F32 rows, whose arithmetic wins.
  const tensor::WeightView uk_t = w.absorb_uk_t.view(), uv = w.absorb_uv.view();
  const bool streamed = !w.absorb_uk_t.empty() &&
                        n <= (uk_t.dtype == tensor::DType::kBF16 ? kernels::kStreamingMaxRowsBf16
                                                                 : kernels::kStreamingMaxRowsF32);
  // The streaming kernel reads n rows of `cols` packed: head h's slice of each token's row
  // (in place for one token, the decode case).
  auto gather = [&](const float* src, int64_t ld, int64_t cols, std::vector<float>& dst) {
    if (n == 1) return src;
    dst.resize(size_t(n * cols));
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(dst.data() + t * cols, src + t * ld, cols * sizeof(float));
    return static_cast<const float*>(dst.data());
  };
  // q_cat[t, h] = [q_nope[t, h] · W_UK[h] | q_pe[t, h]]
  std::vector<float> q_cat(n * nh * row), o_lat(n * nh * r);
  pool.parallel_for(nh, 1, [&](int64_t h0, int64_t h1, int) {
    std::vector<float> rows;
    for (int64_t h = h0; h < h1; ++h) {
      if (streamed) {
        kernels::linear_streaming_serial(gather(qs + h * qk, int64_t{nh} * qk, dn, rows), n,
                                         uk_t.row_range(h * r, r), q_cat.data() + h * row,
                                         nh * row);
      } else {
        kernels::sgemm(n, r, dn, 1.0f, qs + h * qk, int64_t{nh} * qk, kv_b + h * kv_b_head, r,
                       false, 0.0f, q_cat.data() + h * row, nh * row);
      }
      for (int64_t t = 0; t < n; ++t) {
        std::memcpy(q_cat.data() + (t * nh + h) * row + r, qs + t * nh * qk + h * qk + dn,
                    dr * sizeof(float));
      }
    }
  });
  kernels::MlaDecodeArgs args;
  args.num_heads = nh;
  args.kv_lora_rank = static_cast<int>(r);
  args.rope_dim = dr;
  args.num_queries = n;
  args.context_len = ctx;
  args.scale = scale;
  args.q = q_cat.data();
  args.cache = layer_cache;
  args.cache_bf16 = layer_cache_bf16;
  args.block_table = s.block_table.data();
  args.block_size = bs;
  args.out = o_lat.data();
  kernels::mla_decode_attention(args, pool);
  // o[t, h] = W_UV[h] · o_lat[t, h]
  pool.parallel_for(nh, 1, [&](int64_t h0, int64_t h1, int) {
    std::vector<float> rows;
    for (int64_t h = h0; h < h1; ++h) {
      if (streamed) {
        kernels::linear_streaming_serial(gather(o_lat.data() + h * r, nh * r, r, rows), n,
                                         uv.row_range(h * dv, dv), os + h * dv, int64_t{nh} * dv);
      } else {
        kernels::sgemm(n, dv, r, 1.0f, o_lat.data() + h * r, nh * r, kv_b + h * kv_b_head + dn * r,
                       r, true, 0.0f, os + h * dv, int64_t{nh} * dv);
      }
    }
  });
}

void SequenceAttention::expanded_form(const AttentionWeights& w, LatentKvCache& cache,
                                      int cache_layer, bool& uk_packed,
                                      common::ThreadPool& pool) const {
  const int64_t ex_dim = cache.expanded_dim();
  const bool bf16_cache = cache.dtype() == KvCacheDtype::kBf16;

  // The kernel reads keys transposed (kᵀ rows of ctx keys) and values as rows. Gather k_pe
  // transposed, and the latent (expanded here per head) or the cached expanded rows. A block
  // of keys touches every kᵀ row, so rows are an odd number of cache lines apart: rows a
  // power of two apart would all fall in the same cache sets.
  const int64_t kt_ld = ((ctx + 15) / 16 | 1) * 16;
  const bool segmented = ex_dim == 0;
  const bool amx = segmented && kernels::amx_bf16_active();
  // A bf16 cache's latent and kv_b_proj's values (when all are exact in bf16) multiply exactly
  // in vdpbf16ps, at twice the f32 FMA rate; AMX keeps its tiles.
  const bool bf16_expand = segmented && bf16_cache && !amx && r % 2 == 0 &&
                           kernels::cpu_features().avx512_bf16 &&
                           w.absorb_uv.view().dtype == tensor::DType::kBF16;
  // The expansion runs a segment of keys at a time into buffers that stay in cache while the
  // attention reads them: expanding the whole history first wrote and re-read k and v of
  // every key through memory (at 16k keys, 64 MB per layer on the CPP model).
  const int64_t segment = segmented ? std::min(ctx, expansion_segment_keys(n)) : ctx;
  const int64_t seg_ld = ((segment + 15) / 16 | 1) * 16;
  float* kt_pe = scratch(Scratch::kKtPe, size_t(kt_ld * dr));
  float* kt = scratch(Scratch::kKt, size_t(int64_t{nh} * dn * (segmented ? seg_ld : kt_ld)));
  float* kv = scratch(Scratch::kKv, size_t(segment * (ex_dim > 0 ? ex_dim : int64_t{nh} * dv)));
  float* c_kv = ex_dim > 0 ? nullptr : scratch(Scratch::kLatent, size_t(ctx * r));
  thread_local tensor::AlignedBuffer<uint16_t> c_bits_scratch;
  if (bf16_expand && c_bits_scratch.size() < size_t(ctx * r))
    c_bits_scratch.resize(size_t(std::max(ctx * r, int64_t(c_bits_scratch.size() * 3 / 2))));
  uint16_t* c_bits = bf16_expand ? c_bits_scratch.data() : nullptr;
  std::vector<float> widened(bf16_cache ? size_t(row) : 0);
  for (int64_t j = 0; j < ctx; ++j) {
    const int64_t slot = int64_t{s.block_table[j / bs]} * bs + j % bs;
    const float* src = layer_cache ? layer_cache + slot * row : widened.data();
    if (bf16_cache) {
      const uint16_t* bits = layer_cache_bf16 + slot * row;
      kernels::bf16_to_f32_row(bits, widened.data(), row);
      if (c_bits) std::memcpy(c_bits + j * r, bits, size_t(r) * sizeof(uint16_t));
    }
    for (int d = 0; d < dr; ++d) kt_pe[d * kt_ld + j] = src[r + d];
    if (ex_dim > 0) {
      const float* ex = cache.expanded_row(cache_layer, slot);
      std::memcpy(kv + j * ex_dim, ex, ex_dim * sizeof(float));
      for (int h = 0; h < nh; ++h)
        for (int d = 0; d < dn; ++d) kt[(int64_t{h} * dn + d) * kt_ld + j] = ex[h * (dn + dv) + d];
    } else {
      std::memcpy(c_kv + j * r, src, r * sizeof(float));
    }
  }
  kernels::MlaPrefillArgs args;
  args.num_heads = nh;
  args.nope_dim = dn;
  args.rope_dim = dr;
  args.v_dim = dv;
  args.num_queries = n;
  args.context_len = ctx;
  args.scale = scale;
  args.q = qs;
  args.kt_nope = kt;
  args.kt_head_stride = int64_t{dn} * kt_ld;
  args.kt_stride = kt_ld;
  args.kt_pe = kt_pe;
  args.kt_pe_stride = kt_ld;
  args.out = os;
  args.bf16 = kernels::bf16_prefill_attention();
  if (segmented) {
    // Per segment: kᵀ_h = W_UK[h] · c_kvᵀ and v_h = c_kv · W_UV[h]ᵀ for every head, W_UK
    // and W_UV read in place from kv_b_proj. Keys land per head in kᵀ, values per head as
    // [segment, dv] (rows of one head's values together, for the attention's streaming
    // reads). On AMX every head runs at once from the latent split once; else sgemm per head.
    thread_local kernels::Bf16x3Activations split;
    thread_local kernels::MlaPrefillState state;
    if (amx) kernels::split_bf16x3(c_kv, r, ctx, r, split, pool);
    // bf16: W_UK of every head [nh·dn, r] packed once per layer call (the first sequence
    // that expands packs it for the rest of the batch), as the rows of kᵀ.
    thread_local kernels::Bf16PairActivations uk_pairs, c_pairs;
    if (bf16_expand && !uk_packed) {
      uk_packed = true;
      float* uk = scratch(Scratch::kUk, size_t(int64_t{nh} * dn * r));
      for (int64_t h = 0; h < nh; ++h)
        std::memcpy(uk + h * dn * r, kv_b + h * kv_b_head, size_t(dn * r) * sizeof(float));
      kernels::pack_bf16_pairs(uk, r, int64_t{nh} * dn, r, uk_pairs, pool);
    }
    for (int64_t s0 = 0; s0 < ctx; s0 += segment) {
      const int64_t s1 = std::min(ctx, s0 + segment), keys = s1 - s0;
      if (bf16_expand) {
        // kᵀ [nh·dn, keys] = W_UK · cᵀ with the latent rows read in place as the weights;
        // v_h [keys, dv] = c · W_UV[h]ᵀ from the segment packed once for every head.
        kernels::linear_bf16_packed(uk_pairs, c_bits + s0 * r, keys, kt, seg_ld, pool);
        kernels::pack_bf16_pairs(c_kv + s0 * r, r, keys, r, c_pairs, pool);
        const uint16_t* uv = w.absorb_uv.view().bf16();
        // The workers reach this thread's packed segment through a reference: the name
        // c_pairs would be each worker's own thread_local.
        const kernels::Bf16PairActivations& segment_pairs = c_pairs;
        pool.parallel_for(nh, 1, [&](int64_t h0, int64_t h1, int) {
          for (int64_t h = h0; h < h1; ++h)
            kernels::linear_bf16_packed_serial(segment_pairs, uv + h * dv * r, 0, dv,
                                               kv + h * keys * dv, dv);
        });
      } else if (amx) {
        kernels::linear_amx(split, kernels::AmxWeightRows{nullptr, kv_b, dn, dn + dv},
                            int64_t{nh} * dn, kernels::AmxOutput{kt, seg_ld, true}, pool, s0, s1);
        kernels::linear_amx(split, kernels::AmxWeightRows{nullptr, kv_b + dn * r, dv, dn + dv},
                            int64_t{nh} * dv, kernels::AmxOutput{kv, dv, false, dv, keys * dv},
                            pool, s0, s1);
      } else {
        pool.parallel_for(nh, 1, [&](int64_t h0, int64_t h1, int) {
          for (int64_t h = h0; h < h1; ++h) {
            kernels::sgemm(dn, keys, r, 1.0f, kv_b + h * kv_b_head, r, c_kv + s0 * r, r, true, 0.0f,
                           kt + h * dn * seg_ld, seg_ld);
            kernels::sgemm(keys, dv, r, 1.0f, c_kv + s0 * r, r, kv_b + h * kv_b_head + dn * r, r,
                           true, 0.0f, kv + h * keys * dv, dv);
          }
        });
      }
      args.kt_head_stride = int64_t{dn} * seg_ld;
      args.kt_stride = seg_ld;
      args.kt_pe = kt_pe + s0;
      args.v = kv;
      args.v_row_stride = dv;
      args.v_head_stride = keys * dv;
      args.key_base = s0;
      kernels::mla_prefill_attention_keys(args, s0, s1, state, pool);
    }
    return;
  }
  // The expanded cache's rows: k_nope ‖ v per head.
  args.v = kv + dn;
  args.v_row_stride = ex_dim;
  args.v_head_stride = dn + dv;
  kernels::mla_prefill_attention(args, pool);
}

}  // namespace

common::Status DeepseekV3Model::attention(const AttentionWeights& w, int cache_layer,
                                          const Layout& layout, const float* x, float* out,
                                          LatentKvCache& cache, common::ThreadPool& pool) const {
  const ModelConfig& c = config_;
  const int64_t T = layout.num_tokens;
  // This rank's heads (all of them without TP): the q/kv up-projections hold only their rows.
  const int nh = c.num_attention_heads / tp_.size, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim,
            dv = c.v_head_dim, qk = c.qk_head_dim();
  const int64_t r = c.kv_lora_rank, row = r + dr;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = static_cast<float>(rope_.softmax_scale);

  const std::string prefix =
      observer_ ? "model.layers." + std::to_string(cache_layer) + ".self_attn." : "";
  auto observe = [&](const char* proj, const float* input, int64_t cols) {
    if (observer_) observer_->observe(prefix + proj + ".weight", input, T, cols);
  };
  // Queries [T, nh, dn + dr], RoPE on the q_pe part of every head.
  const std::span<float> q = scratch_span(Scratch::kQuery, T * nh * qk);
  if (c.q_lora_rank) {
    const int64_t rq = *c.q_lora_rank;
    const std::span<float> cq = scratch_span(Scratch::kQueryLatent, T * rq);
    observe("q_a_proj", x, c.hidden_size);
    kernels::linear(x, T, w.q_a_proj.view(), cq.data(), pool);
    kernels::rms_norm(cq.data(), T, rq, rq, w.q_a_layernorm.data(), eps, cq.data(), rq);
    add_norm_bias(cq.data(), T, rq, w.q_a_layernorm_bias);
    observe("q_b_proj", cq.data(), rq);
    kernels::linear(cq.data(), T, w.q_b_proj.view(), q.data(), pool);
  } else {
    observe("q_proj", x, c.hidden_size);
    kernels::linear(x, T, w.q_proj.view(), q.data(), pool);
  }
  kernels::apply_rope(q.data() + dn, T, nh, int64_t{nh} * qk, qk, layout.positions.data(), rope_);

  // Latent [T, r + dr] = RMSNorm(c_kv) ‖ RoPE(k_pe), written to the cache before attending.
  const std::span<float> kv_a = scratch_span(Scratch::kKvA, T * row);
  observe("kv_a_proj_with_mqa", x, c.hidden_size);
  kernels::linear(x, T, w.kv_a_proj.view(), kv_a.data(), pool);
  kernels::rms_norm(kv_a.data(), T, r, row, w.kv_a_layernorm.data(), eps, kv_a.data(), row);
  add_norm_bias(kv_a.data(), T, row, w.kv_a_layernorm_bias);
  kernels::apply_rope(kv_a.data() + r, T, 1, row, 0, layout.positions.data(), rope_);
  // A bf16 cache holds the latent rounded; every later use reads those values, this chunk's too.
  const bool bf16_cache = cache.dtype() == KvCacheDtype::kBf16;
  if (bf16_cache) kernels::round_to_bf16(kv_a.data(), T * row, kv_a.data());
  for (int64_t t = 0; t < T; ++t)
    cache.write_row(cache_layer, layout.slots[t], kv_a.data() + t * row);
  // With the expanded cache on, every new token's k_nope ‖ v is expanded once, here, so later
  // chunks read their history instead of re-expanding it (the O(history) term per chunk).
  const int64_t ex_dim = cache.expanded_dim();
  CHECK(ex_dim == 0 || ex_dim == expanded_kv_row_dim()) << "expanded KV row size mismatch";
  if (ex_dim > 0) {
    std::vector<float> c_new(T * r), kv_new(T * ex_dim);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(c_new.data() + t * r, kv_a.data() + t * row, r * sizeof(float));
    kernels::linear(c_new.data(), T, w.kv_b_proj.view(), kv_new.data(), pool);
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(cache.expanded_row(cache_layer, layout.slots[t]), kv_new.data() + t * ex_dim,
                  ex_dim * sizeof(float));
    }
  }

  const std::span<float> o = scratch_span(Scratch::kAttention, T * nh * dv);
  const float* kv_b = w.kv_b_proj.view().f32();
  const float* layer_cache = bf16_cache ? nullptr : cache.layer_f32(cache_layer);
  const uint16_t* layer_cache_bf16 = bf16_cache ? cache.layer_bf16(cache_layer) : nullptr;
  bool uk_packed = false;  // this layer call's W_UK is packed (bf16 expansion)
  for (size_t si = 0; si < layout.batch->sequences.size(); ++si) {
    const SequenceChunk& s = layout.batch->sequences[si];
    const int64_t n = static_cast<int64_t>(s.token_ids.size());
    if (n == 0) continue;
    const int64_t off = layout.token_offset[si], ctx = s.num_computed_tokens + n;
    const SequenceAttention seq{s,
                                nh,
                                dn,
                                dr,
                                dv,
                                qk,
                                r,
                                row,
                                n,
                                ctx,
                                scale,
                                q.data() + off * nh * qk,
                                o.data() + off * nh * dv,
                                kv_b,
                                int64_t{dn + dv} * r,
                                cache.block_size(),
                                layer_cache,
                                layer_cache_bf16};

    const double expansion_flops = ex_dim > 0 ? 0.0 : double(ctx) * r * nh * (dn + dv);
    const double expanded_flops = expansion_flops + double(n) * ctx * nh * (qk + dv);
    const double absorbed_flops =
        double(n) * nh * (dn + dv) * r + double(n) * ctx * nh * (2 * r + dr);
    // A model-wide mode (tests) wins over the sequence's (CPP's cost model), then FLOPs decide.
    const AttentionMode mode =
        attention_mode_ != AttentionMode::kAuto ? attention_mode_ : s.attention;
    if (mode == AttentionMode::kAbsorbed ||
        (mode == AttentionMode::kAuto && absorbed_flops < expanded_flops)) {
      seq.absorbed_form(w, pool);
    } else {
      seq.expanded_form(w, cache, cache_layer, uk_packed, pool);
    }
  }
  // o_proj is row-parallel: each rank's heads give a partial sum.
  observe("o_proj", o.data(), int64_t{nh} * dv);
  kernels::linear(o.data(), T, w.o_proj.view(), out, pool);
  return all_reduce(out, T * c.hidden_size);
}

}  // namespace model
