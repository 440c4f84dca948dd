// DeepSeek-V3 forward. Activations are f32 rows [T, ·] for all chunks of a batch concatenated;
// attention is the only per-sequence step. Math follows deepseek-v3-model.md §4-8 exactly.
#include "model/deepseek_v3.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "common/check.h"
#include "common/timer.h"
#include "kernels/activation.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/mla_attention.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "tensor/aligned_buffer.h"

namespace model {
namespace {

// Per-thread scratch that only grows, one buffer per use. The expanded form's context-sized
// buffers (the history's k/v, latent and k_pe) were fresh, zero-filled mappings on every layer
// of every chunk, and their page faults and zeroing were a fifth of a long-history chunk's time;
// they grow by half again at least, since the history grows every chunk. The layer's
// token-sized buffers (normed input, sublayer output, queries, latents, attention output) cost
// the same on long chunks: 7-8% of a 4096-token prefill zeroed them and as much again faulted
// their pages in. Contents are left as they were: every user writes each element it reads. A
// thread keeps its largest buffers until it ends (the peak a forward needed anyway).
enum class Scratch {
  kKtPe,
  kKt,
  kKv,
  kLatent,
  kNormed,
  kSublayer,
  kQuery,
  kQueryLatent,
  kKvA,
  kAttention,
  kUk,
  kCount
};
float* scratch(Scratch use, size_t size) {
  thread_local tensor::AlignedBuffer<float> buffers[static_cast<size_t>(Scratch::kCount)];
  auto& b = buffers[static_cast<size_t>(use)];
  if (b.size() < size) b.resize(std::max(size, b.size() + b.size() / 2));
  return b.data();
}
std::span<float> scratch_span(Scratch use, int64_t size) {
  return {scratch(use, size_t(size)), size_t(size)};
}

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

}  // namespace

struct DeepseekV3Model::Layout {
  const ForwardBatch* batch = nullptr;
  int64_t num_tokens = 0;
  std::vector<int32_t> positions;     // [T] absolute position of each token
  std::vector<int64_t> slots;         // [T] cache row: block_id * block_size + offset
  std::vector<int64_t> token_offset;  // [num_sequences] first row of each sequence

  Layout(const ForwardBatch& b, int block_size) : batch(&b), num_tokens(b.num_tokens()) {
    positions.reserve(num_tokens);
    slots.reserve(num_tokens);
    int64_t offset = 0;
    for (const SequenceChunk& s : b.sequences) {
      token_offset.push_back(offset);
      const int64_t n = static_cast<int64_t>(s.token_ids.size());
      const int64_t needed_blocks = (s.num_computed_tokens + n + block_size - 1) / block_size;
      CHECK(static_cast<int64_t>(s.block_table.size()) >= needed_blocks)
          << "block table too short: " << s.block_table.size() << " < " << needed_blocks;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t pos = s.num_computed_tokens + i;
        positions.push_back(static_cast<int32_t>(pos));
        slots.push_back(static_cast<int64_t>(s.block_table[pos / block_size]) * block_size +
                        pos % block_size);
      }
      offset += n;
    }
  }
};

DeepseekV3Model::DeepseekV3Model(ModelConfig config, ModelWeights weights, TensorParallel tp,
                                 LmHeadParallel lmhead_tp, DataParallelExperts dp_experts)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      tp_(tp),
      lmhead_tp_(lmhead_tp),
      dp_experts_(dp_experts) {
  rope_ = kernels::compute_rope_params(config_.qk_rope_head_dim, config_.rope_theta,
                                       config_.qk_head_dim(), config_.yarn);
}

common::Result<std::unique_ptr<DeepseekV3Model>> DeepseekV3Model::load(const std::string& model_dir,
                                                                       const LoadOptions& options) {
  CP_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
  CP_ASSIGN_OR_RETURN(auto checkpoint, Checkpoint::open(model_dir));
  CP_ASSIGN_OR_RETURN(ModelWeights weights, load_weights(*checkpoint, config, options));
  return std::make_unique<DeepseekV3Model>(std::move(config), std::move(weights), options.tp,
                                           options.lmhead_tp, options.dp_experts);
}

