// `chunkpipe serve MODEL`: vLLM's `vllm serve` flags, the engine, and the OpenAI HTTP server.
// Flags whose feature is not built yet are errors that say so; flags with no meaning on a CPU
// are accepted with one log line saying what they map to. SIGTERM/SIGINT stop the server,
// abort what is in flight, and exit 0.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "api/generation_defaults.h"
#include "cli/activation_dtype.h"
#include "cli/arg_parser.h"
#include "cli/commands.h"
#include "cli/data_parallel.h"
#include "cli/engine_sizing.h"
#include "cli/speculative_config.h"
#include "common/check.h"
#include "common/logging.h"
#include "common/timer.h"
#include "dist/process.h"
#include "engine/dp_engine_client.h"
#include "engine/engine_core.h"
#include "engine/engine_link.h"
#include "engine/pipeline_executor.h"
#include "engine/uniproc_executor.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "model/deepseek_v3.h"
#include "model/quant_description.h"
#include "model/tensor_parallel.h"
#include "sched/profiling_chunk_config.h"
#include "server/api_server.h"
#include "server/http_server.h"
#include "server/stats_logger.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "transfer/kv_connector_factory.h"
#include "transfer/kv_transfer_config.h"
#include "worker/model_runner.h"
#include "worker/stage_launcher.h"

namespace cli {
namespace {

using nlohmann::json;

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
  p.add_option("max-num-batched-tokens",
               "token budget per step (default 2048 with chunked prefill)");
  p.add_option("block-size", "KV cache block size in tokens (multiple of 16)", "128");
  p.add_option("gpu-memory-utilization", "fraction of host memory for weights + KV cache", "0.9");
  p.add_option("kv-cache-memory", "KV cache size in bytes (overrides --gpu-memory-utilization)");
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
  p.add_option("threads", "CPU threads of the worker",
               std::to_string(std::max(1u, std::thread::hardware_concurrency())));
  p.add_option("tokenizer", "tokenizer directory (default: the model directory)");
  p.add_option("max-logprobs", "maximum logprobs / top_logprobs per token", "20");
  p.add_option("swap-space", "CPU swap space in GiB (no meaning on CPU)");
  add_dtype_option(p);
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
  p.add_flag("enable-log-requests", "per-request logs");
  p.add_flag("disable-log-stats", "no periodic stats logs");
  p.add_option("uvicorn-log-level", "HTTP log level", "info");
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
}

// --max-model-len also accepts vLLM's 1k / 2K / 1m suffixes.
common::Result<int64_t> max_model_len_value(const ArgParser& p) {
  std::string v = *p.option("max-model-len");
  int64_t mult = 1;
  if (!v.empty() && (v.back() == 'k' || v.back() == 'K' || v.back() == 'm' || v.back() == 'M')) {
    mult = v.back() == 'k' ? 1000 : v.back() == 'K' ? 1024 : v.back() == 'm' ? 1000000 : 1048576;
    v.pop_back();
  }
  int64_t out = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || ptr != v.data() + v.size() || out < 1) {
    return common::invalid_argument("argument --max-model-len: invalid int value: '" +
                                    *p.option("max-model-len") + "'");
  }
  return out * mult;
}

common::Result<json> json_value(const ArgParser& p, const std::string& flag) {
  json j = json::parse(*p.option(flag), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return common::invalid_argument("argument --" + flag + ": invalid JSON object: '" +
                                    *p.option(flag) + "'");
  }
  return j;
}

int64_t host_memory_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

int64_t checkpoint_bytes(const std::string& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") total += static_cast<int64_t>(e.file_size(ec));
  }
  return total;
}

}  // namespace

// Parses and validates the serve flags into configs. Returns (exit code, message) on error.
struct ServePlan {
  std::string model_dir;
  server::ServerConfig server;
  engine::EngineConfig engine;
  int64_t kv_cache_bytes = -1;
  double memory_utilization = 0.9;
  std::string chat_template_file;
  std::string tokenizer_dir;
  int pipeline_parallel_size = 1;
  int tensor_parallel_size = 1;         // processes per pipeline stage
  bool expert_parallel = false;         // --enable-expert-parallel with tensor_parallel_size > 1
  int lmhead_tensor_parallel_size = 0;  // additional_config.finegrained_tp_config
  std::vector<int> layer_partition;     // empty: even split
  std::optional<SpeculativeConfig> speculative;  // --speculative-config (MTP)
  bool lm_head_int8 = false;                     // additional_config.lm_head_int8
  bool bf16_activations = false;                 // --dtype bfloat16
  bool log_stats = true;                         // the periodic stats line (--disable-log-stats)
  worker::PipelineTopology topology;             // hosts of a multi-node pipeline
  bool headless = false;                         // this node runs stages only (node_rank > 0)
  std::string kv_transfer_config;                // --kv-transfer-config as given (empty: none)
  transfer::KvTransferConfig kv_transfer;
  int data_parallel_rank = 0;  // --data-parallel-rank (the pull connector's port offset)
  DataParallelPlan dp;
  std::vector<std::string> serve_args;  // "serve" and every argument, for engine processes
};

