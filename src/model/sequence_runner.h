// Runs whole token sequences through DeepseekV3Model chunk by chunk over a private KV cache with
// a trivial block allocator. Serves the `logits` command, parity tests and benchmarks; the
// engine drives the model with the scheduler's block tables instead. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/thread_pool.h"
#include "model/deepseek_v3.h"

namespace model {

struct SequenceLogitsOptions {
  int64_t chunk_size = 0;                 // tokens per forward; 0 = whole sequence at once
  bool all_logits = false;                // logits at every position, not only the last
  bool mtp = false;                       // also MTP draft logits at every position
  std::optional<int32_t> mtp_next_token;  // token after the sequence; default argmax
  int block_size = 16;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kF32;
};

struct SequenceLogits {
  int64_t vocab_size = 0;
  std::vector<float> last_logits;  // [V]
  std::vector<float> all_logits;   // [T, V] when requested
  int32_t mtp_next_token = -1;
  std::vector<float> mtp_draft_logits;  // [T, V] when mtp
};

// Fails (InvalidArgument) on an empty sequence or ids outside the vocabulary.
common::Result<SequenceLogits> compute_sequence_logits(const DeepseekV3Model& model,
                                                       const std::vector<int32_t>& ids,
                                                       const SequenceLogitsOptions& options,
                                                       common::ThreadPool& pool);

}  // namespace model
