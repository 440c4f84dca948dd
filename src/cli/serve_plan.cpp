// The serve flags, and their parsing and validation into a ServePlan.
#include "cli/serve_plan.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "api/generation_defaults.h"
#include "cli/activation_dtype.h"
#include "cli/flag_limits.h"
#include "cli/vllm_compat_flags.h"
#include "common/logging.h"
#include "kernels/cpu_features.h"
#include "model/quant_description.h"
#include "model/weights.h"
#include "sched/profiling_chunk_config.h"
#include "server/cors.h"

namespace cli {
namespace {

using nlohmann::json;

common::Result<json> json_value(const ArgParser& p, const std::string& flag) {
  json j = json::parse(*p.option(flag), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return common::invalid_argument("argument --" + flag + ": invalid JSON object: '" +
                                    *p.option(flag) + "'");
  }
  return j;
}

}  // namespace

void add_serve_flags(ArgParser& p) {
  p.add_option("model", "model directory (alternative to the positional MODEL)");
  p.add_option("host", "host to bind (default: all interfaces)", "0.0.0.0");
  p.add_option("port", "port", "8000");
  p.add_multi_option("served-model-name",
                     "model name(s) in the API; the first is used in responses");
  p.add_option("seed", "global random seed", "0");
  p.add_option("max-model-len",
               "context length (default: max_position_embeddings); accepts 1k, 2K, 1m");
  p.add_option("max-num-seqs", "maximum concurrent sequences per step", "256");
  p.add_option("long-prefill-token-threshold",
               "most tokens one request computes in a step (0: only the step's budget caps it)",
               "0");
  p.add_option("scheduling-policy",
               "fcfs (first come, first served) or priority (a request's `priority`, the smaller "
               "first, then arrival; preemption takes the last in that order)",
               "fcfs");
  p.add_option("max-num-batched-tokens",
               "token budget per step (default 2048 with chunked prefill)");
  p.add_option("block-size", "KV cache block size in tokens (multiple of 16)", "128");
  p.add_option("gpu-memory-utilization", "fraction of host memory for weights + KV cache", "0.9");
  p.add_option("kv-cache-memory", "KV cache size in bytes (overrides --gpu-memory-utilization)");
  p.add_option("num-gpu-blocks-override",
               "exactly this many KV cache blocks, whatever the memory (vLLM's; e.g. to test "
               "preemption)");
  p.add_flag("enable-chunked-prefill",
             "chunked prefill (on by default; --no-enable-chunked-prefill)");
  p.add_flag("enable-prefix-caching", "prefix caching (on by default; --no-enable-prefix-caching)");
  p.add_option("api-key", "require 'Authorization: Bearer KEY' on /v1 routes (env VLLM_API_KEY)");
  p.add_option("additional-config",
               "JSON platform config (scheduler_config.profiling_chunk_config, ...)");
  p.add_option("kv-transfer-config", "JSON KV connector config (PD disaggregation)");
  p.add_option("pipeline-parallel-size", "pipeline stages", "1");
  p.add_option("tensor-parallel-size", "tensor-parallel ranks", "1");
  p.add_option("data-parallel-size", "data-parallel engines", "1");
  p.add_option("data-parallel-size-local", "data-parallel engines on this node");
  p.add_option("data-parallel-rank", "this engine's data-parallel rank (external load balancing)");
  p.add_option("data-parallel-start-rank", "first data-parallel rank on this node");
  p.add_option("data-parallel-address", "data-parallel coordinator address");
  p.add_option("data-parallel-rpc-port", "data-parallel coordinator port");
  p.add_option("data-parallel-backend", "mp or ray", "mp");
  p.add_flag("data-parallel-hybrid-lb", "hybrid data-parallel load balancing");
  p.add_flag("data-parallel-external-lb", "external data-parallel load balancing");
  p.add_flag("headless", "engine ranks only, no API server");
  p.add_option("dp-engine-of",
               "internal: run one data-parallel engine for the front end at HOST:PORT");
  p.add_option("nnodes", "hosts of a multi-node deployment", "1");
  p.add_option("node-rank", "this host's rank among --nnodes (0 runs the API server)", "0");
  p.add_option("master-addr", "address of node 0, where the other nodes connect", "127.0.0.1");
  p.add_option("master-port", "first TCP port on node 0 for the links between nodes", "29501");
  p.add_flag("enable-expert-parallel", "expert parallelism for MoE layers");
  p.add_option("speculative-config",
               "JSON speculative decoding config, e.g. {\"method\":\"mtp\",...}");
  p.add_option("quantization", "quantization method (default: from config.json)");
  p.add_option("compilation-config", "JSON compilation config (no meaning on CPU)");
  p.add_flag("enforce-eager", "no graph capture (always the case on CPU)");
  p.add_flag("trust-remote-code", "accepted; chunkpipe runs no model code from checkpoints");
  p.add_flag("async-scheduling", "overlap scheduling with execution");
  p.add_option("chat-template",
               "Jinja chat template file (default: the checkpoint's, else built-in V3.1)");
  p.add_option("reasoning-parser",
               "deepseek_v3 or deepseek_r1: split reasoning_content from content");
  p.add_flag("numa-bind",
             "chunkpipe extension: each rank (pipeline stage x TP rank) on one NUMA node of its "
             "host, its threads on that node's cores and its memory on that node");
  p.add_option("threads", "CPU threads of the worker",
               std::to_string(std::max(1u, std::thread::hardware_concurrency())));
  p.add_option("tokenizer", "tokenizer directory (default: the model directory)");
  p.add_option("max-logprobs", "maximum logprobs / top_logprobs per token", "20");
  p.add_option("logprobs-mode",
               "what generated-token logprobs hold: raw_logprobs (before logit_bias, penalties "
               "and the other processors), raw_logits, processed_logprobs or processed_logits "
               "(of the distribution the token was drawn from)",
               "raw_logprobs");
  p.add_option("swap-space", "CPU swap space in GiB (no meaning on CPU)");
  add_dtype_option(p);
  add_kv_cache_dtype_option(p);
  p.add_option("generation-config",
               "sampling defaults: auto (the model's generation_config.json), vllm (none), or a "
               "directory holding a generation_config.json",
               "auto");
  p.add_option("tool-call-parser", "tool call parser: deepseek_v3 or deepseek_v31");
  p.add_flag("enable-auto-tool-choice", "let the model call tools (tool_choice \"auto\")");
  p.add_flag("trust-request-chat-template",
             "render a request's own chat_template (refused without this flag)");
  p.add_option("allowed-origins", "CORS: allowed origins, a JSON list", "[\"*\"]");
  p.add_flag("allow-credentials", "CORS: allow credentials");
  p.add_option("allowed-methods", "CORS: allowed methods, a JSON list", "[\"*\"]");
  p.add_option("allowed-headers", "CORS: allowed headers, a JSON list", "[\"*\"]");
  p.add_flag("enable-force-include-usage", "usage in every stream");
  p.add_flag("enable-prompt-tokens-details", "prompt_tokens_details in usage");
  p.add_flag("return-tokens-as-token-ids",
             "logprobs name tokens 'token_id:{id}' (a request's own field overrides it)");
  p.add_flag("disable-log-requests", "no per-request logs");
  p.add_flag("enable-log-requests",
             "log each request's prompt and parameters when the engine takes it, and its counts "
             "and timings when it finishes");
  p.add_flag("enable-log-outputs", "with --enable-log-requests, also log each request's output");
  p.add_option("max-log-len",
               "characters of prompt and output text, and token ids, in those logs (default: all)");
  p.add_flag("disable-log-stats", "no periodic stats logs");
  p.add_option("uvicorn-log-level",
               "uvicorn's log level in vLLM; checked, without effect (chunkpipe writes no HTTP "
               "access log)",
               "info");
  p.add_option("h11-max-incomplete-event-size", "largest request line + header fields, in bytes",
               std::to_string(64 << 10));
  p.add_option("response-role", "the role of a chat answer (with add_generation_prompt)",
               "assistant");
  p.add_flag("enable-server-load-tracking",
             "GET /load reports the completions and chats in progress");
  p.add_flag("enable-request-id-headers",
             "every response carries X-Request-Id (the client's, else a new one)");
  p.add_option("override-generation-config",
               "JSON sampling defaults over --generation-config's, e.g. {\"temperature\": 0.5}");
  p.add_option("http-threads", "HTTP I/O threads (event loop; connections cost no thread)", "2");
  p.add_option("http-worker-threads", "threads that parse, tokenize and format responses", "2");
  p.add_option("max-request-body-bytes", "largest accepted request body", std::to_string(32 << 20));
  p.add_option("max-stream-buffer-bytes",
               "unsent bytes a response may queue before its (too slow) client is dropped",
               std::to_string(4 << 20));
  p.add_option(
      "http-keep-alive-timeout",
      "seconds an idle keep-alive connection stays open (env VLLM_HTTP_TIMEOUT_KEEP_ALIVE)");
  p.add_option("shutdown-drain-timeout",
               "seconds SIGTERM lets running requests finish before ending them", "3");
  p.add_alias("-tp", "tensor-parallel-size");
  p.add_option("trace-file",
               "pipeline parallel: write a Chrome trace (Perfetto) of every stage at shutdown");
  p.add_option("pp-layer-partition",
               "decoder layers per pipeline stage, e.g. 3,5 (env VLLM_PP_LAYER_PARTITION)");
  p.add_alias("-pp", "pipeline-parallel-size");
  p.add_alias("-dp", "data-parallel-size");
  p.add_alias("-dpl", "data-parallel-size-local");
  p.add_alias("-dpn", "data-parallel-rank");
  p.add_alias("-dpr", "data-parallel-start-rank");
  p.add_alias("-dpa", "data-parallel-address");
  p.add_alias("-dpp", "data-parallel-rpc-port");
  p.add_alias("-dpb", "data-parallel-backend");
  p.add_alias("-dph", "data-parallel-hybrid-lb");
  p.add_alias("-dpe", "data-parallel-external-lb");
  p.add_alias("-ep", "enable-expert-parallel");
  p.add_alias("-q", "quantization");
  p.add_alias("-O", "compilation-config");
  add_vllm_compat_flags(p);
}

common::Result<int64_t> max_model_len_value(const ArgParser& p) {
  std::string v = *p.option("max-model-len");
  int64_t mult = 1;
  if (!v.empty() && (v.back() == 'k' || v.back() == 'K' || v.back() == 'm' || v.back() == 'M')) {
    mult = v.back() == 'k' ? 1000 : v.back() == 'K' ? 1024 : v.back() == 'm' ? 1000000 : 1048576;
    v.pop_back();
  }
  int64_t out = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || ptr != v.data() + v.size()) {
    return common::invalid_argument("argument --max-model-len: invalid int value: '" +
                                    *p.option("max-model-len") + "'");
  }
  // Token counts past 2^31 - 1 are no context any checkpoint has (and 9e18M would overflow).
  if (out < 1 || out > kMaxIntFlag / mult) {
    return common::invalid_argument("argument --max-model-len: must be in [1, " +
                                    std::to_string(kMaxIntFlag) + "] tokens, got '" +
                                    *p.option("max-model-len") + "'");
  }
  return out * mult;
}