common::Status DeepseekV3Model::all_reduce(float* data, int64_t count) const {
  if (!tp_.active()) return {};
  CHECK(group_ != nullptr) << "tensor parallel model without a process group";
  return group_->all_reduce(data, size_t(count), dist::ReduceOp::kSum);
}

common::Status DeepseekV3Model::embed_rows(const tensor::WeightMatrix& table,
                                           std::span<const int32_t> ids, float* out) const {
  CHECK(!table.empty()) << "embedding table not loaded on this stage";
  const int64_t h = table.cols();
  const int64_t first = table.rows() * tp_.rank;  // this rank's vocabulary shard
  for (size_t i = 0; i < ids.size(); ++i) {
    CHECK(ids[i] >= 0 && ids[i] < config_.vocab_size) << "token id " << ids[i] << " out of range";
    const int64_t row = ids[i] - first;
    if (row < 0 || row >= table.rows()) {
      std::fill(out + i * h, out + (i + 1) * h, 0.0f);  // another rank's row
    } else if (table.dtype() == tensor::DType::kBF16) {
      kernels::bf16_to_f32_row(table.view().bf16() + row * h, out + i * h, h);
    } else {
      std::memcpy(out + i * h, table.view().f32() + row * h, h * sizeof(float));
    }
  }
  return all_reduce(out, int64_t(ids.size()) * h);  // one rank's row plus zeros: exact
}

common::Status DeepseekV3Model::embed(const ForwardBatch& batch, float* hidden) const {
  std::vector<int32_t> ids;
  for (const SequenceChunk& s : batch.sequences)
    ids.insert(ids.end(), s.token_ids.begin(), s.token_ids.end());
  return embed_rows(weights_.embed_tokens, ids, hidden);
}

common::Status DeepseekV3Model::run_layers(const ForwardBatch& batch, int layer_begin,
                                           int layer_end, float* hidden, LatentKvCache& cache,
                                           common::ThreadPool& pool) const {
  const Layout layout(batch, cache.block_size());
  for (int l = layer_begin; l < layer_end; ++l) {
    CP_RETURN_IF_ERROR(decoder_layer(weights_.layers[l], l, layout, hidden, cache, pool));
  }
  return {};
}

namespace {

// The smoothing bias a W8A8 checkpoint may add after an RMSNorm (empty: none).
void add_norm_bias(float* x, int64_t rows, int64_t stride, const Vector& bias) {
  for (int64_t t = 0; t < rows; ++t)
    for (size_t i = 0; i < bias.size(); ++i) x[t * stride + int64_t(i)] += bias[i];
}

}  // namespace

