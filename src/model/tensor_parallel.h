// How one tensor-parallel rank's share of the model is cut from the checkpoint, as vLLM cuts
// it: attention heads and MLP / expert intermediate columns split evenly (column-parallel in,
// row-parallel out), the vocabulary split into equal padded shards, and with expert
// parallelism whole experts split across the ranks instead. q_a / kv_a projections, norms and
// the router stay whole on every rank. Value type; thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "model/config.h"

namespace model {

struct TensorParallel {
  int rank = 0;
  int size = 1;
  bool expert_parallel = false;  // --enable-expert-parallel: experts split over the group
  bool active() const { return size > 1; }
};

// vllm-ascend's finegrained_tp_config.lmhead_tensor_parallel_size: the lm_head (and the MTP
// head) split over its own group of ranks, each with its own tokens (data-parallel ranks),
// instead of the TP group. size 0: off.
struct LmHeadParallel {
  int rank = 0;
  int size = 0;
  bool active() const { return size > 1; }
};

// Expert parallelism over data-parallel ranks, vLLM's EP world of DP x TP ranks (the seeds'
// decoders: DP 32 x TP 1; their single-node command: DP 4 x TP 4). Every DP rank holds the
// whole attention (split over its TP group) and its own tokens; the routed experts are split
// evenly over all size = dp·tp ranks, rank = dp_rank·tp + tp_rank holding the rank-th share.
// size 1: off.
struct DataParallelExperts {
  int rank = 0;
  int size = 1;
  bool active() const { return size > 1; }
};

struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Rank r's part of n items split evenly (n % size == 0, checked by validate_tensor_parallel).
inline ShardRange even_shard(int64_t n, const TensorParallel& tp) {
  const int64_t per = n / tp.size;
  return {per * tp.rank, per * (tp.rank + 1)};
}

// The vocabulary: shards of ceil(V / size) rows each, the last one padded with zero rows, so
// that every rank's logits have the same width.
inline int64_t vocab_shard_rows(int64_t vocab, const TensorParallel& tp) {
  return (vocab + tp.size - 1) / tp.size;
}

// Errors, naming the dimension, for a model that cannot be split `tp.size` ways.
common::Status validate_tensor_parallel(const ModelConfig& config, const TensorParallel& tp);

// Errors, naming the dimension, for experts that cannot be split over the `ep.size` ranks of
// DP x TP, or a TP group inside that does not split whole experts (tp.expert_parallel).
common::Status validate_dp_experts(const ModelConfig& config, const DataParallelExperts& ep,
                                   const TensorParallel& tp);

// vllm-ascend's checks of finegrained_tp_config sizes, with its messages: MoE models only, and
// each size must divide data_parallel_size.
common::Status validate_finegrained_tp(const ModelConfig& config, int lmhead_tensor_parallel_size,
                                       int data_parallel_size);

}  // namespace model