namespace {

transfer::ConnectorPlacement connector_placement(const ServePlan& plan) {
  transfer::ConnectorPlacement at;
  at.dp_rank = plan.data_parallel_rank;
  at.pp_size = plan.pipeline_parallel_size;
  at.tp_size = plan.tensor_parallel_size;
  at.block_size = plan.engine.block_size;
  return at;
}

common::Status plan_serve(const ArgParser& p, ServePlan* plan) {
  plan->model_dir = p.positional("MODEL");
  if (plan->model_dir.empty() && p.option("model")) plan->model_dir = *p.option("model");
  if (plan->model_dir.empty())
    return common::invalid_argument("the following arguments are required: MODEL");
  auto unbuilt = [](const std::string& what, const std::string& issue) {
    return common::unimplemented(what + " is not built yet in chunkpipe (" + issue + ")");
  };
  // CPP settings are validated first, so their upstream messages win over "not built yet".
  if (p.given("additional-config")) {
    CP_ASSIGN_OR_RETURN(json extra, json_value(p, "additional-config"));
    CP_ASSIGN_OR_RETURN(int64_t pp, p.int_option("pipeline-parallel-size", 1));
    int64_t batched = 2048;
    if (p.given("max-num-batched-tokens")) {
      CP_ASSIGN_OR_RETURN(batched, p.int_option("max-num-batched-tokens", 1));
    }
    std::vector<std::string> warnings;
    CP_ASSIGN_OR_RETURN(
        sched::ProfilingChunkConfig pcc,
        sched::parse_profiling_chunk_config(extra, static_cast<int>(pp), batched, &warnings));
    for (const std::string& w : warnings) LOG(WARNING) << w;
    // vllm-ascend reads the recompute scheduler's switch at the top level and under
    // scheduler_config; its role checks follow the --kv-transfer-config parse below.
    for (const json* where :
         {&extra, extra.contains("scheduler_config") && extra["scheduler_config"].is_object()
                      ? &extra["scheduler_config"]
                      : nullptr}) {
      if (where == nullptr || !where->contains("recompute_scheduler_enable")) continue;
      if (!(*where)["recompute_scheduler_enable"].is_boolean())
        return common::invalid_argument(
            "additional_config.recompute_scheduler_enable must be a boolean");
      plan->engine.scheduler.recompute_scheduler_enable |=
          (*where)["recompute_scheduler_enable"].get<bool>();
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
        return common::invalid_argument(
            "additional_config.finegrained_tp_config must be an object");
      for (const auto& [key, value] : f.items()) {
        if (!value.is_number_integer())
          return common::invalid_argument("additional_config.finegrained_tp_config." + key +
                                          " must be an integer");
        if (key == "lmhead_tensor_parallel_size") {
          plan->lmhead_tensor_parallel_size = value.get<int>();
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
      if (unused.contains("scheduler_config") && unused["scheduler_config"].is_object()) {
        unused["scheduler_config"].erase("recompute_scheduler_enable");
        if (unused["scheduler_config"].empty()) unused.erase("scheduler_config");
      }
      if (!unused.empty())
        LOG(INFO) << "--additional-config keys accepted and not used on CPU: " << unused.dump();
    }
  }
  {
    CP_ASSIGN_OR_RETURN(int64_t pp, p.int_option("pipeline-parallel-size", 1));
    plan->pipeline_parallel_size = static_cast<int>(pp);
    std::string partition = p.option("pp-layer-partition").value_or("");
    if (partition.empty() && std::getenv("VLLM_PP_LAYER_PARTITION"))
      partition = std::getenv("VLLM_PP_LAYER_PARTITION");
    std::stringstream ss(partition);
    for (std::string item; std::getline(ss, item, ',');) {
      try {
        plan->layer_partition.push_back(std::stoi(item));
      } catch (...) {
        return common::invalid_argument("argument --pp-layer-partition: invalid layer count '" +
                                        item + "'");
      }
    }
  }
  {
    CP_ASSIGN_OR_RETURN(int64_t tp, p.int_option("tensor-parallel-size", 1));
    if (tp > 64) return common::invalid_argument("--tensor-parallel-size must be at most 64");
    plan->tensor_parallel_size = static_cast<int>(tp);
    plan->expert_parallel = tp > 1 && p.flag("enable-expert-parallel");
    CP_RETURN_IF_ERROR(plan_data_parallel(p, plan->tensor_parallel_size,
                                          plan->pipeline_parallel_size,
                                          plan->lmhead_tensor_parallel_size, &plan->dp));
    if (plan->dp.rank >= 0) plan->data_parallel_rank = plan->dp.rank;
  }
  {
    auto& t = plan->topology;
    CP_ASSIGN_OR_RETURN(int64_t nnodes, p.int_option("nnodes", 1));
    CP_ASSIGN_OR_RETURN(int64_t node_rank, p.int_option("node-rank", 0));
    CP_ASSIGN_OR_RETURN(int64_t master_port, p.int_option("master-port", 1));
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
  if (p.given("speculative-config")) {
    CP_ASSIGN_OR_RETURN(plan->speculative,
                        parse_speculative_config(*p.option("speculative-config")));
  }
  if (p.flag("enable-expert-parallel") && plan->tensor_parallel_size == 1)
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
  if (p.given("async-scheduling"))
    LOG(INFO) << "--async-scheduling: the CPU engine schedules synchronously between steps";
  if (p.given("swap-space"))
    LOG(INFO) << "--swap-space has no meaning on CPU: the KV cache already lives in host memory";

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
    CP_ASSIGN_OR_RETURN(const kernels::ActivationPrecision precision, parse_dtype_option(p));
    plan->bf16_activations = precision == kernels::ActivationPrecision::kBf16;
    if (plan->bf16_activations) {
      LOG(INFO) << "--dtype bfloat16: activations are rounded to bf16 before every BF16-weight "
                   "linear layer (attention and norms stay float32)";
    }
  }

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
  if (auto rp = p.option("reasoning-parser")) {
    if (*rp != "deepseek_v3" && *rp != "deepseek_r1") {
      return common::invalid_argument("argument --reasoning-parser: invalid choice: '" + *rp +
                                      "' (choose from 'deepseek_r1', 'deepseek_v3')");
    }
    s.reasoning_parser = *rp;
  }
  CP_ASSIGN_OR_RETURN(int64_t max_logprobs, p.int_option("max-logprobs", 0));
  s.max_logprobs = static_cast<int>(max_logprobs);
  CP_ASSIGN_OR_RETURN(int64_t http_threads, p.int_option("http-threads", 1));
  s.http_threads = static_cast<int>(http_threads);
  CP_ASSIGN_OR_RETURN(int64_t worker_threads, p.int_option("http-worker-threads", 1));
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

  auto& e = plan->engine;
  CP_ASSIGN_OR_RETURN(int64_t seed, p.int_option("seed", 0));
  e.seed = static_cast<uint64_t>(seed);
  CP_ASSIGN_OR_RETURN(int64_t max_num_seqs, p.int_option("max-num-seqs", 1));
  e.scheduler.max_num_seqs = static_cast<int32_t>(max_num_seqs);
  CP_ASSIGN_OR_RETURN(int64_t block_size, p.int_option("block-size", 1));
  if (block_size % 16 != 0 && block_size != 1 && block_size != 8) {
    return common::invalid_argument(
        "argument --block-size: invalid choice: " + std::to_string(block_size) +
        " (choose from 1, 8, 16, 32, 64, 128, ...)");
  }
  e.block_size = static_cast<int>(block_size);
  e.enable_prefix_caching = !p.given("enable-prefix-caching") || p.flag("enable-prefix-caching");
  e.log_requests = p.flag("enable-log-requests") && !p.flag("disable-log-requests");
  e.trace_file = p.option("trace-file").value_or("");
  CP_ASSIGN_OR_RETURN(int64_t threads, p.int_option("threads", 1));
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
  try {
    plan->memory_utilization = std::stod(*p.option("gpu-memory-utilization"));
  } catch (...) {
    return common::invalid_argument("argument --gpu-memory-utilization: invalid float value: '" +
                                    *p.option("gpu-memory-utilization") + "'");
  }
  if (plan->memory_utilization <= 0 || plan->memory_utilization > 1) {
    return common::invalid_argument("--gpu-memory-utilization must be in (0, 1], got " +
                                    *p.option("gpu-memory-utilization"));
  }
  plan->chat_template_file = p.option("chat-template").value_or("");
  plan->tokenizer_dir = p.option("tokenizer").value_or(plan->model_dir);
  return {};
}

std::atomic<bool> g_stop_requested{false};
std::atomic<bool> g_engine_failed{false};
int g_signal_pipe[2] = {-1, -1};

// Async-signal-safe: records the signal and wakes the watcher thread. A handler (rather than
// sigwait) works even though OpenBLAS starts threads before main() could block signals.
extern "C" void on_stop_signal(int sig) {
  const char byte = static_cast<char>(sig);
  if (write(g_signal_pipe[1], &byte, 1) < 0) _exit(1);
}

worker::PipelineOptions pipeline_options(const ServePlan& plan) {
  worker::PipelineOptions o;
  o.model_dir = plan.model_dir;
  o.num_stages = plan.pipeline_parallel_size;
  o.layer_counts = plan.layer_partition;
  o.threads_per_stage = plan.engine.num_threads;
  o.num_blocks = plan.engine.num_kv_blocks;
  o.block_size = plan.engine.block_size;
  o.pin_stages = true;
  o.expanded_kv_cache = plan.engine.expanded_kv_cache;
  o.num_speculative_tokens = plan.engine.scheduler.num_lookahead_tokens;
  o.lm_head_int8 = plan.lm_head_int8;
  o.bf16_activations = plan.bf16_activations;
  o.topology = plan.topology;
  o.kv_transfer_config = plan.kv_transfer_config;
  o.kv_dp_rank = plan.data_parallel_rank;
  o.tensor_parallel_size = plan.tensor_parallel_size;
  o.expert_parallel = plan.expert_parallel;
  return o;
}

// A --headless node of a multi-node pipeline: starts this node's stages, which connect to
// node 0, and waits. Exits 0 once they all pass the shutdown message, 1 if one fails.
int run_headless_node(const ServePlan& plan) {
  const worker::PipelineOptions o = pipeline_options(plan);
  auto config = model::load_model_config(plan.model_dir);
  if (!config.ok()) {
    LOG(ERROR) << config.status().message();
    return 1;
  }
  auto specs = worker::stage_specs(o, *config);
  if (!specs.ok()) {
    LOG(ERROR) << specs.status().message();
    return 1;
  }
  worker::PipelineTopology topo = o.topology;
  topo.num_stages = o.num_stages;
  topo.tp_size = o.tensor_parallel_size;
  auto local = worker::launch_local_stages(*specs, topo, dist::self_binary());
  if (!local.ok()) {
    LOG(ERROR) << local.status().message();
    return 1;
  }
  std::string stages;
  for (int s : local->stages) stages += (stages.empty() ? "" : ", ") + std::to_string(s);
  LOG(INFO) << "Headless node " << topo.node_rank << " of " << topo.nnodes << ": pipeline stage(s) "
            << stages << ", linked to node 0 at " << topo.master_addr << ":" << topo.master_port;
  worker::StageMonitor monitor(*local);
  while (true) {
    pollfd pfd{g_signal_pipe[0], POLLIN, 0};
    if (poll(&pfd, 1, 50) > 0) {
      LOG(INFO) << "Stopping the headless node";
      monitor.kill_remaining();
      return 0;
    }
    if (auto failed = monitor.poll()) {
      LOG(ERROR) << *failed;
      local->close_all();
      monitor.kill_remaining();
      return 1;
    }
    if (monitor.all_exited()) {
      LOG(INFO) << "The pipeline shut down; headless node exiting";
      return 0;
    }
  }
}

// Serves the API over `engine` on `socket` (bound at start-up; bound here when absent) until a
// signal or an engine failure stops it, then runs `after_listen` (the engine's shutdown) before
// the signal watcher is joined. Returns whether the server could listen.
bool serve_api(const server::ServerConfig& config, std::optional<server::BoundSocket> socket,
               bool log_stats, engine::EngineClient& engine, const tokenizer::Tokenizer& tok,
               const tokenizer::ChatTemplate& chat_template,
               const std::function<void()>& after_listen) {
  // Thousands of connections, each holding a descriptor.
  if (auto st = server::raise_open_file_limit(); !st.ok()) LOG(WARNING) << st.message();
  server::ApiServer api(config, engine, tok, chat_template);
  std::thread signal_thread([&] {
    char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (!g_stop_requested.exchange(true)) {
      if (g_engine_failed) {
        LOG(ERROR) << "The engine failed: shutting down the API server";
      } else {
        LOG(INFO) << "Received signal " << int(sig) << ": shutting down";
      }
      api.stop();
    }
  });
  std::optional<server::StatsLogger> stats;
  if (log_stats) stats.emplace(engine, server::StatsLogger::interval_from_env());
  bool ok = socket.has_value();
  if (!socket) {
    auto bound = server::BoundSocket::bind(config.host, config.port);
    if (bound.ok()) {
      socket.emplace(std::move(bound).value());
      ok = true;
    } else {
      LOG(ERROR) << bound.status().message();
    }
  }
  if (ok) ok = api.listen(std::move(*socket));
  stats.reset();
  after_listen();
  if (!g_stop_requested.exchange(true)) {
    const char wake = 0;
    if (write(g_signal_pipe[1], &wake, 1) < 0) LOG(WARNING) << "cannot wake the signal thread";
  }
  signal_thread.join();
  return ok;
}

// Reaps local engine processes; the first call that sees one exit reports it. Thread-safe.
class EngineReaper {
 public:
  explicit EngineReaper(LocalEngines engines)
      : engines_(std::move(engines)), done_(engines_.pids.size()) {}
  // (rank, how) of each engine that exited since the last call.
  std::vector<std::pair<int, std::string>> poll() {
    std::vector<std::pair<int, std::string>> out;
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < engines_.pids.size(); ++i) {
      if (done_[i]) continue;
      if (auto how = dist::reap_if_exited(engines_.pids[i])) {
        done_[i] = true;
        out.emplace_back(engines_.ranks[i],
                         "its process (pid " + std::to_string(engines_.pids[i]) + ") " + *how);
      }
    }
    return out;
  }
  bool all_done() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::all_of(done_.begin(), done_.end(), [](bool d) { return d; });
  }
  // SIGTERM, up to `grace_s` to exit, then SIGKILL; reaps them all.
  void stop(double grace_s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < engines_.pids.size(); ++i)
        if (!done_[i]) kill(engines_.pids[i], SIGTERM);
    }
    const double deadline = common::now_seconds() + grace_s;
    while (!all_done() && common::now_seconds() < deadline) {
      poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < engines_.pids.size(); ++i) {
      if (done_[i]) continue;
      kill(engines_.pids[i], SIGKILL);
      waitpid(engines_.pids[i], nullptr, 0);
      done_[i] = true;
    }
  }

 private:
  LocalEngines engines_;
  std::mutex mu_;
  std::vector<bool> done_;
};