common::Status DeepseekV3Model::decoder_layer(const DecoderLayerWeights& w, int cache_layer,
                                              const Layout& layout, float* hidden,
                                              LatentKvCache& cache,
                                              common::ThreadPool& pool) const {
  CHECK(!w.input_layernorm.empty()) << "decoder layer " << cache_layer << " not loaded";
  const int64_t T = layout.num_tokens, H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  float* x = scratch(Scratch::kNormed, size_t(T * H));
  float* delta = scratch(Scratch::kSublayer, size_t(T * H));
  kernels::rms_norm(hidden, T, H, H, w.input_layernorm.data(), eps, x, H);
  add_norm_bias(x, T, H, w.input_layernorm_bias);
  CP_RETURN_IF_ERROR(attention(w.attn, cache_layer, layout, x, delta, cache, pool));
  for (int64_t i = 0; i < T * H; ++i) hidden[i] += delta[i];
  kernels::rms_norm(hidden, T, H, H, w.post_attention_layernorm.data(), eps, x, H);
  add_norm_bias(x, T, H, w.post_attention_layernorm_bias);
  CP_RETURN_IF_ERROR(feed_forward(w, T, x, delta, pool));
  for (int64_t i = 0; i < T * H; ++i) hidden[i] += delta[i];
  return {};
}

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

  const float* kv_b = w.kv_b_proj.view().f32();  // [nh, dn + dv, r]
  const int64_t kv_b_head = int64_t{dn + dv} * r;
  const std::span<float> o = scratch_span(Scratch::kAttention, T * nh * dv);
  const int bs = cache.block_size();
  const float* layer_cache = bf16_cache ? nullptr : cache.layer_f32(cache_layer);
  const uint16_t* layer_cache_bf16 = bf16_cache ? cache.layer_bf16(cache_layer) : nullptr;
  bool uk_packed = false;  // uk_pairs holds this layer's W_UK (bf16 expansion)
  for (size_t si = 0; si < layout.batch->sequences.size(); ++si) {
    const SequenceChunk& s = layout.batch->sequences[si];
    const int64_t n = static_cast<int64_t>(s.token_ids.size());
    if (n == 0) continue;
    const int64_t off = layout.token_offset[si], ctx = s.num_computed_tokens + n;
    const float* qs = q.data() + off * nh * qk;
    float* os = o.data() + off * nh * dv;

    const double expansion_flops = ex_dim > 0 ? 0.0 : double(ctx) * r * nh * (dn + dv);
    const double expanded_flops = expansion_flops + double(n) * ctx * nh * (qk + dv);
    const double absorbed_flops =
        double(n) * nh * (dn + dv) * r + double(n) * ctx * nh * (2 * r + dr);
    // A model-wide mode (tests) wins over the sequence's (CPP's cost model), then FLOPs decide.
    const AttentionMode mode =
        attention_mode_ != AttentionMode::kAuto ? attention_mode_ : s.attention;
    const bool absorbed = mode == AttentionMode::kAbsorbed ||
                          (mode == AttentionMode::kAuto && absorbed_flops < expanded_flops);
    if (absorbed) {
      // A few tokens stream the per-head projections from absorb_uk_t / absorb_uv (BF16 where
      // exact: half the bytes); more run sgemm on kv_b_proj's F32 rows, whose arithmetic wins.
      const tensor::WeightView uk_t = w.absorb_uk_t.view(), uv = w.absorb_uv.view();
      const bool streamed = !w.absorb_uk_t.empty() && n <= (uk_t.dtype == tensor::DType::kBF16
                                                                ? kernels::kStreamingMaxRowsBf16
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
                                             uv.row_range(h * dv, dv), os + h * dv,
                                             int64_t{nh} * dv);
          } else {
            kernels::sgemm(n, dv, r, 1.0f, o_lat.data() + h * r, nh * r,
                           kv_b + h * kv_b_head + dn * r, r, true, 0.0f, os + h * dv,
                           int64_t{nh} * dv);
          }
        }
      });
    } else {
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
            for (int d = 0; d < dn; ++d)
              kt[(int64_t{h} * dn + d) * kt_ld + j] = ex[h * (dn + dv) + d];
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
                                int64_t{nh} * dn, kernels::AmxOutput{kt, seg_ld, true}, pool, s0,
                                s1);
            kernels::linear_amx(split, kernels::AmxWeightRows{nullptr, kv_b + dn * r, dv, dn + dv},
                                int64_t{nh} * dv, kernels::AmxOutput{kv, dv, false, dv, keys * dv},
                                pool, s0, s1);
          } else {
            pool.parallel_for(nh, 1, [&](int64_t h0, int64_t h1, int) {
              for (int64_t h = h0; h < h1; ++h) {
                kernels::sgemm(dn, keys, r, 1.0f, kv_b + h * kv_b_head, r, c_kv + s0 * r, r, true,
                               0.0f, kt + h * dn * seg_ld, seg_ld);
                kernels::sgemm(keys, dv, r, 1.0f, c_kv + s0 * r, r, kv_b + h * kv_b_head + dn * r,
                               r, true, 0.0f, kv + h * keys * dv, dv);
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
        continue;
      }
      // The expanded cache's rows: k_nope ‖ v per head.
      args.v = kv + dn;
      args.v_row_stride = ex_dim;
      args.v_head_stride = dn + dv;
      kernels::mla_prefill_attention(args, pool);
    }
  }
  // o_proj is row-parallel: each rank's heads give a partial sum.
  observe("o_proj", o.data(), int64_t{nh} * dv);
  kernels::linear(o.data(), T, w.o_proj.view(), out, pool);
  return all_reduce(out, T * c.hidden_size);
}

