// Parsing and validation, in vllm-ascend's order: field types, ranges, the PP requirement,
// then the min_chunk clamp.
#include "sched/profiling_chunk_config.h"

#include <nlohmann/json.hpp>

namespace sched {

common::Result<ProfilingChunkConfig> parse_profiling_chunk_config(
    const nlohmann::json& extra, int pp, int64_t max_num_batched_tokens,
    std::vector<std::string>* warnings) {
  using nlohmann::json;
  ProfilingChunkConfig c;
  if (!extra.is_object()) return c;
  json cfg;
  if (extra.contains("scheduler_config") && extra["scheduler_config"].is_object() &&
      extra["scheduler_config"].contains("profiling_chunk_config")) {
    cfg = extra["scheduler_config"]["profiling_chunk_config"];
  } else if (extra.contains("profiling_chunk_config")) {
    cfg = extra["profiling_chunk_config"];
    if (warnings) {
      warnings->push_back(
          "The top-level profiling_chunk_config in additional_config is deprecated; "
          "use scheduler_config.profiling_chunk_config.");
    }
  }
  if (cfg.is_null()) return c;
  if (!cfg.is_object())
    return common::invalid_argument("profiling_chunk_config must be a JSON object");
  auto bad = [](const std::string& msg) { return common::invalid_argument(msg); };
  if (cfg.contains("enabled")) {
    if (!cfg["enabled"].is_boolean())
      return bad("profiling_chunk_config.enabled must be a boolean");
    c.enabled = cfg["enabled"].get<bool>();
  }
  c.need_timing = c.enabled;
  if (cfg.contains("mode")) {
    const bool is_string = cfg["mode"].is_string();
    const std::string mode = is_string ? cfg["mode"].get<std::string>() : "";
    if (mode == "planned") {
      c.mode = ProfilingChunkConfig::kPlanned;
    } else if (mode == "upstream") {
      c.mode = ProfilingChunkConfig::kUpstream;
    } else {
      return bad("profiling_chunk_config.mode must be \"planned\" or \"upstream\", got " +
                 cfg["mode"].dump());
    }
  }
  c.timing_stage = c.mode == ProfilingChunkConfig::kUpstream ? "last" : "max";
  if (cfg.contains("smooth_factor")) {
    if (!cfg["smooth_factor"].is_number())
      return bad("profiling_chunk_config.smooth_factor must be a number");
    c.smooth_factor = cfg["smooth_factor"].get<double>();
  }
  if (!(c.smooth_factor > 0.0 && c.smooth_factor <= 1.0)) {
    return bad("smooth_factor must be in (0, 1], got " + json(c.smooth_factor).dump());
  }
  if (cfg.contains("min_chunk")) {
    if (!cfg["min_chunk"].is_number_integer())
      return bad("profiling_chunk_config.min_chunk must be an integer");
    c.min_chunk = cfg["min_chunk"].get<int64_t>();
  }
  if (c.min_chunk <= 0)
    return bad("min_chunk must be greater than 0, got " + std::to_string(c.min_chunk));
  if (cfg.contains("max_fit_chunk")) {
    if (!cfg["max_fit_chunk"].is_number_integer())
      return bad("profiling_chunk_config.max_fit_chunk must be an integer");
    c.max_fit_chunk = cfg["max_fit_chunk"].get<int>();
  }
  if (c.max_fit_chunk <= 5) {
    return bad("Recommend to use at least 30 data points for fitting, got " +
               std::to_string(c.max_fit_chunk));
  }
  if (cfg.contains("min_predicted_gain")) {
    if (!cfg["min_predicted_gain"].is_number())
      return bad("profiling_chunk_config.min_predicted_gain must be a number");
    c.min_predicted_gain = cfg["min_predicted_gain"].get<double>();
    if (!(c.min_predicted_gain >= 0 && c.min_predicted_gain < 1))
      return bad("min_predicted_gain must be in [0, 1), got " + json(c.min_predicted_gain).dump());
  }
  if (cfg.contains("timing_stage")) {
    if (!cfg["timing_stage"].is_string())
      return bad("profiling_chunk_config.timing_stage must be \"last\" or \"max\"");
    c.timing_stage = cfg["timing_stage"].get<std::string>();
    if (c.timing_stage != "last" && c.timing_stage != "max") {
      return bad("profiling_chunk_config.timing_stage must be \"last\" or \"max\", got \"" +
                 c.timing_stage + "\"");
    }
  }
  if (cfg.contains("merge_tail")) {
    if (!cfg["merge_tail"].is_number_integer() || cfg["merge_tail"].get<int64_t>() < 0)
      return bad("profiling_chunk_config.merge_tail must be a non-negative integer");
    c.merge_tail = cfg["merge_tail"].get<int64_t>();
  }
  if (cfg.contains("chunk_align")) {
    if (!cfg["chunk_align"].is_number_integer() || cfg["chunk_align"].get<int64_t>() < 0)
      return bad("profiling_chunk_config.chunk_align must be a non-negative integer");
    c.chunk_align = cfg["chunk_align"].get<int64_t>();
  }
  if (cfg.contains("overhead_aware")) {
    if (!cfg["overhead_aware"].is_boolean())
      return bad("profiling_chunk_config.overhead_aware must be a boolean");
    c.overhead_aware = cfg["overhead_aware"].get<bool>();
  }
  if (cfg.contains("need_timing")) {
    if (!cfg["need_timing"].is_boolean())
      return bad("profiling_chunk_config.need_timing must be a boolean");
    c.need_timing = cfg["need_timing"].get<bool>();
  }
  if (c.mode == ProfilingChunkConfig::kPlanned && warnings &&
      (cfg.contains("smooth_factor") || c.merge_tail > 0 || c.overhead_aware)) {
    warnings->push_back(
        "profiling_chunk_config: smooth_factor, merge_tail and overhead_aware apply to mode "
        "\"upstream\"; mode \"planned\" plans each prompt's chunks from its cost model.");
  }
  if (!c.enabled && c.need_timing) {
    c.need_timing = false;
    if (warnings)
      warnings->push_back(
          "profiling_chunk_config.need_timing is ignored because enabled is false.");
  }
  if (c.enabled && pp <= 1) {
    return bad(
        "profiling_chunk_config requires pipeline parallelism (pp > 1). Got "
        "pipeline_parallel_size=" +
        std::to_string(pp) +
        "; set --pipeline-parallel-size to 2 or more, or disable profiling_chunk_config.");
  }
  if (c.enabled && max_num_batched_tokens < c.min_chunk) {
    if (warnings) {
      warnings->push_back(
          "max_num_batched_tokens is smaller than profiling_chunk_config.min_chunk. "
          "max_num_batched_tokens=" +
          std::to_string(max_num_batched_tokens) + ", min_chunk=" + std::to_string(c.min_chunk) +
          ". Clamping min_chunk to " + std::to_string(max_num_batched_tokens) + ".");
    }
    c.min_chunk = max_num_batched_tokens;
  }
  return c;
}

}  // namespace sched
