// Which model dimensions a tensor-parallel size must divide.
#include "model/tensor_parallel.h"

namespace model {

common::Status validate_tensor_parallel(const ModelConfig& c, const TensorParallel& tp) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size)
    return common::invalid_argument("tensor-parallel rank " + std::to_string(tp.rank) + " of " +
                                    std::to_string(tp.size) + " is out of range");
  auto divides = [&](int64_t n, const std::string& what) -> common::Status {
    if (n % tp.size == 0) return {};
    return common::invalid_argument(what + " (" + std::to_string(n) +
                                    ") is not divisible by --tensor-parallel-size " +
                                    std::to_string(tp.size));
  };
  CP_RETURN_IF_ERROR(divides(c.num_attention_heads, "num_attention_heads"));
  CP_RETURN_IF_ERROR(divides(c.intermediate_size, "intermediate_size"));
  if (c.n_routed_experts > 0) {
    if (tp.expert_parallel) {
      CP_RETURN_IF_ERROR(divides(c.n_routed_experts, "n_routed_experts (expert parallel)"));
    } else {
      CP_RETURN_IF_ERROR(divides(c.moe_intermediate_size, "moe_intermediate_size"));
      CP_RETURN_IF_ERROR(divides(c.moe_intermediate_size * c.n_shared_experts,
                                 "moe_intermediate_size * n_shared_experts"));
    }
  }
  return {};
}

common::Status validate_dp_experts(const ModelConfig& c, const DataParallelExperts& ep,
                                   const TensorParallel& tp) {
  if (!ep.active()) return {};
  if (ep.rank < 0 || ep.rank >= ep.size)
    return common::invalid_argument("data-parallel rank " + std::to_string(ep.rank) + " of " +
                                    std::to_string(ep.size) + " is out of range");
  if (tp.active() && !tp.expert_parallel)
    return common::invalid_argument(
        "experts over data-parallel ranks with tensor parallelism need whole experts per rank "
        "(--enable-expert-parallel)");
  if (c.n_routed_experts == 0)
    return common::invalid_argument(
        "--enable-expert-parallel over data-parallel ranks needs a MoE model");
  if (c.n_routed_experts % ep.size != 0)
    return common::invalid_argument(
        "n_routed_experts (" + std::to_string(c.n_routed_experts) +
        ") is not divisible by the expert-parallel size " + std::to_string(ep.size) +
        (tp.active()
             ? " (--data-parallel-size x --tensor-parallel-size " + std::to_string(tp.size) + ")"
             : " (--data-parallel-size)"));
  return {};
}

common::Status validate_finegrained_tp(const ModelConfig& c, int lmhead_tensor_parallel_size,
                                       int data_parallel_size) {
  if (lmhead_tensor_parallel_size < 0)
    return common::invalid_argument(
        "finegrained_tp_config.lmhead_tensor_parallel_size must not be negative");
  if (lmhead_tensor_parallel_size == 0) return {};
  if (c.n_routed_experts == 0)
    return common::invalid_argument("The finegrained tp sizes can be enabled only for MOE models.");
  if (data_parallel_size % lmhead_tensor_parallel_size != 0)
    return common::invalid_argument(
        "finegrained tp sizes must divide by data_parallel_size. "
        "(finegrained_tp_config.lmhead_tensor_parallel_size is " +
        std::to_string(lmhead_tensor_parallel_size) + ", --data-parallel-size is " +
        std::to_string(data_parallel_size) + ")");
  return {};
}

}  // namespace model