common::Status DeepseekV3Model::feed_forward(const DecoderLayerWeights& w, int64_t T,
                                             const float* x, float* out,
                                             common::ThreadPool& pool) const {
  const int64_t H = config_.hidden_size;
  if (w.dense_mlp) {
    kernels::swiglu_mlp(x, T, w.dense_mlp->view(), out, pool);
    return all_reduce(out, T * H);  // down_proj is row-parallel
  }
  CHECK(w.moe.has_value()) << "layer has neither a dense MLP nor MoE weights";
  const MoeWeights& m = *w.moe;
  if ((tp_.active() && tp_.expert_parallel) || dp_experts_.active())
    return moe_expert_parallel(m, T, x, out, pool);
  const kernels::RouterParams rp = config_.router_params();
  std::vector<float> router_logits(T * rp.num_experts), topk_weights(T * rp.top_k);
  std::vector<int32_t> topk_ids(T * rp.top_k);
  kernels::linear(x, T, m.router.view(), router_logits.data(), pool);
  kernels::route_experts(router_logits.data(), T,
                         m.correction_bias.empty() ? nullptr : m.correction_bias.data(), rp,
                         topk_ids.data(), topk_weights.data());
  if (m.shared) {
    kernels::swiglu_mlp(x, T, m.shared->view(), out, pool);
  } else {
    std::fill(out, out + T * H, 0.0f);
  }
  kernels::moe_dispatch(x, T, H, topk_ids.data(), topk_weights.data(), rp.top_k, m.expert_views,
                        out, pool);
  return all_reduce(out, T * H);  // every expert's intermediate columns are split
}