// A --headless data-parallel node: starts its engines, which connect to the head's rpc port,
// and waits. Exits once they have all exited (0 if each did so cleanly), or on a signal.
// --generation-config auto (the model's generation_config.json), vllm (none) or a directory
// holding one: the sampling defaults requests get, logged as vLLM logs them.
common::Status load_sampling_defaults(const ArgParser& p, const std::string& model_dir,
                                      api::SamplingDefaults* out) {
  const std::string choice = p.option("generation-config").value_or("auto");
  if (choice == "vllm") return common::Status::ok_status();
  const std::string path = (choice == "auto" ? model_dir : choice) + "/generation_config.json";
  std::ifstream in(path);
  if (!in) {
    if (choice == "auto") return common::Status::ok_status();  // a checkpoint without one
    return common::invalid_argument("--generation-config " + choice + ": cannot open " + path);
  }
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, false);
  if (config.is_discarded() || !config.is_object())
    return common::invalid_argument(path + ": not a JSON object");
  *out = api::sampling_defaults_from_generation_config(config);
  if (!out->empty()) {
    const std::string repr = api::sampling_defaults_repr(*out);
    LOG(INFO) << "Using default chat sampling params from model: " << repr;
    LOG(INFO) << "Using default completion sampling params from model: " << repr;
  }
  return common::Status::ok_status();
}

