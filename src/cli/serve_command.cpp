// `chunkpipe serve MODEL`: runs what serve_plan made of vLLM's flags. Loads the model (or starts
// the pipeline, TP or data-parallel engine processes), sizes the KV cache, and serves the OpenAI
// HTTP API. SIGTERM/SIGINT stop the server, abort what is in flight, and exit 0; an engine that
// fails makes it exit 1.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>

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
#include "cli/serve_plan.h"
#include "cli/speculative_config.h"
#include "common/check.h"
#include "common/logging.h"
#include "common/process_memory.h"
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
#include "model/memory_plan.h"
#include "model/tensor_parallel.h"
#include "model/weight_census.h"
#include "server/api_server.h"
#include "server/http_server.h"
#include "server/stats_logger.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "transfer/kv_connector_factory.h"
#include "transfer/kv_transfer_config.h"
#include "worker/model_runner.h"
#include "worker/numa_binding.h"
#include "worker/stage_launcher.h"
#include "worker/stage_plan.h"

namespace cli {
namespace {

int64_t host_memory_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

// The weights the load(s) on this host will hold, from the checkpoint's headers.
common::Result<model::WeightCensus> planned_weights(const std::string& model_dir,
                                                    const model::ModelConfig& config,
                                                    const model::LoadOptions& load) {
  CP_ASSIGN_OR_RETURN(auto ck, model::Checkpoint::open(model_dir));
  return model::planned_weight_census(*ck, config, load);
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
  o.numa_bind = plan.numa_bind;
  o.expanded_kv_cache = plan.engine.expanded_kv_cache;
  o.num_speculative_tokens = plan.engine.scheduler.num_lookahead_tokens;
  o.lm_head_int8 = plan.lm_head_int8;
  o.bf16_activations = plan.bf16_activations;
  o.bf16_kv_cache = plan.engine.bf16_kv_cache;
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

// --generation-config auto (the model's generation_config.json), vllm (none) or a directory
// holding one: the sampling defaults requests get, logged as vLLM logs them.
common::Status load_sampling_defaults(const ArgParser& p, const ServePlan& plan,
                                      api::SamplingDefaults* out) {
  const std::string choice = p.option("generation-config").value_or("auto");
  if (choice != "vllm") {
    const std::string path =
        (choice == "auto" ? plan.model_dir : choice) + "/generation_config.json";
    std::ifstream in(path);
    if (in) {
      const nlohmann::json config = nlohmann::json::parse(in, nullptr, false);
      if (config.is_discarded() || !config.is_object())
        return common::invalid_argument(path + ": not a JSON object");
      *out = api::sampling_defaults_from_generation_config(config);
    } else if (choice != "auto") {  // auto: a checkpoint without one
      return common::invalid_argument("--generation-config " + choice + ": cannot open " + path);
    }
  }
  // Checked by plan_serve: cannot fail here.
  (void)api::apply_generation_overrides(plan.generation_overrides, out);
  if (!out->empty()) {
    const std::string repr = api::sampling_defaults_repr(*out);
    LOG(INFO) << "Using default chat sampling params from model: " << repr;
    LOG(INFO) << "Using default completion sampling params from model: " << repr;
  }
  return common::Status::ok_status();
}

// A --headless data-parallel node: starts its engines, which connect to the head's rpc port,
// and waits. Exits once they have all exited (0 if each did so cleanly), or on a signal.
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
  std::string dp_store;  // "HOST:PORT" of the DP group's rendezvous store (lock step)
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
      if (auto st = model::validate_dp_experts(*config,
                                               {0, plan.dp.size * plan.tensor_parallel_size}, tp);
          !st.ok())
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
    dp_store = host + ":" + std::to_string(port);
  }
  // One stage loads the whole model; a pipeline (or TP ranks) loads one shard per process. The
  // memory plan comes first: a model that will not fit is refused before anything loads.
  std::unique_ptr<model::DeepseekV3Model> whole_model;
  model::ModelConfig mc;
  const bool one_process =
      plan.pipeline_parallel_size == 1 && plan.tensor_parallel_size == 1 && !dp_front;
  model::LoadOptions load{.load_mtp = plan.speculative.has_value()};
  if (one_process) {
    load.lm_head_int8 = plan.lm_head_int8;
    load.w8a8_mix_static = plan.kv_transfer.kv_role == "kv_consumer";
    if (plan.dp.lockstep && plan.dp.expert_parallel) load.dp_experts = {plan.dp.rank, plan.dp.size};
    if (plan.dp.lockstep && plan.lmhead_tensor_parallel_size > 1)
      load.lmhead_tp = {plan.dp.rank % plan.lmhead_tensor_parallel_size,
                        plan.lmhead_tensor_parallel_size};
  }
  {
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
  if (auto st = load_sampling_defaults(p, plan, &plan.server.sampling_defaults); !st.ok()) {
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
      plan.engine.scheduler.num_lookahead_tokens > 0,
      plan.engine.bf16_kv_cache ? model::KvCacheDtype::kBf16 : model::KvCacheDtype::kF32);
  if (plan.kv_cache_bytes >= 0) sizing_in.kv_cache_bytes = plan.kv_cache_bytes;
  sizing_in.num_blocks_override = plan.num_blocks_override;
  sizing_in.memory_utilization = plan.memory_utilization;
  sizing_in.host_memory_bytes = host_memory_bytes();
  // This process's whole model (one process), or every stage and rank of this host together.
  auto planned = planned_weights(
      plan.model_dir, mc, one_process ? load : model::LoadOptions{.load_mtp = load.load_mtp});
  if (!planned.ok()) return fail_start(planned.status().message());
  // Over --nnodes hosts, each holds about its share of the layers.
  sizing_in.weight_bytes = planned->total() / std::max(1, plan.topology.nnodes);
  auto budget = plan_token_budget(sizing_in);
  if (!budget.ok()) return fail_start(budget.status().message());
  model::ScratchInput scratch_in;
  scratch_in.num_batched_tokens = budget->max_num_batched_tokens;
  scratch_in.max_model_len = budget->max_model_len;
  scratch_in.max_num_seqs = sizing_in.max_num_seqs;
  scratch_in.threads = plan.engine.num_threads;
  sizing_in.scratch_bytes = model::forward_scratch_bytes(mc, scratch_in);
  LOG(INFO) << "Memory plan: " << model::census_line(*planned) << "; scratch "
            << model::gib_text(sizing_in.scratch_bytes)
            << " for max_num_batched_tokens=" << scratch_in.num_batched_tokens << " and "
            << scratch_in.max_model_len << "-token contexts; host memory "
            << model::gib_text(sizing_in.host_memory_bytes);
  auto sizing = plan_sizing(sizing_in);
  if (!sizing.ok()) return fail_start(sizing.status().message());
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
  plan.engine.model_vocab_size = mc.vocab_size;
  const int64_t kv_tokens = num_blocks * plan.engine.block_size;
  LOG(INFO) << "KV cache size: " << kv_tokens << " tokens (" << num_blocks << " blocks of "
            << plan.engine.block_size << ", "
            << model::gib_text(num_blocks * sizing_in.kv_bytes_per_block) << ")";
  LOG(INFO) << "Maximum concurrency for " << max_model_len << " tokens per request: "
            << std::round(100.0 * double(kv_tokens) / double(max_model_len)) / 100.0 << "x";

  if (one_process && plan.numa_bind) {  // before the load: the weights' pages land on the node
    // One engine process, or this host's data-parallel engines, one per node.
    const int ranks = plan.dp.active() ? std::max(1, plan.dp.size_local) : 1;
    const int rank = plan.dp.active() ? std::max(0, plan.dp.rank) % ranks : 0;
    auto bindings = worker::plan_numa_binding(worker::read_numa_topology(worker::allowed_cpus()),
                                              ranks, plan.engine.num_threads);
    if (!bindings.ok()) return fail_start(bindings.status().message());
    if (auto st = worker::apply_numa_binding((*bindings)[size_t(rank)]); !st.ok())
      return fail_start(st.message());
    LOG(INFO) << "Bound to NUMA " << worker::binding_text((*bindings)[size_t(rank)]);
  }
  if (one_process) {
    auto model = model::DeepseekV3Model::load(plan.model_dir, load);
    if (!model.ok()) return fail_start(model.status().message());
    whole_model = std::move(model).value();
    mc = whole_model->config();
    LOG(INFO) << "Model " << model::census_line(model::weight_census(whole_model->weights()))
              << "; resident memory " << model::gib_text(common::resident_bytes());
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
  }
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
    worker::PipelineOptions stages = pipeline_options(plan);
    if (plan.dp.lockstep) {  // experts over DP x TP (lock step needs PP 1: data_parallel.cpp)
      CHECK(plan.dp.expert_parallel) << "lock step with TP > 1 is planned for experts only";
      stages.experts_dp_rank = plan.dp.rank;
      stages.experts_dp_size = plan.dp.size;
      stages.experts_store = dp_store;
      plan.engine.dp_group = dp_groups.dp.get();
    }
    auto pipeline = engine::PipelineExecutor::create(stages);
    if (!pipeline.ok()) {
      LOG(ERROR) << pipeline.status().message();
      return 1;
    }
    std::string ranges;
    for (const auto& [b, e] : (*pipeline)->layer_ranges())
      ranges += (ranges.empty() ? "" : ", ") + std::to_string(b) + "-" + std::to_string(e - 1);
    LOG(INFO) << "Model parallel: " << plan.pipeline_parallel_size << " pipeline stage(s) (layers "
              << ranges << ") x " << plan.tensor_parallel_size << " tensor-parallel rank(s)"
              << (!plan.expert_parallel ? ""
                  : plan.dp.lockstep
                      ? " with the experts over all " +
                            std::to_string(plan.dp.size * plan.tensor_parallel_size) +
                            " ranks of DP x TP, in lock step over " + dp_groups.dp->backend()
                      : " with expert parallelism")
              << ", " << plan.engine.num_threads << " thread(s) per rank";
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
