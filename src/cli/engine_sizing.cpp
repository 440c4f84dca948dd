// vLLM's checks on max_model_len and max_num_batched_tokens, and the KV cache's size.
#include "cli/engine_sizing.h"

#include <algorithm>
#include <climits>
#include <sstream>

namespace cli {

common::Result<Sizing> plan_token_budget(const SizingInput& in) {
  Sizing s;
  const int64_t derived = in.max_position_embeddings > 0 ? in.max_position_embeddings : 4096;
  s.max_model_len = in.max_model_len.value_or(derived);
  if (s.max_model_len > derived && !in.allow_long_max_model_len) {
    return common::invalid_argument(
        "User-specified max_model_len (" + std::to_string(s.max_model_len) +
        ") is greater than the derived max_model_len (max_position_embeddings=" +
        std::to_string(derived) +
        " in model's config.json). To allow overriding this maximum, set the env var "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1");
  }
  s.chunked_prefill = in.enable_chunked_prefill.value_or(true);
  s.max_num_batched_tokens = in.max_num_batched_tokens.value_or(
      s.chunked_prefill ? 2048 : std::max<int64_t>(s.max_model_len, 2048));
  if (!s.chunked_prefill && s.max_num_batched_tokens < s.max_model_len) {
    return common::invalid_argument(
        "max_num_batched_tokens (" + std::to_string(s.max_num_batched_tokens) +
        ") is smaller than max_model_len (" + std::to_string(s.max_model_len) +
        "). This effectively limits the maximum sequence length to max_num_batched_tokens and "
        "makes vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
        "max_model_len.");
  }
  if (s.max_num_batched_tokens < in.max_num_seqs) {
    return common::invalid_argument("max_num_batched_tokens (" +
                                    std::to_string(s.max_num_batched_tokens) +
                                    ") must be greater than or equal to max_num_seqs (" +
                                    std::to_string(in.max_num_seqs) + ").");
  }
  return s;
}

common::Result<Sizing> plan_sizing(const SizingInput& in) {
  CP_ASSIGN_OR_RETURN(Sizing s, plan_token_budget(in));
  const int64_t usable =
      static_cast<int64_t>(in.memory_utilization * static_cast<double>(in.host_memory_bytes));
  const int64_t kv_bytes = in.kv_cache_bytes.value_or(usable - in.weight_bytes - in.scratch_bytes);
  const int64_t per_block = std::max<int64_t>(in.kv_bytes_per_block, 1);
  const int64_t blocks_per_seq = (s.max_model_len + in.block_size - 1) / in.block_size;
  // Weights and scratch, with the --kv-cache-memory asked for, must fit before anything loads
  // (without it, a KV cache too small for one request gets vLLM's message below).
  if (in.host_memory_bytes > 0 && !in.num_blocks_override) {
    const int64_t kv_needed = in.kv_cache_bytes.value_or(blocks_per_seq * per_block);
    const int64_t need = in.weight_bytes + in.scratch_bytes + kv_needed;
    const int64_t limit = in.kv_cache_bytes ? in.host_memory_bytes : usable;
    if (need - (in.kv_cache_bytes ? 0 : kv_needed) > limit) {
      std::ostringstream m;
      const auto gib = [](int64_t b) { return double(b) / double(int64_t{1} << 30); };
      m.precision(3);
      m << "The model does not fit in memory: weights " << gib(in.weight_bytes) << " GiB + scratch "
        << gib(in.scratch_bytes) << " GiB for max_num_batched_tokens=" << s.max_num_batched_tokens
        << " + KV cache " << gib(kv_needed) << " GiB ("
        << (in.kv_cache_bytes ? std::string("--kv-cache-memory")
                              : "one request of max_model_len=" + std::to_string(s.max_model_len))
        << ") = " << gib(need) << " GiB, more than ";
      if (in.kv_cache_bytes) {
        m << "the host's ";
      } else {
        m << in.memory_utilization << " (--gpu-memory-utilization) of the host's ";
      }
      m << gib(in.host_memory_bytes) << " GiB (" << gib(limit)
        << " GiB). Lower --max-model-len or --max-num-batched-tokens"
        << (in.kv_cache_bytes ? ", lower --kv-cache-memory" : ", raise --gpu-memory-utilization")
        << ", or hold fewer weights per host (--pipeline-parallel-size or --tensor-parallel-size "
           "over more nodes, a W8A8 checkpoint).";
      return common::invalid_argument(m.str());
    }
  }
  if (in.num_blocks_override) {
    const int64_t n = *in.num_blocks_override;
    if (n < blocks_per_seq) {
      return common::invalid_argument(
          "--num-gpu-blocks-override " + std::to_string(n) + " holds " +
          std::to_string(n * in.block_size) + " tokens, fewer than one request of max_model_len (" +
          std::to_string(s.max_model_len) + ", " + std::to_string(blocks_per_seq) +
          " blocks): raise it or lower --max-model-len");
    }
    if (n > INT32_MAX || n > in.host_memory_bytes / per_block) {
      std::ostringstream m;
      m << "--num-gpu-blocks-override " << n << " needs "
        << double(n) * double(per_block) / (1 << 30) << " GiB of KV cache, more than this host's "
        << double(in.host_memory_bytes) / (1 << 30) << " GiB of memory";
      return common::invalid_argument(m.str());
    }
    s.num_kv_blocks = n;
    return s;
  }
  int64_t blocks = kv_bytes / per_block;
  blocks = std::min<int64_t>({blocks, blocks_per_seq * in.max_num_seqs, INT32_MAX});
  if (blocks < blocks_per_seq) {
    std::ostringstream m;
    m << "To serve at least one request with the models's max seq len (" << s.max_model_len
      << "), (" << double(blocks_per_seq * per_block) / (1 << 30)
      << " GiB KV cache is needed, which is larger than the available KV cache memory ("
      << double(std::max<int64_t>(kv_bytes, 0)) / (1 << 30)
      << " GiB). Based on the available memory, the estimated maximum model length is "
      << std::max<int64_t>(blocks, 0) * in.block_size
      << ". Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
         "initializing the engine.";
    return common::invalid_argument(m.str());
  }
  s.num_kv_blocks = blocks;
  return s;
}

}  // namespace cli