int run_data_parallel_headless(const ServePlan& plan) {
  const std::string head = plan.dp.address + ":" + std::to_string(plan.dp.rpc_port);
  auto engines = spawn_local_engines(plan.serve_args, plan.dp, head);
  if (!engines.ok()) {
    LOG(ERROR) << engines.status().message();
    return 1;
  }
  LOG(INFO) << "Headless data-parallel node: engines for ranks " << plan.dp.start_rank << "-"
            << plan.dp.start_rank + plan.dp.size_local - 1 << " of " << plan.dp.size
            << ", served by the API server at " << head;
  EngineReaper reaper(std::move(engines).value());
  bool failed = false;
  while (true) {
    pollfd pfd{g_signal_pipe[0], POLLIN, 0};
    if (poll(&pfd, 1, 50) > 0) {
      LOG(INFO) << "Stopping the headless node's engines";
      reaper.stop(5);
      return failed ? 1 : 0;
    }
    for (const auto& [rank, how] : reaper.poll()) {
      const bool clean = how.find("exited with status 0") != std::string::npos;
      failed |= !clean;
      if (clean) {
        LOG(INFO) << "Data-parallel engine " << rank << ": " << how;
      } else {
        LOG(ERROR) << "Data-parallel engine " << rank << ": " << how;
      }
    }
    if (reaper.all_done()) return failed ? 1 : 0;
  }
}

