// Internal to kernels: the grid, partial state and per-ISA entry points of the absorbed-form MLA
// attention (mla_decode.cpp drives them; mla_decode_flash.h implements them). Plain data and
// declarations only, so that every file includes it before any target pragma.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/mla_attention.h"
#include "tensor/aligned_buffer.h"

namespace kernels::detail {

// Keys on a grid of absolute positions. A segment's rows (128 × 576 f32 = 295 KB) stay in L2
// while both products read them, so the cache is read from memory once per block of rows.
inline constexpr int64_t kDecodeSegmentKeys = 128;
// The unit of parallel work over keys; its partial softmax is kept until the merge, so a split is
// large enough that the partials stay small beside the cache they summarize.
inline constexpr int64_t kDecodeSplitKeys = 2048;

// Floats per row of a partial output: kv_lora_rank rounded up to whole 64-column slices.
inline int64_t decode_o_stride(int kv_lora_rank) {
  return (kv_lora_rank + 63) / 64 * 64;
}

// Softmax state of some rows over a range of keys: max m, sum l, unnormalized output rows o
// (decode_o_stride apart). m is -inf while no key was seen.
struct DecodePartial {
  float* m;
  float* l;
  float* o;
};

// A thread's scratch: the segment's rows widened from bf16, the rows' scores and rescale
// factors, the keys' rows.
struct DecodeScratch {
  tensor::AlignedBuffer<float> widened, scores;
  std::vector<float> alpha;
  std::vector<const float*> key_rows;
};

// Rows [r0, r1) (row = token · num_heads + head) over the keys of split `split`, from a fresh
// state, into `out`. Call the AVX-512 one only when cpu_features().avx512.
void mla_decode_split_avx2(const MlaDecodeArgs& a, int64_t r0, int64_t r1, int64_t split,
                           DecodePartial out, DecodeScratch& scratch);
void mla_decode_split_avx512(const MlaDecodeArgs& a, int64_t r0, int64_t r1, int64_t split,
                             DecodePartial out, DecodeScratch& scratch);

}  // namespace kernels::detail