// Expert parallelism. The expert group is the TP group, or, with experts over data-parallel
// ranks, every rank of every DP rank's TP group (vLLM's EP world, DP x TP). Every rank of a TP
// group holds the group's tokens (attention is TP), so each takes an equal slice of them (the
// last ones padded), routes it, and sends each (token, expert) pair to the rank that holds the
// expert: all-to-all of records [local expert id, weight, hidden row] over the expert group.
// The receiving rank runs its experts on what it got and sends the weighted rows back in the
// order they came (a second all-to-all). Each rank adds its tokens' returned rows in ascending
// expert order, after the shared experts (whole on every rank, run on its own slice), which is
// the order TP=1 adds them in. An all-gather of the slices over the TP group gives each of its
// ranks the whole output; without TP a rank's slice is all of its tokens, and its output its own.
common::Status DeepseekV3Model::moe_expert_parallel(const MoeWeights& m, int64_t T, const float* x,
                                                    float* out, common::ThreadPool& pool) const {
  const int64_t H = config_.hidden_size;
  const bool over_dp = dp_experts_.active();
  dist::ProcessGroup* group = over_dp ? expert_group_ : group_;
  CHECK(group != nullptr) << "expert parallel model without a process group";
  CHECK(!tp_.active() || group_ != nullptr) << "tensor parallel model without a process group";
  const int P = over_dp ? dp_experts_.size : tp_.size, me = over_dp ? dp_experts_.rank : tp_.rank;
  const int per_rank_experts = static_cast<int>(m.experts.size());
  const kernels::RouterParams rp = config_.router_params();
  const int k = rp.top_k;
  const double t_start = common::now_seconds();
  // This rank's slice of its TP group's tokens.
  const int64_t per = (T + tp_.size - 1) / tp_.size;
  const int64_t t0 = std::min(T, per * tp_.rank), t1 = std::min(T, t0 + per), n = t1 - t0;
  std::vector<float> router_logits(n * rp.num_experts), topk_weights(n * k);
  std::vector<int32_t> topk_ids(n * k);
  if (n > 0) {
    kernels::linear(x + t0 * H, n, m.router.view(), router_logits.data(), pool);
    kernels::route_experts(router_logits.data(), n,
                           m.correction_bias.empty() ? nullptr : m.correction_bias.data(), rp,
                           topk_ids.data(), topk_weights.data());
  }
  // Records to each destination, in (token, slot) order within a destination.
  const size_t record = sizeof(int32_t) + sizeof(float) + size_t(H) * sizeof(float);
  std::vector<std::vector<int64_t>> to(static_cast<size_t>(P));  // assignment indices
  for (int64_t a = 0; a < n * k; ++a) to[size_t(topk_ids[a] / per_rank_experts)].push_back(a);
  std::vector<size_t> send_bytes(static_cast<size_t>(P)), recv_bytes(static_cast<size_t>(P));
  std::vector<int64_t> counts(static_cast<size_t>(P)),
      all_counts(static_cast<size_t>(P) * static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) counts[size_t(p)] = int64_t(to[size_t(p)].size());
  CP_RETURN_IF_ERROR(
      group->all_gather(counts.data(), counts.size() * sizeof(int64_t), all_counts.data()));
  std::vector<uint8_t> send, recv;
  for (int p = 0; p < P; ++p) {
    send_bytes[size_t(p)] = size_t(counts[size_t(p)]) * record;
    recv_bytes[size_t(p)] =
        size_t(all_counts[size_t(p) * static_cast<size_t>(P) + size_t(me)]) * record;
    for (int64_t a : to[size_t(p)]) {
      const int32_t local = topk_ids[a] % per_rank_experts;
      const size_t at = send.size();
      send.resize(at + record);
      std::memcpy(send.data() + at, &local, sizeof(local));
      std::memcpy(send.data() + at + 4, &topk_weights[a], sizeof(float));
      std::memcpy(send.data() + at + 8, x + (t0 + a / k) * H, size_t(H) * sizeof(float));
    }
  }
  size_t received = 0;
  for (size_t b : recv_bytes) received += b;
  recv.resize(received);
  CP_RETURN_IF_ERROR(group->all_to_all_v(send.data(), send_bytes, recv.data(), recv_bytes));
  const double t_dispatched = common::now_seconds();
  // This rank's experts on every record it received (top_k 1: one expert per record).
  const int64_t rows = int64_t(received / record);
  std::vector<float> xr(rows * H), yr(rows * H, 0.0f), wr(rows);
  std::vector<int32_t> er(rows);
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* r = recv.data() + size_t(i) * record;
    std::memcpy(&er[i], r, 4);
    std::memcpy(&wr[i], r + 4, 4);
    CHECK(er[i] >= 0 && er[i] < per_rank_experts) << "expert record out of range";
    std::memcpy(xr.data() + i * H, r + 8, size_t(H) * sizeof(float));
  }
  if (rows > 0)
    kernels::moe_dispatch(xr.data(), rows, H, er.data(), wr.data(), 1, m.expert_views, yr.data(),
                          pool);
  const double t_computed = common::now_seconds();
  // Back to where the records came from, in the order they came.
  std::vector<size_t> back_send(static_cast<size_t>(P)), back_recv(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) {
    back_send[size_t(p)] = recv_bytes[size_t(p)] / record * size_t(H) * sizeof(float);
    back_recv[size_t(p)] = send_bytes[size_t(p)] / record * size_t(H) * sizeof(float);
  }
  std::vector<float> returned(size_t(n * k) * size_t(H));
  CP_RETURN_IF_ERROR(group->all_to_all_v(yr.data(), back_send, returned.data(), back_recv));
  // Combine: shared experts, then the routed rows in ascending expert order per token.
  std::vector<float> mine(size_t(per) * size_t(H), 0.0f);
  if (m.shared && n > 0) kernels::swiglu_mlp(x + t0 * H, n, m.shared->view(), mine.data(), pool);
  std::vector<int64_t> row_of(size_t(n * k));  // assignment -> row in `returned`
  int64_t next = 0;
  for (int p = 0; p < P; ++p)
    for (int64_t a : to[size_t(p)]) row_of[size_t(a)] = next++;
  std::vector<int> order(static_cast<size_t>(k));
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) order[size_t(j)] = j;
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return topk_ids[t * k + a] < topk_ids[t * k + b]; });
    float* o = mine.data() + t * H;
    for (int j : order) {
      const float* y = returned.data() + row_of[size_t(t * k + j)] * H;
      for (int64_t d = 0; d < H; ++d) o[d] += y[d];
    }
  }
  if (!tp_.active()) {
    std::copy(mine.begin(), mine.begin() + T * H, out);
  } else {
    std::vector<float> gathered(size_t(per) * static_cast<size_t>(tp_.size) * size_t(H));
    CP_RETURN_IF_ERROR(
        group_->all_gather(mine.data(), mine.size() * sizeof(float), gathered.data()));
    std::memcpy(out, gathered.data(), size_t(T * H) * sizeof(float));
  }
  const double t_end = common::now_seconds();
  moe_times_.dispatch_s += t_dispatched - t_start;
  moe_times_.experts_s += t_computed - t_dispatched;
  moe_times_.combine_s += t_end - t_computed;
  ++moe_times_.layers;
  return {};
}

