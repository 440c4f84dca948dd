// MLA attention: prefill (expanded) and decode (absorbed, paged) kernels against their naive
// references, and the two forms against each other on the same latent cache.
#include "kernels/mla_attention.h"

#include <gtest/gtest.h>

#include <numeric>

#include "kernels/gemm.h"
#include "test_util.h"

namespace {

struct Dims {
  int heads, dn, dr, dv, r;
  int64_t T, ctx;
};

class MlaPrefillTest : public ::testing::TestWithParam<Dims> {};

TEST_P(MlaPrefillTest, MatchesReference) {
  const Dims d = GetParam();
  const int64_t kv_row = int64_t{d.heads} * (d.dn + d.dv);
  auto q = testutil::random_vector(d.T * d.heads * (d.dn + d.dr), 1);
  auto kv = testutil::random_vector(d.ctx * kv_row, 2);
  auto kpe = testutil::random_vector(d.ctx * (d.dr + 3), 3);
  std::vector<float> out(d.T * d.heads * d.dv), ref(out.size());
  kernels::MlaPrefillArgs a;
  a.num_heads = d.heads;
  a.nope_dim = d.dn;
  a.rope_dim = d.dr;
  a.v_dim = d.dv;
  a.num_queries = d.T;
  a.context_len = d.ctx;
  a.scale = 0.3f;
  a.q = q.data();
  a.k_nope = kv.data();
  a.v = kv.data() + d.dn;
  a.kv_row_stride = kv_row;
  a.kv_head_stride = d.dn + d.dv;
  a.k_pe = kpe.data();
  a.k_pe_stride = d.dr + 3;
  a.out = out.data();
  common::ThreadPool pool(2);
  kernels::mla_prefill_attention(a, pool);
  a.out = ref.data();
  kernels::mla_prefill_attention_reference(a);
  EXPECT_LT(testutil::max_rel_error(out, ref), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaPrefillTest,
                         ::testing::Values(Dims{4, 32, 16, 32, 64, 1, 1},
                                           Dims{4, 32, 16, 32, 64, 7, 20},
                                           Dims{2, 16, 8, 24, 32, 300, 300},
                                           Dims{3, 8, 8, 8, 16, 40, 1000}));

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

TEST_P(MlaDecodeTest, MatchesReference) {
  const Dims d = GetParam();
  const int64_t row = d.r + d.dr;
  PagedCache cache(d.ctx, 16, row, 5);
  auto q = testutil::random_vector(d.T * d.heads * row, 6, 0.2f);
  std::vector<float> out(d.T * d.heads * d.r), ref(out.size());
  kernels::MlaDecodeArgs a;
  a.num_heads = d.heads;
  a.kv_lora_rank = d.r;
  a.rope_dim = d.dr;
  a.num_queries = d.T;
  a.context_len = d.ctx;
  a.scale = 0.5f;
  a.q = q.data();
  a.cache = cache.data.data();
  a.block_table = cache.block_table.data();
  a.block_size = cache.block_size;
  a.out = out.data();
  common::ThreadPool pool(2);
  kernels::mla_decode_attention(a, pool);
  a.out = ref.data();
  kernels::mla_decode_attention_reference(a);
  EXPECT_LT(testutil::max_rel_error(out, ref), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaDecodeTest,
                         ::testing::Values(Dims{4, 32, 16, 32, 64, 1, 1},
                                           Dims{4, 32, 16, 32, 64, 1, 33},
                                           Dims{16, 0, 8, 0, 32, 5, 70},
                                           Dims{3, 0, 16, 0, 64, 17, 17}));

// Expanded and absorbed attention are the same function of the latent cache (§6).
TEST(MlaEquivalenceTest, ExpandedEqualsAbsorbed) {
  const int nh = 3, dn = 8, dr = 4, dv = 6, r = 10;
  const int64_t T = 5, ctx = 23, row = r + dr;
  PagedCache cache(ctx, 4, row, 9);
  auto w_kv_b = testutil::random_vector(nh * (dn + dv) * r, 10);  // [nh, dn + dv, r]
  auto q = testutil::random_vector(T * nh * (dn + dr), 11);
  common::ThreadPool pool(2);

  // Expanded: k_nope / v per head from the gathered latent.
  std::vector<float> c_kv(ctx * r), k_pe(ctx * dr), kv(ctx * nh * (dn + dv));
  for (int64_t j = 0; j < ctx; ++j) {
    std::copy_n(cache.token(j), r, c_kv.data() + j * r);
    std::copy_n(cache.token(j) + r, dr, k_pe.data() + j * dr);
  }
  kernels::sgemm(ctx, nh * (dn + dv), r, 1.0f, c_kv.data(), r, w_kv_b.data(), r, true, 0.0f,
                 kv.data(), nh * (dn + dv));
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
  p.k_nope = kv.data();
  p.v = kv.data() + dn;
  p.kv_row_stride = nh * (dn + dv);
  p.kv_head_stride = dn + dv;
  p.k_pe = k_pe.data();
  p.k_pe_stride = dr;
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