// The API server of an internal-LB data-parallel deployment: binds the rpc port, starts this
// node's engines, waits until every rank (local or --headless) is READY, then serves.
int run_data_parallel_front_end(ServePlan& plan, server::BoundSocket socket,
                                const tokenizer::Tokenizer& tok,
                                const tokenizer::ChatTemplate& chat_template) {
  engine::DpClientOptions o;
  o.dp_size = plan.dp.size;
  o.rpc_port = plan.dp.rpc_port;
  o.bind_host = data_parallel_bind_host(plan.dp);
  o.lockstep = plan.dp.lockstep;
  std::unique_ptr<dist::StoreServer> store;
  if (plan.dp.lockstep) {  // the ranks' DP group meets here
    auto started = dist::StoreServer::start(data_parallel_bind_host(plan.dp), 0);
    if (!started.ok()) {
      LOG(ERROR) << started.status().message();
      return 1;
    }
    store = std::move(started).value();
    o.welcome.store_host = plan.dp.address;
    o.welcome.store_port = store->port();
  }
  o.welcome.dp_size = plan.dp.size;
  o.on_fatal = [](const std::string&) {
    g_engine_failed = true;
    const char byte = 0;
    if (write(g_signal_pipe[1], &byte, 1) < 0) _exit(1);
  };
  auto client = engine::DpEngineClient::start(o);
  if (!client.ok()) {
    LOG(ERROR) << client.status().message();
    return 1;
  }
  engine::DpEngineClient& dp = **client;
  auto engines = spawn_local_engines(plan.serve_args, plan.dp,
                                     (o.bind_host == "*" ? std::string("127.0.0.1") : o.bind_host) +
                                         ":" + std::to_string(dp.port()));
  if (!engines.ok()) {
    LOG(ERROR) << engines.status().message();
    return 1;
  }
  LOG(INFO) << "Data parallel: " << plan.dp.size << " engines (" << plan.dp.size_local
            << " on this node), internal load balancing; rpc port " << dp.port()
            << (plan.dp.lockstep ? "; ranks in lock step" : "");
  EngineReaper reaper(std::move(engines).value());
  std::atomic<bool> reaping{true};
  std::thread reap_thread([&] {
    while (reaping) {
      for (const auto& [rank, how] : reaper.poll()) dp.engine_died(rank, how);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  auto finish = [&](int status) {
    dp.shutdown();
    reaper.stop(5);
    reaping = false;
    reap_thread.join();
    return status;
  };
  if (auto st = dp.wait_ready(600); !st.ok()) {
    LOG(ERROR) << st.message();
    return finish(1);
  }
  // The engines end before the API server is destroyed: their callbacks hold its sessions.
  const bool ok = serve_api(plan.server, std::move(socket), plan.log_stats, dp, tok, chat_template,
                            [&] { dp.shutdown(); });
  const int status = finish(ok && !g_engine_failed ? 0 : 1);
  LOG(INFO) << "Shutdown complete";
  return status;
}

}  // namespace

int run_serve_command(int argc, char** argv) {
  ArgParser p("chunkpipe serve",
              "Serves a DeepSeek-V3 checkpoint through the OpenAI-compatible API (vLLM's flags).");
  p.add_positional("MODEL", "model directory");
  add_serve_flags(p);
  auto usage_error = [&](const std::string& msg) {
    std::fprintf(stderr, "%s\nchunkpipe serve: error: %s\n", p.usage().c_str(), msg.c_str());
    return 2;
  };
  // The positional is optional when --model is given.
  if (auto st = p.parse(argc, argv, 2); !st.ok()) {
    if (st.message().rfind("the following arguments are required", 0) != 0 || !p.given("model"))
      return usage_error(st.message());
  }
  if (p.help_requested()) {
    std::printf("%s", p.usage().c_str());
    return 0;
  }
  ServePlan plan;
  plan.serve_args.push_back("serve");
  for (int i = 2; i < argc; ++i) plan.serve_args.push_back(argv[i]);
  if (auto st = plan_serve(p, &plan); !st.ok()) {
    if (st.code() == common::StatusCode::kUnimplemented) {
      std::fprintf(stderr, "chunkpipe serve: error: %s\n", st.message().c_str());
      return 2;
    }
    return usage_error(st.message());
  }
  // Process-wide, before any engine thread runs a forward (stage processes get it by flag).
  kernels::set_activation_precision(plan.bf16_activations ? kernels::ActivationPrecision::kBf16
                                                          : kernels::ActivationPrecision::kF32);
  {
    std::string args_line;
    for (const auto& [k, v] : p.given_values())
      args_line += (args_line.empty() ? "" : ", ") + ("'" + k + "': '" + v + "'");
    LOG(INFO) << "non-default args: {'model_tag': '" << plan.model_dir << "'"
              << (args_line.empty() ? "" : ", ") << args_line << "}";
  }

  // SIGINT/SIGTERM wake a watcher thread that stops the HTTP server.
  if (pipe(g_signal_pipe) != 0) {
    LOG(ERROR) << "pipe() failed";
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // The API port is taken before anything loads, as vLLM does: a port in use fails now.
  std::optional<server::BoundSocket> api_socket;
  if (!plan.headless && !plan.dp.engine_process()) {
    auto bound = server::BoundSocket::bind(plan.server.host, plan.server.port);
    if (!bound.ok()) {
      LOG(ERROR) << bound.status().message();
      return 1;
    }
    api_socket.emplace(std::move(bound).value());
  }

  const double t0 = common::now_seconds();
  // An internal-LB data-parallel front end (or a --headless DP node) loads no model: its
  // engines are processes of their own.
  const bool dp_front = plan.dp.active() && !plan.dp.external && !plan.dp.engine_process();
  std::unique_ptr<engine::EngineLink> link;
  auto fail_start = [&](const std::string& why) {
    LOG(ERROR) << why;
    if (link) link->report_failure(why);
    return 1;
  };
  DataParallelGroups dp_groups;
  if (plan.dp.engine_process()) {
    const size_t colon = plan.dp.engine_of.rfind(':');
    const int port =
        colon == std::string::npos ? 0 : std::atoi(plan.dp.engine_of.c_str() + colon + 1);
    auto connected =
        engine::EngineLink::connect(plan.dp.engine_of.substr(0, colon), port, plan.dp.rank, 600);
    if (!connected.ok()) return fail_start(connected.status().message());
    link = std::move(connected).value();
  }
  // The model's checks come before any rank waits for its peers.
  {
    auto config = model::load_model_config(plan.model_dir);
    if (!config.ok()) return fail_start(config.status().message());
    const model::TensorParallel tp{0, plan.tensor_parallel_size, plan.expert_parallel};
    if (auto st = model::validate_tensor_parallel(*config, tp); !st.ok())
      return fail_start(st.message());
    if (plan.dp.lockstep && plan.dp.expert_parallel) {
      if (auto st = model::validate_dp_experts(*config, {0, plan.dp.size}, tp); !st.ok())
        return fail_start(st.message());
    }
    if (auto st =
            model::validate_finegrained_tp(*config, plan.lmhead_tensor_parallel_size, plan.dp.size);
        !st.ok())
      return fail_start(st.message());
  }
  if (plan.dp.lockstep && !dp_front) {
    // Internal engines meet at the store the front end names; external ranks at rank 0's, on
    // --data-parallel-address:--data-parallel-rpc-port.
    const bool internal = plan.dp.engine_process();
    const std::string host = internal ? link->welcome().store_host : plan.dp.address;
    const int port = internal ? link->welcome().store_port : plan.dp.rpc_port;
    LOG(INFO) << "Data-parallel rank " << plan.dp.rank << " joining its group of " << plan.dp.size
              << " ranks at " << host << ":" << port << " (it waits for every rank)";
    auto groups = join_data_parallel_groups(plan.dp, host, port, !internal && plan.dp.rank == 0);
    if (!groups.ok()) return fail_start(groups.status().message());
    dp_groups = std::move(groups).value();
  }
  // One stage loads the whole model; a pipeline (or TP ranks) loads one shard per process.
  std::unique_ptr<model::DeepseekV3Model> whole_model;
  model::ModelConfig mc;
  const bool one_process =
      plan.pipeline_parallel_size == 1 && plan.tensor_parallel_size == 1 && !dp_front;
  if (one_process) {
    model::LoadOptions load{.load_mtp = plan.speculative.has_value()};
    load.lm_head_int8 = plan.lm_head_int8;
    load.w8a8_mix_static = plan.kv_transfer.kv_role == "kv_consumer";
    if (plan.dp.lockstep && plan.dp.expert_parallel) load.dp_experts = {plan.dp.rank, plan.dp.size};
    if (plan.dp.lockstep && plan.lmhead_tensor_parallel_size > 1)
      load.lmhead_tp = {plan.dp.rank % plan.lmhead_tensor_parallel_size,
                        plan.lmhead_tensor_parallel_size};
    auto model = model::DeepseekV3Model::load(plan.model_dir, load);
    if (!model.ok()) return fail_start(model.status().message());
    whole_model = std::move(model).value();
    mc = whole_model->config();
    if (plan.dp.lockstep) {
      whole_model->set_expert_group(dp_groups.dp.get());
      whole_model->set_lmhead_group(dp_groups.lmhead.get());
      plan.engine.dp_group = dp_groups.dp.get();
      const model::DataParallelExperts& ep = whole_model->dp_experts();
      LOG(INFO) << "Data-parallel rank " << plan.dp.rank << " of " << plan.dp.size
                << " in lock step over " << dp_groups.dp->backend() << ": "
                << (ep.active()
                        ? "experts " + std::to_string(ep.rank * mc.n_routed_experts / ep.size) +
                              "-" +
                              std::to_string((ep.rank + 1) * mc.n_routed_experts / ep.size - 1)
                        : std::string("every expert"))
                << (dp_groups.lmhead
                        ? ", lm_head group of " + std::to_string(plan.lmhead_tensor_parallel_size)
                        : std::string());
    }
  } else {
    auto config = model::load_model_config(plan.model_dir);
    if (!config.ok()) return fail_start(config.status().message());
    mc = *config;
  }
  if (plan.speculative) {
    auto warning = check_speculative_model(&*plan.speculative, mc);
    if (!warning.ok()) return fail_start(warning.status().message());
    if (!warning->empty()) LOG(WARNING) << *warning;
    plan.engine.scheduler.num_lookahead_tokens = plan.speculative->num_speculative_tokens;
    LOG(INFO) << "Speculative decoding: method=mtp num_speculative_tokens="
              << plan.speculative->num_speculative_tokens << " (drafts from the last "
              << (plan.pipeline_parallel_size > 1 ? "pipeline stage's" : "model's")
              << " MTP layers, verified in the same batch)";
  }
  if (plan.lmhead_tensor_parallel_size > 0)
    LOG(INFO) << "finegrained_tp_config enabled: lmhead_tensor_parallel_size="
              << plan.lmhead_tensor_parallel_size
              << (plan.lmhead_tensor_parallel_size > 1
                      ? " (the lm_head split over consecutive data-parallel ranks)"
                      : " (a group of one: the lm_head stays whole)");
  LOG(INFO) << "Resolved architecture: DeepseekV3ForCausalLM";
  auto tok = tokenizer::Tokenizer::load(plan.tokenizer_dir);
  if (!tok.ok()) {
    LOG(ERROR) << tok.status().message();
    return 1;
  }
  std::string template_source;
  if (!plan.chat_template_file.empty()) {
    std::ifstream in(plan.chat_template_file);
    if (!in) {
      LOG(ERROR) << "--chat-template " << plan.chat_template_file << ": cannot open";
      return 1;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    template_source = ss.str();
  } else {
    template_source = (*tok)->chat_template();
  }
  auto chat_template = tokenizer::ChatTemplate::create(template_source);
  if (!chat_template.ok()) {
    LOG(ERROR) << chat_template.status().message();
    return 1;
  }
  LOG(INFO) << "Chat template: "
            << ((*chat_template)->is_builtin()
                    ? "built-in DeepSeek-V3.1"
                    : "Jinja from " + (plan.chat_template_file.empty()
                                           ? plan.tokenizer_dir + "/tokenizer_config.json"
                                           : plan.chat_template_file));
  if (auto st = load_sampling_defaults(p, plan.model_dir, &plan.server.sampling_defaults);
      !st.ok()) {
    LOG(ERROR) << st.message();
    return 1;
  }

  // max_model_len, the token budget and the KV cache, with vLLM's defaults and validation.
  SizingInput sizing_in;
  sizing_in.max_position_embeddings = mc.max_position_embeddings;
  if (p.given("max-model-len")) {
    auto v = max_model_len_value(p);
    if (!v.ok()) return usage_error(v.status().message());
    sizing_in.max_model_len = *v;
  }
  sizing_in.allow_long_max_model_len = std::getenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != nullptr;
  if (p.given("enable-chunked-prefill"))
    sizing_in.enable_chunked_prefill = p.flag("enable-chunked-prefill");
  if (p.given("max-num-batched-tokens")) {
    auto v = p.int_option("max-num-batched-tokens", 1);
    if (!v.ok()) return usage_error(v.status().message());
    sizing_in.max_num_batched_tokens = *v;
  }
  sizing_in.max_num_seqs = plan.engine.scheduler.max_num_seqs;
  sizing_in.block_size = plan.engine.block_size;
  sizing_in.kv_bytes_per_block = worker::ModelRunner::kv_bytes_per_block(
      mc, plan.engine.block_size, plan.engine.expanded_kv_cache,
      plan.engine.scheduler.num_lookahead_tokens > 0);
  if (plan.kv_cache_bytes >= 0) sizing_in.kv_cache_bytes = plan.kv_cache_bytes;
  sizing_in.memory_utilization = plan.memory_utilization;
  sizing_in.host_memory_bytes = host_memory_bytes();
  sizing_in.weight_bytes = checkpoint_bytes(plan.model_dir);
  auto sizing = plan_sizing(sizing_in);
  if (!sizing.ok()) {
    LOG(ERROR) << sizing.status().message();
    return 1;
  }
  const int64_t max_model_len = sizing->max_model_len;
  plan.engine.scheduler.max_model_len = max_model_len;
  plan.engine.scheduler.max_num_batched_tokens = sizing->max_num_batched_tokens;
  plan.server.max_model_len = max_model_len;
  plan.server.model_vocab_size = mc.vocab_size;
  LOG(INFO) << "Using max model len " << max_model_len;
  if (sizing->chunked_prefill)
    LOG(INFO) << "Chunked prefill is enabled with max_num_batched_tokens="
              << sizing->max_num_batched_tokens << ".";
  const int64_t num_blocks = sizing->num_kv_blocks;
  plan.engine.num_kv_blocks = num_blocks;
  plan.engine.model_eos_token_id = static_cast<int32_t>(mc.eos_token_id);
  const int64_t kv_tokens = num_blocks * plan.engine.block_size;
  LOG(INFO) << "KV cache size: " << kv_tokens << " tokens (" << num_blocks << " blocks of "
            << plan.engine.block_size << ")";
  LOG(INFO) << "Maximum concurrency for " << max_model_len << " tokens per request: "
            << std::round(100.0 * double(kv_tokens) / double(max_model_len)) / 100.0 << "x";

  if (plan.headless && !plan.dp.active()) return run_headless_node(plan);
  if (dp_front && plan.headless) return run_data_parallel_headless(plan);
  if (dp_front) {
    CHECK(api_socket.has_value()) << "a data-parallel front end binds its API port";
    return run_data_parallel_front_end(plan, std::move(*api_socket), **tok, **chat_template);
  }
  // A failed engine (a pipeline stage died) stops the API server; the exit status is then 1.
  plan.engine.on_fatal = [](const std::string&) {
    g_engine_failed = true;
    const char byte = 0;
    if (write(g_signal_pipe[1], &byte, 1) < 0) _exit(1);
  };
  worker::RunnerOptions runner = engine::runner_options(plan.engine);
  if (!plan.kv_transfer_config.empty()) {
    auto sched_side =
        transfer::make_scheduler_connector(plan.kv_transfer, mc, connector_placement(plan));
    auto worker_side = transfer::make_worker_connector(plan.kv_transfer, connector_placement(plan),
                                                       /*pp_rank=*/0);
    if (!sched_side.ok() || !worker_side.ok()) {
      LOG(ERROR) << (sched_side.ok() ? worker_side.status() : sched_side.status()).message();
      return 1;
    }
    plan.engine.kv_connector = std::move(sched_side).value();
    runner.kv_connector = std::move(worker_side).value();
    LOG(INFO) << "KV connector: " << plan.kv_transfer.kv_connector << " ("
              << plan.kv_transfer.kv_role << ")";
  }
  std::unique_ptr<engine::EngineCore> engine_ptr;
  if (one_process) {
    auto executor = std::make_unique<engine::UniProcExecutor>(*whole_model, runner);
    if (auto st = executor->init_status(); !st.ok()) {
      LOG(ERROR) << st.message();
      return 1;
    }
    engine_ptr = std::make_unique<engine::EngineCore>(std::move(executor), **tok, plan.engine);
  } else {
    auto pipeline = engine::PipelineExecutor::create(pipeline_options(plan));
    if (!pipeline.ok()) {
      LOG(ERROR) << pipeline.status().message();
      return 1;
    }
    std::string ranges;
    for (const auto& [b, e] : (*pipeline)->layer_ranges())
      ranges += (ranges.empty() ? "" : ", ") + std::to_string(b) + "-" + std::to_string(e - 1);
    LOG(INFO) << "Model parallel: " << plan.pipeline_parallel_size << " pipeline stage(s) (layers "
              << ranges << ") x " << plan.tensor_parallel_size << " tensor-parallel rank(s)"
              << (plan.expert_parallel ? " with expert parallelism" : "") << ", "
              << plan.engine.num_threads << " thread(s) per rank";
    engine_ptr =
        std::make_unique<engine::EngineCore>(std::move(pipeline).value(), **tok, plan.engine);
  }
  engine::EngineCore& engine = *engine_ptr;
  LOG(INFO) << "init engine (load model, create kv cache) took " << common::now_seconds() - t0
            << " seconds";
  if (link) {  // an internal data-parallel engine: the front end serves the API
    LOG(INFO) << "Data-parallel engine " << plan.dp.rank << " serving the front end at "
              << plan.dp.engine_of;
    const int status = link->serve(engine, g_signal_pipe[0]);
    engine.shutdown();
    return status;
  }
  const bool ok = serve_api(plan.server, std::move(api_socket), plan.log_stats, engine, **tok,
                            **chat_template, [&] { engine.shutdown(); });
  LOG(INFO) << "Shutdown complete";
  return ok && !g_engine_failed ? 0 : 1;
}

}  // namespace cli