void DeepseekV3Model::final_norm(const float* hidden, int64_t rows, float* normed) const {
  CHECK(!weights_.norm.empty()) << "final norm not loaded on this stage";
  const int64_t H = config_.hidden_size;
  kernels::rms_norm(hidden, rows, H, H, weights_.norm.data(),
                    static_cast<float>(config_.rms_norm_eps), normed, H);
}

namespace {

// logits[rows, V] from `parts` vocabulary shards of `per` columns each; shard p's row r is at
// shards[(p * stride + r) * per] (the last shard's padding columns are dropped).
void assemble_vocab_shards(const float* shards, int parts, int64_t stride, int64_t rows,
                           int64_t per, int64_t V, float* logits) {
  for (int p = 0; p < parts; ++p) {
    const int64_t v0 = per * p, width = std::min(per, V - v0);
    if (width <= 0) continue;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(logits + r * V + v0, shards + (int64_t(p) * stride + r) * per,
                  size_t(width) * sizeof(float));
  }
}

}  // namespace

common::Status DeepseekV3Model::head_logits(const tensor::WeightMatrix& head, const float* normed,
                                            int64_t rows, float* logits,
                                            common::ThreadPool& pool) const {
  CHECK(!head.empty()) << "lm_head not loaded on this stage";
  const int64_t V = config_.vocab_size;
  if (lmhead_tp_.active()) {
    // vllm-ascend's lm_head TP: gather every rank's rows (padded to the longest), multiply
    // this rank's vocabulary shard, and send each rank its rows' logits (all-to-all).
    CHECK(lmhead_group_ != nullptr) << "lmhead_tensor_parallel_size without its group";
    const int g = lmhead_tp_.size;
    const int64_t H = config_.hidden_size, per = head.rows();
    std::vector<int64_t> counts(static_cast<size_t>(g));
    int64_t mine = rows;
    CP_RETURN_IF_ERROR(lmhead_group_->all_gather(&mine, sizeof(mine), counts.data()));
    const int64_t R = *std::max_element(counts.begin(), counts.end());
    if (R == 0) return {};
    std::vector<float> padded(size_t(R * H), 0.0f), all_rows(size_t(g) * size_t(R * H));
    std::copy(normed, normed + rows * H, padded.begin());
    CP_RETURN_IF_ERROR(
        lmhead_group_->all_gather(padded.data(), padded.size() * sizeof(float), all_rows.data()));
    std::vector<float> local(size_t(g) * size_t(R * per)), back(local.size());
    kernels::linear(all_rows.data(), g * R, head.view(), local.data(), pool);
    const std::vector<size_t> block(static_cast<size_t>(g), size_t(R * per) * sizeof(float));
    CP_RETURN_IF_ERROR(lmhead_group_->all_to_all_v(local.data(), block, back.data(), block));
    assemble_vocab_shards(back.data(), g, R, rows, per, V, logits);
    return {};
  }
  if (!tp_.active()) {
    kernels::linear(normed, rows, head.view(), logits, pool);
    return {};
  }
  // Vocabulary-parallel: this rank's [rows, per] shard, gathered into [rows, V].
  const int64_t per = head.rows();
  std::vector<float> local(size_t(rows * per)), all(size_t(rows * per) * size_t(tp_.size));
  kernels::linear(normed, rows, head.view(), local.data(), pool);
  CP_RETURN_IF_ERROR(group_->all_gather(local.data(), local.size() * sizeof(float), all.data()));
  assemble_vocab_shards(all.data(), tp_.size, rows, rows, per, V, logits);
  return {};
}

