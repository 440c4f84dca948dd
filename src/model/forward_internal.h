// Internal to model: what the forward's files (deepseek_v3.cpp, deepseek_v3_attention.cpp)
// share: the batch's per-token layout, per-thread scratch buffers and the W8A8 norm bias.
// Scratch is thread_local: each thread sees its own buffers, which only grow. Layout is built
// once per forward and read-only after.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/check.h"
#include "model/deepseek_v3.h"
#include "model/forward_batch.h"
#include "model/weights.h"
#include "tensor/aligned_buffer.h"

namespace model {

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

namespace forward {

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

inline float* scratch(Scratch use, size_t size) {
  thread_local tensor::AlignedBuffer<float> buffers[static_cast<size_t>(Scratch::kCount)];
  auto& b = buffers[static_cast<size_t>(use)];
  if (b.size() < size) b.resize(std::max(size, b.size() + b.size() / 2));
  return b.data();
}

inline std::span<float> scratch_span(Scratch use, int64_t size) {
  return {scratch(use, size_t(size)), size_t(size)};
}

// The smoothing bias a W8A8 checkpoint may add after an RMSNorm (empty: none).
inline void add_norm_bias(float* x, int64_t rows, int64_t stride, const Vector& bias) {
  for (int64_t t = 0; t < rows; ++t)
    for (size_t i = 0; i < bias.size(); ++i) x[t * stride + int64_t(i)] += bias[i];
}

}  // namespace forward
}  // namespace model