transfer::ConnectorPlacement connector_placement(const ServePlan& plan) {
  transfer::ConnectorPlacement at;
  at.dp_rank = plan.data_parallel_rank;
  at.pp_size = plan.pipeline_parallel_size;
  at.tp_size = plan.tensor_parallel_size;
  at.block_size = plan.engine.block_size;
  return at;
}

namespace {

// vllm-ascend's balance scheduling: additional_config's enable_balance_scheduling (already in
// plan->engine) or the deprecated VLLM_ASCEND_BALANCE_SCHEDULING=1 that the seeds export. It
// gates admission across DP ranks in lock step; upstream refuses it beside CPP's scheduler.
common::Status plan_balance_scheduling(ServePlan* plan) {
  const char* env = std::getenv("VLLM_ASCEND_BALANCE_SCHEDULING");
  if (env != nullptr && std::string(env) == "1") plan->engine.balance_scheduling = true;
  if (!plan->engine.balance_scheduling) return {};
  if (plan->engine.profiling_chunk && plan->engine.profiling_chunk->enabled)
    return common::invalid_argument(
        "profiling_chunk_config cannot be enabled together with balance scheduling "
        "(enable_balance_scheduling or VLLM_ASCEND_BALANCE_SCHEDULING=1)");
  if (!plan->dp.lockstep) {
    LOG(INFO) << "Balance scheduling has no effect here: it gates admission across data-parallel "
                 "ranks in lock step (--data-parallel-size > 1 with --enable-expert-parallel)";
    plan->engine.balance_scheduling = false;
    return {};
  }
  LOG(INFO) << "Balance scheduling: while a data-parallel rank runs --max-num-seqs "
            << plan->engine.scheduler.max_num_seqs << " requests, no rank admits a waiting one";
  return {};
}

// A feature the flags ask for that chunkpipe has not built, with what it does have.
common::Status unbuilt(const std::string& what, const std::string& issue) {
  return common::unimplemented(what + " is not built yet in chunkpipe (" + issue + ")");
}

// --additional-config: CPP (profiling_chunk_config), the recompute and balance scheduling
// switches, and chunkpipe's extension keys. Validated first, so that upstream's messages for
// the CPP settings win over "not built yet".
common::Status plan_additional_config(const ArgParser& p, ServePlan* plan) {
  if (!p.given("additional-config")) return {};
  CP_ASSIGN_OR_RETURN(json extra, json_value(p, "additional-config"));
  if (extra.contains("scheduler_config") && !extra["scheduler_config"].is_object())
    return common::invalid_argument("additional_config.scheduler_config must be a JSON object");
  CP_ASSIGN_OR_RETURN(int64_t pp, p.int_option("pipeline-parallel-size", 1, kMaxRanks));
  int64_t batched = 2048;
  if (p.given("max-num-batched-tokens")) {
    CP_ASSIGN_OR_RETURN(batched, p.int_option("max-num-batched-tokens", 1));
  }
  std::vector<std::string> warnings;
  CP_ASSIGN_OR_RETURN(
      sched::ProfilingChunkConfig pcc,
      sched::parse_profiling_chunk_config(extra, static_cast<int>(pp), batched, &warnings));
  for (const std::string& w : warnings) LOG(WARNING) << w;
  // vllm-ascend reads the recompute scheduler's and balance scheduling's switches at the top
  // level and under scheduler_config; their checks follow the parallel plan below.
  for (const json* where :
       {&extra, extra.contains("scheduler_config") && extra["scheduler_config"].is_object()
                    ? &extra["scheduler_config"]
                    : nullptr}) {
    if (where == nullptr) continue;
    for (const auto& [key, into] :
         {std::pair<std::string, bool*>{"recompute_scheduler_enable",
                                        &plan->engine.scheduler.recompute_scheduler_enable},
          {"enable_balance_scheduling", &plan->engine.balance_scheduling}}) {
      if (!where->contains(key)) continue;
      if (!(*where)[key].is_boolean())
        return common::invalid_argument("additional_config." + key + " must be a boolean");
      *into |= (*where)[key].get<bool>();
    }
  }
  if (extra.contains("expanded_kv_cache")) {  // chunkpipe extension key, see EngineConfig
    if (!extra["expanded_kv_cache"].is_boolean())
      return common::invalid_argument("additional_config.expanded_kv_cache must be a boolean");
    plan->engine.expanded_kv_cache = extra["expanded_kv_cache"].get<bool>();
    if (plan->engine.expanded_kv_cache)
      LOG(INFO) << "expanded_kv_cache: k_nope and v are cached per token beside the latent";
  }
  if (extra.contains("lm_head_int8")) {  // chunkpipe extension key, see model::LoadOptions
    if (!extra["lm_head_int8"].is_boolean())
      return common::invalid_argument("additional_config.lm_head_int8 must be a boolean");
    plan->lm_head_int8 = extra["lm_head_int8"].get<bool>();
    if (plan->lm_head_int8)
      LOG(INFO) << "lm_head_int8: the lm_head is quantized to int8 per row at load";
  }
  if (extra.contains("finegrained_tp_config")) {
    const json& f = extra["finegrained_tp_config"];
    if (!f.is_object())
      return common::invalid_argument("additional_config.finegrained_tp_config must be an object");
    for (const auto& [key, value] : f.items()) {
      if (!value.is_number_integer())
        return common::invalid_argument("additional_config.finegrained_tp_config." + key +
                                        " must be an integer");
      if (key == "lmhead_tensor_parallel_size") {
        if (value.get<int64_t>() < 0 || value.get<int64_t>() > kMaxRanks)
          return common::invalid_argument(
              "additional_config.finegrained_tp_config.lmhead_tensor_parallel_size must be in "
              "[0, " +
              std::to_string(kMaxRanks) + "], got " + value.dump());
        plan->lmhead_tensor_parallel_size = static_cast<int>(value.get<int64_t>());
      } else if (value.get<int64_t>() > 0) {
        return unbuilt("finegrained_tp_config." + key, "only lmhead_tensor_parallel_size is");
      }
    }
  }
  if (pcc.enabled) {
    plan->engine.profiling_chunk = pcc;
    LOG(INFO) << "profiling_chunk_config enabled: smooth_factor=" << pcc.smooth_factor
              << ", min_chunk=" << pcc.min_chunk
              << ", need_timing=" << (pcc.need_timing ? "true" : "false")
              << ", max_fit_chunk=" << pcc.max_fit_chunk;
  } else {
    json unused = extra;
    unused.erase("expanded_kv_cache");
    unused.erase("lm_head_int8");
    unused.erase("finegrained_tp_config");
    unused.erase("recompute_scheduler_enable");
    unused.erase("enable_balance_scheduling");
    if (unused.contains("scheduler_config") && unused["scheduler_config"].is_object()) {
      unused["scheduler_config"].erase("recompute_scheduler_enable");
      unused["scheduler_config"].erase("enable_balance_scheduling");
      if (unused["scheduler_config"].empty()) unused.erase("scheduler_config");
    }
    if (!unused.empty())
      LOG(INFO) << "--additional-config keys accepted and not used on CPU: " << unused.dump();
  }
  return {};
}

// Pipeline stages and their layer split, tensor, expert and data parallelism, and the nodes.
common::Status plan_parallel_layout(const ArgParser& p, ServePlan* plan) {
  {
    CP_ASSIGN_OR_RETURN(int64_t pp, p.int_option("pipeline-parallel-size", 1, kMaxRanks));
    plan->pipeline_parallel_size = static_cast<int>(pp);
    std::string partition = p.option("pp-layer-partition").value_or("");
    if (partition.empty() && std::getenv("VLLM_PP_LAYER_PARTITION"))
      partition = std::getenv("VLLM_PP_LAYER_PARTITION");
    std::stringstream ss(partition);
    for (std::string item; std::getline(ss, item, ',');) {
      common::Result<int64_t> layers = parse_int_value("pp-layer-partition", item);
      if (!layers.ok() || *layers < 0 || *layers > std::numeric_limits<int>::max()) {
        return common::invalid_argument("argument --pp-layer-partition: invalid layer count '" +
                                        item + "'");
      }
      plan->layer_partition.push_back(static_cast<int>(*layers));
    }
  }
  {
    CP_ASSIGN_OR_RETURN(int64_t tp, p.int_option("tensor-parallel-size", 1));
    if (tp > 64) return common::invalid_argument("--tensor-parallel-size must be at most 64");
    plan->tensor_parallel_size = static_cast<int>(tp);
    plan->expert_parallel = tp > 1 && p.flag("enable-expert-parallel");
    plan->numa_bind = p.flag("numa-bind");
    CP_RETURN_IF_ERROR(plan_data_parallel(p, plan->tensor_parallel_size,
                                          plan->pipeline_parallel_size,
                                          plan->lmhead_tensor_parallel_size, &plan->dp));
    if (plan->dp.rank >= 0) plan->data_parallel_rank = plan->dp.rank;
  }
  {
    auto& t = plan->topology;
    CP_ASSIGN_OR_RETURN(int64_t nnodes, p.int_option("nnodes", 1, kMaxRanks));
    CP_ASSIGN_OR_RETURN(int64_t node_rank, p.int_option("node-rank", 0, kMaxRanks));
    CP_ASSIGN_OR_RETURN(int64_t master_port, p.int_option("master-port", 1, 65535));
    t.num_stages = plan->pipeline_parallel_size;
    t.nnodes = static_cast<int>(nnodes);
    t.node_rank = static_cast<int>(node_rank);
    t.master_addr = *p.option("master-addr");
    t.master_port = static_cast<int>(master_port);
    plan->headless = p.flag("headless");
    t.tp_size = plan->tensor_parallel_size;
    if (t.nnodes > 1) {
      if (plan->pipeline_parallel_size * plan->tensor_parallel_size < 2)
        return unbuilt("multi-node serving of a single rank", "planned with data parallelism");
      CP_RETURN_IF_ERROR(worker::validate_topology(t));
      if (t.node_rank > 0 && !plan->headless)
        return common::invalid_argument("--node-rank " + std::to_string(t.node_rank) +
                                        " runs no API server: add --headless");
      if (t.node_rank == 0 && plan->headless)
        return common::invalid_argument("node 0 runs the API server: drop --headless");
    } else if (plan->headless && !plan->dp.active()) {
      return common::invalid_argument(
          "--headless needs --nnodes > 1 (a pipeline) or --data-parallel-size > 1");
    }
    if (plan->dp.active() && t.nnodes > 1)
      return unbuilt("data parallelism with a multi-node pipeline (--nnodes)",
                     "--data-parallel-* places one rank's engine on one node");
  }
  return {};
}

// --kv-transfer-config (PD or the shared-storage connector) and the recompute scheduler, which
// only a PD decoder runs.
common::Status plan_kv_transfer(const ArgParser& p, ServePlan* plan) {
  if (p.given("kv-transfer-config")) {
    plan->kv_transfer_config = p.option("kv-transfer-config").value_or("");
    CP_ASSIGN_OR_RETURN(plan->kv_transfer,
                        transfer::parse_kv_transfer_config(plan->kv_transfer_config));
    const transfer::KvTransferConfig& kt = plan->kv_transfer;
    plan->server.kv_producer = kt.kv_connector == transfer::kMooncakeConnector && kt.is_producer();
    plan->engine.scheduler.recompute_kv_load_failures = kt.kv_load_failure_policy == "recompute";
    if (kt.kv_connector == transfer::kMooncakeConnector) {
      LOG(INFO) << "kv_connector MooncakeConnectorV1 maps to chunkpipe's pull connector (D reads "
                   "the prompt's KV blocks from P)";
      const int pp = plan->pipeline_parallel_size;
      if (kt.is_producer() && kt.prefill->pp_size != pp)
        return common::invalid_argument(
            "--kv-transfer-config: 'kv_connector_extra_config.prefill.pp_size' is " +
            std::to_string(kt.prefill->pp_size) + " but --pipeline-parallel-size is " +
            std::to_string(pp));
      if (kt.is_producer() && kt.prefill->tp_size != plan->tensor_parallel_size)
        return common::invalid_argument(
            "--kv-transfer-config: 'kv_connector_extra_config.prefill.tp_size' is " +
            std::to_string(kt.prefill->tp_size) + " but --tensor-parallel-size is " +
            std::to_string(plan->tensor_parallel_size));
    }
    if (kt.kv_connector != "SharedStorageConnector" &&
        kt.kv_connector != transfer::kMooncakeConnector)
      return common::invalid_argument("--kv-transfer-config: kv_connector '" + kt.kv_connector +
                                      "' is not available; chunkpipe has SharedStorageConnector "
                                      "and MooncakeConnectorV1");
  }
  if (plan->engine.scheduler.recompute_scheduler_enable) {
    if (plan->kv_transfer_config.empty())  // as vllm-ascend: the recompute scheduler is PD's
      return common::invalid_argument(
          "recompute_scheduler_enable needs prefill-decode disaggregation: a --kv-transfer-config "
          "with kv_role kv_consumer");
    if (plan->kv_transfer.kv_role != "kv_consumer") {
      LOG(WARNING) << "recompute_scheduler_enable is only effective on a kv_consumer; it is "
                      "ignored on this "
                   << plan->kv_transfer.kv_role;
      plan->engine.scheduler.recompute_scheduler_enable = false;
    } else {
      LOG(INFO) << "Recompute scheduler: a request without KV slots finishes with stop_reason "
                   "\"recomputed\" for the proxy to re-prefill";
    }
  }
  return {};
}

// --quantization, --dtype and --kv-cache-dtype.
common::Status plan_precision(const ArgParser& p, ServePlan* plan) {
  if (p.given("quantization")) {
    const std::string q = *p.option("quantization");
    if (q == "ascend") {
      // msmodelslim's W8A8 / W4A8: the loader reads quant_model_description.json (and picks the
      // format up by itself when the file is there, as vllm-ascend does). vllm-ascend refuses a
      // model without it; here the seeds' command lines also serve a BF16 model, as stored.
      const std::string description =
          (std::filesystem::path(plan->model_dir) / model::kQuantDescriptionFile).string();
      if (std::filesystem::exists(description)) {
        LOG(INFO) << "--quantization ascend: W8A8 weights from " << description;
      } else {
        LOG(WARNING) << "--quantization ascend: " << description
                     << " is missing, so the weights load as stored (`chunkpipe quantize SRC "
                        "DST --w8a8` writes a W8A8 checkpoint)";
      }
    } else if (q != "fp8") {
      return common::invalid_argument("Unknown quantization method: " + q +
                                      ". Must be one of ['ascend', 'fp8'].");
    }
  }
  {
    CP_ASSIGN_OR_RETURN(const kernels::ActivationPrecision precision,
                        parse_dtype_option(p, plan->model_dir));
    plan->bf16_activations = precision == kernels::ActivationPrecision::kBf16;
    CP_ASSIGN_OR_RETURN(const model::KvCacheDtype kv_dtype, parse_kv_cache_dtype_option(p));
    plan->engine.bf16_kv_cache = kv_dtype == model::KvCacheDtype::kBf16;
    LOG(INFO) << "--kv-cache-dtype " << p.option("kv-cache-dtype").value_or("auto")
              << ": the latent KV cache holds " << model::kv_cache_dtype_name(kv_dtype)
              << (plan->engine.bf16_kv_cache
                      ? " (half the memory and transfer bytes of float32; greedy outputs may then "
                        "depend on how prompts are chunked and batched)"
                      : " (bfloat16 halves it)");
    if (plan->bf16_activations) {
      LOG(INFO) << "--dtype " << p.option("dtype").value_or("auto")
                << " -> bfloat16: activations are rounded to bf16 before every BF16-weight linear "
                   "layer (attention and norms stay float32, unless CHUNKPIPE_ATTENTION=bf16; "
                   "--dtype float32 keeps the activations f32)";
    }
  }
  return {};
}

// The HTTP server's and the API's flags.
common::Status plan_server_options(const ArgParser& p, ServePlan* plan) {
  auto& s = plan->server;
  s.host = *p.option("host");
  CP_ASSIGN_OR_RETURN(int64_t port, p.int_option("port", 0));
  if (port > 65535)
    return common::invalid_argument("argument --port: invalid int value: '" + *p.option("port") +
                                    "'");
  s.port = static_cast<int>(port);
  s.model_path = plan->model_dir;
  if (auto names = p.option("served-model-name")) {
    std::istringstream in(*names);
    for (std::string n; std::getline(in, n);) s.served_model_names.push_back(n);
  } else {
    s.served_model_names.push_back(plan->model_dir);
  }
  if (auto key = p.option("api-key")) {
    s.api_key = *key;
  } else if (const char* env = std::getenv("VLLM_API_KEY")) {
    s.api_key = env;
  }
  CP_RETURN_IF_ERROR(p.choice_option("uvicorn-log-level",
                                     {"critical", "debug", "error", "info", "trace", "warning"})
                         .status());
  if (auto rp = p.option("reasoning-parser")) {
    if (*rp != "deepseek_v3" && *rp != "deepseek_r1") {
      return common::invalid_argument("argument --reasoning-parser: invalid choice: '" + *rp +
                                      "' (choose from 'deepseek_r1', 'deepseek_v3')");
    }
    s.reasoning_parser = *rp;
  }
  CP_ASSIGN_OR_RETURN(int64_t max_logprobs, p.int_option("max-logprobs", 0, kMaxIntFlag));
  s.max_logprobs = static_cast<int>(max_logprobs);
  CP_ASSIGN_OR_RETURN(int64_t http_threads, p.int_option("http-threads", 1, kMaxThreads));
  s.http_threads = static_cast<int>(http_threads);
  CP_ASSIGN_OR_RETURN(int64_t worker_threads, p.int_option("http-worker-threads", 1, kMaxThreads));
  s.worker_threads = static_cast<int>(worker_threads);
  CP_ASSIGN_OR_RETURN(int64_t body_bytes, p.int_option("max-request-body-bytes", 1));
  s.max_body_bytes = static_cast<size_t>(body_bytes);
  CP_ASSIGN_OR_RETURN(int64_t stream_bytes, p.int_option("max-stream-buffer-bytes", 1));
  s.max_stream_buffer_bytes = static_cast<size_t>(stream_bytes);
  std::optional<std::string> keep_alive = p.option("http-keep-alive-timeout");
  if (!keep_alive) {
    if (const char* env = std::getenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE")) keep_alive = env;
  }
  if (keep_alive) {
    char* end = nullptr;
    const double secs = std::strtod(keep_alive->c_str(), &end);
    if (keep_alive->empty() || *end != '\0' || !(secs > 0) || secs > 86400)
      return common::invalid_argument(
          "--http-keep-alive-timeout: expected seconds in (0, 86400], got '" + *keep_alive + "'");
    s.keep_alive_timeout = std::chrono::milliseconds(static_cast<int64_t>(secs * 1000));
  }
  CP_ASSIGN_OR_RETURN(int64_t drain_s, p.int_option("shutdown-drain-timeout", 0));
  s.drain_timeout = std::chrono::seconds(drain_s);
  s.enable_auto_tool_choice = p.flag("enable-auto-tool-choice");
  s.trust_request_chat_template = p.flag("trust-request-chat-template");
  s.enable_force_include_usage = p.flag("enable-force-include-usage");
  plan->log_stats = !p.flag("disable-log-stats");
  s.enable_prompt_tokens_details = p.flag("enable-prompt-tokens-details");
  s.return_tokens_as_token_ids = p.flag("return-tokens-as-token-ids");
  CP_ASSIGN_OR_RETURN(s.cors.allowed_origins,
                      server::parse_cors_list("allowed-origins", *p.option("allowed-origins")));
  CP_ASSIGN_OR_RETURN(s.cors.allowed_methods,
                      server::parse_cors_list("allowed-methods", *p.option("allowed-methods")));
  CP_ASSIGN_OR_RETURN(s.cors.allowed_headers,
                      server::parse_cors_list("allowed-headers", *p.option("allowed-headers")));
  s.cors.allow_credentials = p.flag("allow-credentials");
  CP_ASSIGN_OR_RETURN(int64_t header_bytes, p.int_option("h11-max-incomplete-event-size", 1));
  s.max_header_bytes = static_cast<size_t>(header_bytes);
  s.response_role = *p.option("response-role");
  s.enable_server_load_tracking = p.flag("enable-server-load-tracking");
  s.enable_request_id_headers = p.flag("enable-request-id-headers");
  if (p.given("override-generation-config")) {
    CP_ASSIGN_OR_RETURN(plan->generation_overrides, json_value(p, "override-generation-config"));
    api::SamplingDefaults check;
    if (auto e = api::apply_generation_overrides(plan->generation_overrides, &check))
      return common::invalid_argument(*e);
  }
  if (auto tp = p.option("tool-call-parser")) {
    if (*tp != "deepseek_v3" && *tp != "deepseek_v31") {
      return common::invalid_argument("argument --tool-call-parser: invalid choice: '" + *tp +
                                      "' (chunkpipe has 'deepseek_v3', 'deepseek_v31')");
    }
    s.tool_call_parser = *tp;
  }
  if (s.enable_auto_tool_choice && s.tool_call_parser.empty()) {
    return common::invalid_argument(
        "--enable-auto-tool-choice requires --tool-call-parser to be set");
  }
  return {};
}

// The engine's flags: scheduling, cache, threads and memory.
common::Status plan_engine_options(const ArgParser& p, ServePlan* plan) {
  auto& e = plan->engine;
  CP_ASSIGN_OR_RETURN(int64_t seed, p.int_option("seed", 0));
  e.seed = static_cast<uint64_t>(seed);
  CP_ASSIGN_OR_RETURN(int64_t max_num_seqs, p.int_option("max-num-seqs", 1, kMaxIntFlag));
  e.scheduler.max_num_seqs = static_cast<int32_t>(max_num_seqs);
  // --logprobs-mode's choices, in sched::LogprobsMode's order.
  const std::vector<std::string> logprobs_modes = {"raw_logprobs", "raw_logits",
                                                   "processed_logprobs", "processed_logits"};
  CP_ASSIGN_OR_RETURN(const std::string logprobs_mode,
                      p.choice_option("logprobs-mode", logprobs_modes));
  e.logprobs_mode = static_cast<sched::LogprobsMode>(
      std::find(logprobs_modes.begin(), logprobs_modes.end(), logprobs_mode) -
      logprobs_modes.begin());
  CP_ASSIGN_OR_RETURN(e.scheduler.long_prefill_token_threshold,
                      p.int_option("long-prefill-token-threshold", 0));
  CP_ASSIGN_OR_RETURN(const std::string policy,
                      p.choice_option("scheduling-policy", {"fcfs", "priority"}));
  plan->server.priority_scheduling = policy == "priority";
  e.scheduler.policy = plan->server.priority_scheduling ? sched::SchedulingPolicy::kPriority
                                                        : sched::SchedulingPolicy::kFcfs;
  CP_ASSIGN_OR_RETURN(int64_t block_size, p.int_option("block-size", 1, kMaxBlockSize));
  if (block_size % 16 != 0 && block_size != 1 && block_size != 8) {
    return common::invalid_argument(
        "argument --block-size: invalid choice: " + std::to_string(block_size) +
        " (choose from 1, 8, 16, 32, 64, 128, ...)");
  }
  e.block_size = static_cast<int>(block_size);
  e.enable_prefix_caching = !p.given("enable-prefix-caching") || p.flag("enable-prefix-caching");
  e.log_requests = p.flag("enable-log-requests") && !p.flag("disable-log-requests");
  e.log_outputs = e.log_requests && p.flag("enable-log-outputs");
  if (p.flag("enable-log-outputs") && !e.log_requests)
    LOG(WARNING) << "--enable-log-outputs has no effect without --enable-log-requests";
  if (p.given("max-log-len")) {
    CP_ASSIGN_OR_RETURN(e.max_log_len, p.int_option("max-log-len", 0));
  }
  e.trace_file = p.option("trace-file").value_or("");
  CP_ASSIGN_OR_RETURN(int64_t threads, p.int_option("threads", 1, kMaxThreads));
  e.num_threads = static_cast<int>(threads);
  // --threads is per rank (stage x TP rank); a node's data-parallel engines share its cores.
  // External ranks, one process each, take OMP_NUM_THREADS when set (the seeds set it).
  const int engines_here = plan->dp.active() && !plan->dp.external ? plan->dp.size_local : 1;
  const int ranks = plan->pipeline_parallel_size * plan->tensor_parallel_size * engines_here;
  if (!p.given("threads") && plan->dp.external && std::getenv("OMP_NUM_THREADS")) {
    e.num_threads = std::max(1, std::atoi(std::getenv("OMP_NUM_THREADS")));
  } else if (!p.given("threads") && ranks > 1) {
    e.num_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks);
  }
  e.engine_index = std::max(0, plan->dp.rank);
  if (p.given("kv-cache-memory")) {
    CP_ASSIGN_OR_RETURN(plan->kv_cache_bytes, p.int_option("kv-cache-memory", 1));
  }
  if (p.given("num-gpu-blocks-override")) {
    CP_ASSIGN_OR_RETURN(plan->num_blocks_override, p.int_option("num-gpu-blocks-override", 1));
  }
  CP_ASSIGN_OR_RETURN(plan->memory_utilization, p.double_option("gpu-memory-utilization"));
  if (plan->memory_utilization <= 0 || plan->memory_utilization > 1) {
    return common::invalid_argument("--gpu-memory-utilization must be in (0, 1], got " +
                                    *p.option("gpu-memory-utilization"));
  }
  return {};
}

}  // namespace

