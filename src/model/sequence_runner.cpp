// Chunked single-sequence driver: main layers, then (per chunk) the MTP layer with the next
// tokens of that chunk, exactly as an engine would feed them.
#include "model/sequence_runner.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace model {

common::Result<SequenceLogits> compute_sequence_logits(const DeepseekV3Model& model,
                                                       const std::vector<int32_t>& ids,
                                                       const SequenceLogitsOptions& options,
                                                       common::ThreadPool& pool) {
  const ModelConfig& c = model.config();
  const int64_t T = static_cast<int64_t>(ids.size()), H = c.hidden_size, V = c.vocab_size;
  if (T == 0) return common::invalid_argument("empty token id list");
  for (int32_t id : ids) {
    if (id < 0 || id >= V) {
      return common::invalid_argument("token id " + std::to_string(id) +
                                      " is outside the vocabulary [0, " + std::to_string(V) + ")");
    }
  }
  if (options.mtp && model.weights().mtp.empty()) {
    return common::invalid_argument("the model has no MTP layer (num_nextn_predict_layers = 0)");
  }
  if (options.mtp_next_token && (*options.mtp_next_token < 0 || *options.mtp_next_token >= V)) {
    return common::invalid_argument("--mtp-next token id is outside the vocabulary");
  }
  const int bs = options.block_size;
  const int64_t num_blocks = (T + bs - 1) / bs;
  LatentKvCache cache(c.num_total_layers(), 0,
                      options.mtp ? c.num_total_layers() : c.num_hidden_layers, num_blocks, bs,
                      c.kv_cache_row_dim(), 0, options.kv_cache_dtype);
  std::vector<int32_t> block_table(num_blocks);
  std::iota(block_table.begin(), block_table.end(), 0);

  SequenceLogits result;
  result.vocab_size = V;
  if (options.all_logits) result.all_logits.resize(T * V);
  if (options.mtp) result.mtp_draft_logits.resize(T * V);
  const int64_t chunk = options.chunk_size > 0 ? options.chunk_size : T;
  std::vector<float> hidden, logits;
  std::vector<int32_t> next_ids;
  for (int64_t start = 0; start < T; start += chunk) {
    const int64_t n = std::min(chunk, T - start);
    ForwardBatch batch;
    batch.sequences.push_back(
        {std::span<const int32_t>(ids.data() + start, n), start, block_table});
    hidden.assign(n * H, 0.0f);
    CP_RETURN_IF_ERROR(model.embed(batch, hidden.data()));
    CP_RETURN_IF_ERROR(model.run_layers(batch, 0, c.num_hidden_layers, hidden.data(), cache, pool));
    model.final_norm(hidden.data(), n, hidden.data());
    const bool last_chunk = start + n == T;
    if (options.all_logits) {
      CP_RETURN_IF_ERROR(
          model.compute_logits(hidden.data(), n, result.all_logits.data() + start * V, pool));
      if (last_chunk) {
        result.last_logits.assign(result.all_logits.end() - V, result.all_logits.end());
      }
    } else if (last_chunk) {
      result.last_logits.resize(V);
      CP_RETURN_IF_ERROR(
          model.compute_logits(hidden.data() + (n - 1) * H, 1, result.last_logits.data(), pool));
    }
    if (options.mtp) {
      next_ids.assign(ids.begin() + start + 1, ids.begin() + start + n);
      if (last_chunk) {
        result.mtp_next_token = options.mtp_next_token.value_or(static_cast<int32_t>(
            std::max_element(result.last_logits.begin(), result.last_logits.end()) -
            result.last_logits.begin()));
        next_ids.push_back(result.mtp_next_token);
      } else {
        next_ids.push_back(ids[start + n]);
      }
      CP_RETURN_IF_ERROR(model.mtp_logits(batch, hidden.data(), next_ids, cache, pool,
                                          result.mtp_draft_logits.data() + start * V));
    }
  }
  return result;
}

}  // namespace model
