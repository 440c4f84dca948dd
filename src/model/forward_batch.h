// ForwardBatch: what one forward step computes. Each entry is one sequence's chunk of new
// tokens continuing after num_computed_tokens cached tokens; block_table maps its logical
// blocks to cache blocks and must cover num_computed_tokens + token count positions.
// Plain data; the spans must outlive the forward call.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace model {

// How a sequence's chunk attends to its context. kAuto picks the cheaper form by FLOP count:
// expanded (k/v per head recomputed from the latent; prefill) or absorbed (MQA over the latent
// with W_UK / W_UV folded into q and o; decode).
enum class AttentionMode { kAuto, kExpanded, kAbsorbed };

struct SequenceChunk {
  std::span<const int32_t> token_ids;
  int64_t num_computed_tokens = 0;
  std::span<const int32_t> block_table;
  // A form chosen by the caller (CPP's cost model); kAuto defers to the model's own choice.
  AttentionMode attention = AttentionMode::kAuto;
};

struct ForwardBatch {
  std::vector<SequenceChunk> sequences;

  int64_t num_tokens() const {
    int64_t n = 0;
    for (const auto& s : sequences) n += static_cast<int64_t>(s.token_ids.size());
    return n;
  }
};

}  // namespace model
