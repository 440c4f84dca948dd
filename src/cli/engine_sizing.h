// Engine sizing: max_model_len, the token budget and the KV cache's block count from the flags
// and the model, with vLLM's defaults and its error messages, and the refusal of a plan whose
// weights, scratch and smallest KV cache exceed the host's memory. A pure function, shared by
// `serve` and `bench latency|throughput` so both size an engine the same way.
#pragma once

#include <cstdint>
#include <optional>

#include "common/status.h"

namespace cli {

struct SizingInput {
  int64_t max_position_embeddings = 0;         // config.json (0: unknown, 4096 assumed)
  std::optional<int64_t> max_model_len;        // --max-model-len
  bool allow_long_max_model_len = false;       // VLLM_ALLOW_LONG_MAX_MODEL_LEN
  std::optional<bool> enable_chunked_prefill;  // --[no-]enable-chunked-prefill (default on)
  std::optional<int64_t> max_num_batched_tokens;
  int32_t max_num_seqs = 256;
  int block_size = 16;
  int64_t kv_bytes_per_block = 0;
  // --kv-cache-memory bytes, or else memory_utilization × host memory minus the weights.
  std::optional<int64_t> kv_cache_bytes;
  double memory_utilization = 0.9;
  int64_t host_memory_bytes = 0;
  int64_t weight_bytes = 0;   // as the load will hold them (model/memory_plan.h)
  int64_t scratch_bytes = 0;  // the forward's working memory at max_num_batched_tokens
  // --num-gpu-blocks-override: exactly this many KV blocks, whatever the memory says (vLLM's,
  // for testing preemption); it must still hold one max_model_len sequence and fit the host.
  std::optional<int64_t> num_blocks_override;
};

struct Sizing {
  int64_t max_model_len = 0;
  int64_t max_num_batched_tokens = 0;
  bool chunked_prefill = true;
  // At most what max_num_seqs sequences of max_model_len can use, unless overridden.
  int64_t num_kv_blocks = 0;
};

common::Result<Sizing> plan_sizing(const SizingInput& in);
// Only max_model_len, the token budget and chunked prefill (num_kv_blocks stays 0), with the
// same checks: what the scratch estimate needs before the memory is sized.
common::Result<Sizing> plan_token_budget(const SizingInput& in);

}  // namespace cli
