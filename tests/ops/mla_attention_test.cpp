// MLA attention: prefill (expanded) and decode (absorbed, paged) kernels against their naive
// references, and the two forms against each other on the same latent cache.
#include "kernels/mla_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "kernels/cpu_features.h"

#include "kernels/gemm.h"
#include "tensor/dtype.h"
#include "test_util.h"

namespace {

struct Dims {
  int heads, dn, dr, dv, r;
  int64_t T, ctx;
};

// Keys and values laid out as the model hands them over: kᵀ per head ([dn][ctx], padded rows),
// k_pe transposed, v rows per head, with strides that are not the tight ones.
struct PrefillInputs {
  Dims d;
  std::vector<float> q, kt, kt_pe, v;
  bool bf16 = false;  // MlaPrefillArgs::bf16 of every args()
  PrefillInputs(const Dims& dims, uint32_t seed) : d(dims) {
    q = testutil::random_vector(d.T * d.heads * (d.dn + d.dr), seed);
    kt = testutil::random_vector(d.heads * d.dn * (d.ctx + 5) + 1, seed + 1);
    kt_pe = testutil::random_vector(d.dr * (d.ctx + 3) + 1, seed + 2);
    v = testutil::random_vector(d.ctx * d.heads * (d.dv + 2) + 1, seed + 3);
  }
  // Queries q[q_row0, q_row0 + T') attend over keys [0, ctx') as the chunk's last T' tokens.
  kernels::MlaPrefillArgs args(int64_t q_row0, int64_t num_queries, int64_t ctx, float* out) const {
    kernels::MlaPrefillArgs a;
    a.num_heads = d.heads;
    a.nope_dim = d.dn;
    a.rope_dim = d.dr;
    a.v_dim = d.dv;
    a.num_queries = num_queries;
    a.context_len = ctx;
    a.scale = 0.3f;
    a.q = q.data() + q_row0 * d.heads * (d.dn + d.dr);
    a.kt_nope = kt.data();
    a.kt_stride = d.ctx + 5;
    a.kt_head_stride = d.dn * (d.ctx + 5);
    a.kt_pe = kt_pe.data();
    a.kt_pe_stride = d.ctx + 3;
    a.v = v.data();
    a.v_row_stride = d.heads * (d.dv + 2);
    a.v_head_stride = d.dv + 2;
    a.out = out;
    a.bf16 = bf16;
    return a;
  }
  // The same inputs rounded to bf16, as the bf16 path multiplies them.
  PrefillInputs rounded() const {
    PrefillInputs r = *this;
    for (auto* x : {&r.q, &r.kt, &r.kt_pe, &r.v}) {
      for (float& f : *x) f = tensor::bf16_to_f32(tensor::f32_to_bf16(f));
    }
    return r;
  }
};

// Whether the active features run MlaPrefillArgs::bf16 on vdpbf16ps (AVX512_BF16 without AMX).
bool bf16_attention_active() {
  return kernels::cpu_features().avx512_bf16 && !kernels::amx_bf16_active();
}

class MlaPrefillTest : public ::testing::TestWithParam<Dims> {};

TEST_P(MlaPrefillTest, MatchesReferenceOnEveryPath) {
  const Dims d = GetParam();
  PrefillInputs in(d, 1);
  std::vector<float> ref(d.T * d.heads * d.dv);
  kernels::mla_prefill_attention_reference(in.args(0, d.T, d.ctx, ref.data()));
  common::ThreadPool pool(2);
  for (const auto& path : testutil::supported_isa_paths()) {
    kernels::ScopedCpuFeatures isa(path.features);
    std::vector<float> out(ref.size(), -1.0f);
    kernels::mla_prefill_attention(in.args(0, d.T, d.ctx, out.data()), pool);
    EXPECT_LT(testutil::max_rel_error(out, ref), 1e-5) << path.name;
  }
}

// bf16 attention: where it runs, the output is the exact attention of the bf16-rounded q, k and v
// up to the softmax weights' own bf16 rounding (relative 2^-9 each), and differs from the f32
// path's; elsewhere the flag is ignored and the f32 result holds.
TEST_P(MlaPrefillTest, Bf16MatchesTheRoundedReference) {
  const Dims d = GetParam();
  PrefillInputs in(d, 3);
  std::vector<float> ref(d.T * d.heads * d.dv), ref_rounded(ref.size());
  kernels::mla_prefill_attention_reference(in.args(0, d.T, d.ctx, ref.data()));
  kernels::mla_prefill_attention_reference(in.rounded().args(0, d.T, d.ctx, ref_rounded.data()));
  in.bf16 = true;
  common::ThreadPool pool(2);
  int bf16_paths = 0;
  for (const auto& path : testutil::supported_isa_paths()) {
    kernels::ScopedCpuFeatures isa(path.features);
    std::vector<float> out(ref.size(), -1.0f);
    kernels::mla_prefill_attention(in.args(0, d.T, d.ctx, out.data()), pool);
    if (!bf16_attention_active()) {
      EXPECT_LT(testutil::max_rel_error(out, ref), 1e-5) << path.name;
      continue;
    }
    ++bf16_paths;
    EXPECT_LT(testutil::max_rel_error(out, ref_rounded), 4e-3) << path.name;
    EXPECT_GT(testutil::max_rel_error(out, ref), 1e-5) << path.name << ": f32 numerics";
  }
  if (bf16_paths == 0 && !kernels::detected_cpu_features().amx_bf16 &&
      kernels::detected_cpu_features().avx512_bf16) {
    ADD_FAILURE() << "no path ran the AVX512_BF16 attention";
  }
}

TEST(MlaPrefillChoiceTest, AttentionPrecisionValues) {
  EXPECT_EQ(kernels::parse_attention_precision("bf16"), true);
  EXPECT_EQ(kernels::parse_attention_precision("f32"), false);
  EXPECT_EQ(kernels::parse_attention_precision(""), false);
  EXPECT_EQ(kernels::parse_attention_precision("fp16"), std::nullopt);
  EXPECT_EQ(kernels::parse_attention_precision("BF16"), std::nullopt);
}

// A query's output must not depend on the chunk it came in: the prompt in one chunk and in
// uneven chunks (each attending over its own prefix) give the same floats, on every path.
TEST_P(MlaPrefillTest, ChunkingDoesNotChangeOutputs) {
  const Dims d = GetParam();
  if (d.T != d.ctx) GTEST_SKIP() << "needs a whole prompt";
  PrefillInputs in(d, 7);
  common::ThreadPool pool(2);
  for (const auto& path : testutil::supported_isa_paths()) {
    for (bool bf16 : {false, true}) {
      in.bf16 = bf16;
      kernels::ScopedCpuFeatures isa(path.features);
      std::vector<float> whole(d.T * d.heads * d.dv), chunked(whole.size());
      kernels::mla_prefill_attention(in.args(0, d.T, d.T, whole.data()), pool);
      const int64_t sizes[] = {1, 17, 64, 95, 3, 200};
      int64_t t0 = 0;
      for (int i = 0; t0 < d.T; i = (i + 1) % 6) {
        const int64_t n = std::min(sizes[i], d.T - t0);
        kernels::mla_prefill_attention(in.args(t0, n, t0 + n, chunked.data() + t0 * d.heads * d.dv),
                                       pool);
        t0 += n;
      }
      for (size_t i = 0; i < whole.size(); ++i) {
        ASSERT_EQ(whole[i], chunked[i]) << path.name << (bf16 ? " bf16" : "") << " output " << i;
      }
    }
  }
}

// Keys given a segment at a time, each segment copied out of the whole arrays into its own
// buffers (indexed from key_base), as the model's per-segment expansion hands them over: the
// same floats as the one-pass kernel, on every path, for several segment lengths.
TEST_P(MlaPrefillTest, KeySegmentsGiveTheSameOutputs) {
  const Dims d = GetParam();
  PrefillInputs in(d, 11);
  common::ThreadPool pool(2);
  kernels::MlaPrefillState state;
  for (const auto& path : testutil::supported_isa_paths()) {
    for (bool bf16 : {false, true}) {
      in.bf16 = bf16;
      kernels::ScopedCpuFeatures isa(path.features);
      std::vector<float> whole(d.T * d.heads * d.dv);
      const kernels::MlaPrefillArgs full = in.args(0, d.T, d.ctx, whole.data());
      kernels::mla_prefill_attention(full, pool);
      for (int64_t segment : {int64_t{64}, int64_t{128}, int64_t{320}}) {
        std::vector<float> out(whole.size(), -1.0f), kt, kt_pe, v;
        for (int64_t s0 = 0; s0 < d.ctx; s0 += segment) {
          const int64_t s1 = std::min(d.ctx, s0 + segment), n = s1 - s0;
          kt.assign(size_t(d.heads * d.dn * n), 0.0f);
          kt_pe.assign(size_t(d.dr * n), 0.0f);
          v.assign(size_t(d.heads * n * d.dv), 0.0f);
          for (int64_t j = s0; j < s1; ++j) {
            for (int64_t hd = 0; hd < d.heads * d.dn; ++hd)
              kt[hd * n + j - s0] =
                  full.kt_nope[hd / d.dn * full.kt_head_stride + hd % d.dn * full.kt_stride + j];
            for (int64_t r = 0; r < d.dr; ++r)
              kt_pe[r * n + j - s0] = full.kt_pe[r * full.kt_pe_stride + j];
            for (int64_t h = 0; h < d.heads; ++h)
              for (int64_t c = 0; c < d.dv; ++c)
                v[(h * n + j - s0) * d.dv + c] =
                    full.v[j * full.v_row_stride + h * full.v_head_stride + c];
          }
          kernels::MlaPrefillArgs a = in.args(0, d.T, d.ctx, out.data());
          a.kt_nope = kt.data();
          a.kt_stride = n;
          a.kt_head_stride = d.dn * n;
          a.kt_pe = kt_pe.data();
          a.kt_pe_stride = n;
          a.v = v.data();
          a.v_row_stride = d.dv;
          a.v_head_stride = n * d.dv;
          a.key_base = s0;
          kernels::mla_prefill_attention_keys(a, s0, s1, state, pool);
        }
        for (size_t i = 0; i < whole.size(); ++i) {
          ASSERT_EQ(whole[i], out[i])
              << path.name << (bf16 ? " bf16" : "") << " segment " << segment << " output " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MlaPrefillTest,
    ::testing::Values(Dims{4, 32, 16, 32, 64, 1, 1}, Dims{4, 32, 16, 32, 64, 7, 20},
                      Dims{2, 16, 8, 24, 32, 300, 300}, Dims{3, 8, 8, 8, 16, 40, 1000},
                      Dims{2, 64, 32, 64, 128, 250, 250}, Dims{1, 128, 64, 128, 512, 130, 400},
                      Dims{5, 20, 12, 70, 16, 97, 97}, Dims{1, 8, 8, 8, 16, 1, 100}));

// A paged latent cache whose logical blocks live at scattered physical blocks.
struct PagedCache {
  int block_size;
  int64_t row;
  std::vector<int32_t> block_table;
  std::vector<float> data;
  PagedCache(int64_t ctx, int bs, int64_t row_dim, uint32_t seed) : block_size(bs), row(row_dim) {
    const int64_t nb = (ctx + bs - 1) / bs;
    block_table.resize(nb);
    for (int64_t i = 0; i < nb; ++i) block_table[i] = static_cast<int32_t>((i * 7 + 3) % (nb + 5));
    data = testutil::random_vector((nb + 5) * bs * row_dim, seed);
  }
  const float* token(int64_t j) const {
    return data.data() + (int64_t{block_table[j / block_size]} * block_size + j % block_size) * row;
  }
};

class MlaDecodeTest : public ::testing::TestWithParam<Dims> {};

// Decode arguments over `cache`'s block table for the queries q; the caller sets the cache
// pointer (f32 or bf16) and the output.
kernels::MlaDecodeArgs decode_args(const Dims& d, const PagedCache& cache, const float* q) {
  kernels::MlaDecodeArgs a;
  a.num_heads = d.heads;
  a.kv_lora_rank = d.r;
  a.rope_dim = d.dr;
  a.num_queries = d.T;
  a.context_len = d.ctx;
  a.scale = 0.5f;
  a.q = q;
  a.block_table = cache.block_table.data();
  a.block_size = cache.block_size;
  return a;
}

TEST_P(MlaDecodeTest, MatchesReference) {
  const Dims d = GetParam();
  const int64_t row = d.r + d.dr;
  PagedCache cache(d.ctx, 16, row, 5);
  auto q = testutil::random_vector(d.T * d.heads * row, 6, 0.2f);
  std::vector<float> out(d.T * d.heads * d.r), ref(out.size());
  kernels::MlaDecodeArgs a = decode_args(d, cache, q.data());
  a.cache = cache.data.data();
  a.out = ref.data();
  kernels::mla_decode_attention_reference(a);
  common::ThreadPool pool(2);
  for (const auto& path : testutil::supported_isa_paths()) {
    kernels::ScopedCpuFeatures isa(path.features);
    std::fill(out.begin(), out.end(), -1.0f);
    a.out = out.data();
    kernels::mla_decode_attention(a, pool);
    EXPECT_LT(testutil::max_rel_error(out, ref), 1e-5) << path.name;
  }
}

// A bf16 cache (KvCacheDtype::kBf16) is widened a segment at a time: the output must equal, bit
// for bit, the f32 kernel's on a cache holding the same rounded values, and the reference run on
// the bf16 cache itself.
TEST_P(MlaDecodeTest, Bf16CacheEqualsTheF32CacheOfItsValues) {
  const Dims d = GetParam();
  const int64_t row = d.r + d.dr;
  PagedCache cache(d.ctx, 16, row, 8);
  std::vector<uint16_t> bits(cache.data.size());
  std::vector<float> widened(cache.data.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = tensor::f32_to_bf16(cache.data[i]);
    widened[i] = tensor::bf16_to_f32(bits[i]);
  }
  auto q = testutil::random_vector(d.T * d.heads * row, 9, 0.2f);
  std::vector<float> from_bf16(d.T * d.heads * d.r, -1.0f), from_f32(from_bf16.size(), -2.0f),
      ref(from_bf16.size()), unrounded(from_bf16.size());
  kernels::MlaDecodeArgs a = decode_args(d, cache, q.data());
  common::ThreadPool pool(2);
  a.cache_bf16 = bits.data();
  a.out = from_bf16.data();
  kernels::mla_decode_attention(a, pool);
  a.out = ref.data();
  kernels::mla_decode_attention_reference(a);
  a.cache_bf16 = nullptr;
  a.cache = widened.data();
  a.out = from_f32.data();
  kernels::mla_decode_attention(a, pool);
  a.cache = cache.data.data();
  a.out = unrounded.data();
  kernels::mla_decode_attention_reference(a);
  EXPECT_EQ(from_bf16, from_f32);
  EXPECT_LT(testutil::max_rel_error(from_bf16, ref), 1e-5);
  EXPECT_GT(testutil::max_rel_error(ref, unrounded), 1e-5) << "the rounding left no trace";
}

// Contexts past 2048 keys run several splits: one query (splits as parallel items) and many
// (each block of rows folding its splits).
INSTANTIATE_TEST_SUITE_P(
    Shapes, MlaDecodeTest,
    ::testing::Values(Dims{4, 32, 16, 32, 64, 1, 1}, Dims{4, 32, 16, 32, 64, 1, 33},
                      Dims{16, 0, 8, 0, 32, 5, 70}, Dims{3, 0, 16, 0, 64, 17, 17},
                      Dims{16, 0, 64, 0, 512, 1, 4700}, Dims{5, 0, 16, 0, 64, 30, 2100},
                      Dims{2, 0, 8, 0, 48, 3, 6145}));

// A query's decode output depends on its position and the cache only: the same bits whatever
// the thread count, the chunk it arrives in, or the cache's block size.
TEST(MlaDecodeInvarianceTest, OutputsDependOnNeitherChunkNorThreadsNorBlockSize) {
  const int heads = 6, r = 64, dr = 16;
  const int64_t row = r + dr, T = 40, ctx = 4400, first_pos = ctx - T;
  auto q = testutil::random_vector(T * heads * row, 12, 0.3f);
  for (const auto& path : testutil::supported_isa_paths()) {
    kernels::ScopedCpuFeatures isa(path.features);
    std::vector<float> expected;
    for (int bs : {16, 128}) {
      PagedCache cache(ctx, bs, row, 13);
      if (bs == 128) {  // the same token rows, laid out in blocks of 128
        PagedCache small(ctx, 16, row, 13);
        for (int64_t j = 0; j < ctx; ++j) {
          std::copy_n(small.token(j), row,
                      cache.data.data() + (int64_t{cache.block_table[j / bs]} * bs + j % bs) * row);
        }
      }
      for (int threads : {1, 2, 3}) {
        common::ThreadPool pool(threads);
        // Chunks of the 40 queries, each attending over the context up to its last query.
        for (const std::vector<int64_t>& cuts :
             {std::vector<int64_t>{0, 40}, {0, 7, 30, 40}, {0, 1, 2, 39, 40}}) {
          std::vector<float> out(size_t(T * heads * r), -1.0f);
          for (size_t c = 0; c + 1 < cuts.size(); ++c) {
            kernels::MlaDecodeArgs a = decode_args(Dims{heads, 0, dr, 0, r, 0, 0}, cache, nullptr);
            a.num_queries = cuts[c + 1] - cuts[c];
            a.context_len = first_pos + cuts[c + 1];
            a.q = q.data() + cuts[c] * heads * row;
            a.cache = cache.data.data();
            a.out = out.data() + cuts[c] * heads * r;
            kernels::mla_decode_attention(a, pool);
          }
          if (expected.empty()) {
            expected = out;
            kernels::MlaDecodeArgs a =
                decode_args(Dims{heads, 0, dr, 0, r, T, ctx}, cache, q.data());
            a.cache = cache.data.data();
            std::vector<float> ref(out.size());
            a.out = ref.data();
            kernels::mla_decode_attention_reference(a);
            ASSERT_LT(testutil::max_rel_error(out, ref), 1e-5) << path.name;
          }
          ASSERT_EQ(out, expected) << path.name << ", block size " << bs << ", " << threads
                                   << " threads, " << cuts.size() - 1 << " chunks";
        }
      }
    }
  }
}

// Expanded and absorbed attention are the same function of the latent cache (§6).
TEST(MlaEquivalenceTest, ExpandedEqualsAbsorbed) {
  const int nh = 3, dn = 8, dr = 4, dv = 6, r = 10;
  const int64_t T = 5, ctx = 23, row = r + dr;
  PagedCache cache(ctx, 4, row, 9);
  auto w_kv_b = testutil::random_vector(nh * (dn + dv) * r, 10);  // [nh, dn + dv, r]
  auto q = testutil::random_vector(T * nh * (dn + dr), 11);
  common::ThreadPool pool(2);

  // Expanded: k_nope / v per head from the gathered latent.
  std::vector<float> c_kv(ctx * r), kv(ctx * nh * (dn + dv)), kt(nh * dn * ctx), kt_pe(dr * ctx);
  for (int64_t j = 0; j < ctx; ++j) {
    std::copy_n(cache.token(j), r, c_kv.data() + j * r);
    for (int d = 0; d < dr; ++d) kt_pe[d * ctx + j] = cache.token(j)[r + d];
  }
  kernels::sgemm(ctx, nh * (dn + dv), r, 1.0f, c_kv.data(), r, w_kv_b.data(), r, true, 0.0f,
                 kv.data(), nh * (dn + dv));
  for (int64_t j = 0; j < ctx; ++j)
    for (int h = 0; h < nh; ++h)
      for (int d = 0; d < dn; ++d)
        kt[(h * dn + d) * ctx + j] = kv[j * nh * (dn + dv) + h * (dn + dv) + d];
  std::vector<float> expanded(T * nh * dv);
  kernels::MlaPrefillArgs p;
  p.num_heads = nh;
  p.nope_dim = dn;
  p.rope_dim = dr;
  p.v_dim = dv;
  p.num_queries = T;
  p.context_len = ctx;
  p.scale = 0.4f;
  p.q = q.data();
  p.kt_nope = kt.data();
  p.kt_head_stride = dn * ctx;
  p.kt_stride = ctx;
  p.kt_pe = kt_pe.data();
  p.kt_pe_stride = ctx;
  p.v = kv.data() + dn;
  p.v_row_stride = nh * (dn + dv);
  p.v_head_stride = dn + dv;
  p.out = expanded.data();
  kernels::mla_prefill_attention_reference(p);

  // Absorbed: q_lat = q_nope · W_UK, attention over the latent, then W_UV.
  std::vector<float> q_cat(T * nh * row), o_lat(T * nh * r), absorbed(T * nh * dv, 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < nh; ++h) {
      const float* qn = q.data() + (t * nh + h) * (dn + dr);
      float* qc = q_cat.data() + (t * nh + h) * row;
      for (int c = 0; c < r; ++c) {
        double s = 0;
        for (int k = 0; k < dn; ++k) s += qn[k] * w_kv_b[(h * (dn + dv) + k) * r + c];
        qc[c] = static_cast<float>(s);
      }
      std::copy_n(qn + dn, dr, qc + r);
    }
  }
  kernels::MlaDecodeArgs a;
  a.num_heads = nh;
  a.kv_lora_rank = r;
  a.rope_dim = dr;
  a.num_queries = T;
  a.context_len = ctx;
  a.scale = 0.4f;
  a.q = q_cat.data();
  a.cache = cache.data.data();
  a.block_table = cache.block_table.data();
  a.block_size = cache.block_size;
  a.out = o_lat.data();
  kernels::mla_decode_attention(a, pool);
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < nh; ++h) {
      for (int v = 0; v < dv; ++v) {
        double s = 0;
        for (int c = 0; c < r; ++c) {
          s += o_lat[(t * nh + h) * r + c] * w_kv_b[(h * (dn + dv) + dn + v) * r + c];
        }
        absorbed[(t * nh + h) * dv + v] = static_cast<float>(s);
      }
    }
  }
  EXPECT_LT(testutil::max_rel_error(absorbed, expanded), 1e-5);
}

}  // namespace