common::Result<int64_t> DeepseekV3Model::most_head_calls(int64_t mine) const {
  if (!head_is_collective()) return mine;
  CHECK(lmhead_group_ != nullptr) << "lmhead_tensor_parallel_size without its group";
  CP_RETURN_IF_ERROR(lmhead_group_->all_reduce(&mine, 1, dist::ReduceOp::kMax));
  return mine;
}

common::Status DeepseekV3Model::compute_logits(const float* normed, int64_t rows, float* logits,
                                               common::ThreadPool& pool) const {
  return head_logits(weights_.lm_head, normed, rows, logits, pool);
}

common::Status DeepseekV3Model::mtp_forward(const ForwardBatch& batch, const float* prev_hidden,
                                            bool from_main, std::span<const int32_t> next_token_ids,
                                            LatentKvCache& cache, common::ThreadPool& pool,
                                            float* mtp_hidden, int k) const {
  CHECK(k >= 0 && k < num_mtp_layers()) << "MTP layer " << k << " not loaded";
  const MtpWeights& m = weights_.mtp[k];
  const Layout layout(batch, cache.block_size());
  const int64_t T = layout.num_tokens, H = config_.hidden_size;
  CHECK(static_cast<int64_t>(next_token_ids.size()) == T) << "one next token per row";
  const float eps = static_cast<float>(config_.rms_norm_eps);
  std::vector<float> e(T * H), cat(T * 2 * H);
  CP_RETURN_IF_ERROR(embed_rows(m.embed_tokens.empty() ? weights_.embed_tokens : m.embed_tokens,
                                next_token_ids, e.data()));
  // Embedding first, hidden state second (vLLM / SGLang order).
  kernels::rms_norm(e.data(), T, H, H, m.enorm.data(), eps, cat.data(), 2 * H);
  if (!from_main || weights_.mtp_rotation.empty()) {
    kernels::rms_norm(prev_hidden, T, H, H, m.hnorm.data(), eps, cat.data() + H, 2 * H);
  } else {
    // QuaRot: the main model's hidden state is rotated; the MTP layer is not.
    std::vector<float> unrotated(T * H);
    kernels::linear(prev_hidden, T, weights_.mtp_rotation.view(), unrotated.data(), pool);
    kernels::rms_norm(unrotated.data(), T, H, H, m.hnorm.data(), eps, cat.data() + H, 2 * H);
  }
  kernels::linear(cat.data(), T, m.eh_proj.view(), mtp_hidden, pool);
  CP_RETURN_IF_ERROR(
      decoder_layer(m.layer, config_.num_hidden_layers + k, layout, mtp_hidden, cache, pool));
  kernels::rms_norm(mtp_hidden, T, H, H, m.shared_head_norm.data(), eps, mtp_hidden, H);
  return {};
}

common::Status DeepseekV3Model::mtp_head_logits(const float* mtp_hidden, int64_t rows,
                                                float* logits, common::ThreadPool& pool,
                                                int k) const {
  CHECK(k >= 0 && k < num_mtp_layers()) << "MTP layer " << k << " not loaded";
  const MtpWeights& m = weights_.mtp[k];
  const tensor::WeightMatrix& head =
      m.shared_head_head.empty() ? weights_.lm_head : m.shared_head_head;
  return head_logits(head, mtp_hidden, rows, logits, pool);
}

common::Status DeepseekV3Model::mtp_logits(const ForwardBatch& batch, const float* main_normed,
                                           std::span<const int32_t> next_token_ids,
                                           LatentKvCache& cache, common::ThreadPool& pool,
                                           float* draft_logits, int k) const {
  const int64_t T = batch.num_tokens();
  std::vector<float> h(T * config_.hidden_size);
  CP_RETURN_IF_ERROR(mtp_forward(batch, main_normed, /*from_main=*/true, next_token_ids, cache,
                                 pool, h.data(), k));
  return mtp_head_logits(h.data(), T, draft_logits, pool, k);
}

}  // namespace model