common::Status plan_serve(const ArgParser& p, ServePlan* plan) {
  plan->model_dir = p.positional("MODEL");
  if (plan->model_dir.empty() && p.option("model")) plan->model_dir = *p.option("model");
  if (plan->model_dir.empty())
    return common::invalid_argument("the following arguments are required: MODEL");
  CP_RETURN_IF_ERROR(plan_additional_config(p, plan));
  CP_RETURN_IF_ERROR(plan_parallel_layout(p, plan));
  CP_RETURN_IF_ERROR(plan_kv_transfer(p, plan));
  if (p.given("speculative-config")) {
    CP_ASSIGN_OR_RETURN(plan->speculative,
                        parse_speculative_config(*p.option("speculative-config")));
  }
  if (p.flag("enable-expert-parallel") && plan->tensor_parallel_size == 1 && !plan->dp.active())
    LOG(INFO) << "--enable-expert-parallel with one rank: experts stay in this process";
  // A TP prefiller serves its KV from each stage's TP rank 0 (MLA's latent cache is the same
  // on every TP rank); a TP decoder would have to load every rank's cache.
  if (plan->tensor_parallel_size > 1 && !plan->kv_transfer_config.empty() &&
      plan->kv_transfer.kv_role != "kv_producer")
    return unbuilt("a " + plan->kv_transfer.kv_role + " with --tensor-parallel-size > 1",
                   "a tensor-parallel prefiller (kv_producer) is");
  LOG(INFO) << kernels::kernel_paths_line();
  if (p.given("compilation-config"))
    LOG(INFO) << "--compilation-config has no meaning on CPU: kernels run eagerly";
  if (p.flag("enforce-eager")) LOG(INFO) << "--enforce-eager: the CPU backend always runs eagerly";
  if (p.flag("trust-remote-code"))
    LOG(INFO) << "--trust-remote-code: accepted; no model code is loaded from checkpoints";
  CP_RETURN_IF_ERROR(check_vllm_compat_flags(p));
  if (p.given("async-scheduling"))
    LOG(INFO) << "--async-scheduling: the CPU engine schedules synchronously between steps";
  if (p.given("swap-space"))
    LOG(INFO) << "--swap-space has no meaning on CPU: the KV cache already lives in host memory";

  CP_RETURN_IF_ERROR(plan_precision(p, plan));
  CP_RETURN_IF_ERROR(plan_server_options(p, plan));
  CP_RETURN_IF_ERROR(plan_engine_options(p, plan));
  CP_RETURN_IF_ERROR(plan_balance_scheduling(plan));
  plan->chat_template_file = p.option("chat-template").value_or("");
  plan->tokenizer_dir = p.option("tokenizer").value_or(plan->model_dir);
  return {};
}

}  // namespace cli
