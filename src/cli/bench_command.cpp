// `chunkpipe bench serve | latency | throughput`: vLLM's benchmark commands. `serve` drives any
// OpenAI-compatible server over HTTP (libcurl multi, one thread for all streams) and prints vLLM's
// summary and result JSON; `latency` and `throughput` drive the engine in-process.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench/dataset.h"
#include "bench/report.h"
#include "bench/serve_run.h"
#include "bench/summary.h"
#include "cli/activation_dtype.h"
#include "cli/arg_parser.h"
#include "cli/commands.h"
#include "cli/engine_sizing.h"
#include "cli/flag_limits.h"
#include "common/logging.h"
#include "common/timer.h"
#include "engine/engine_core.h"
#include "engine/uniproc_executor.h"
#include "httpclient/http_json.h"
#include "model/deepseek_v3.h"
#include "tokenizer/tokenizer.h"
#include "worker/model_runner.h"

namespace cli {
namespace {

using nlohmann::json;

std::vector<std::string> split_list(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, sep);) {
    if (!t.empty()) out.push_back(t);
  }
  return out;
}

int fail(const ArgParser& p, const std::string& cmd, const common::Status& st, bool usage) {
  std::fprintf(stderr, "%schunkpipe bench %s: error: %s\n", usage ? (p.usage() + "\n").c_str() : "",
               cmd.c_str(), st.message().c_str());
  return usage ? 2 : 1;
}

int run_bench_serve(int argc, char** argv) {
  ArgParser p("chunkpipe bench serve",
              "Benchmarks an OpenAI-compatible server (flags of `vllm bench serve`).");
  p.add_option("backend", "openai (completions) or openai-chat", "openai");
  p.add_option("base-url", "server URL, e.g. http://127.0.0.1:8000 (overrides --host/--port)");
  p.add_option("host", "server host", "127.0.0.1");
  p.add_option("port", "server port", "8000");
  p.add_option("endpoint", "API path (default /v1/completions or /v1/chat/completions)");
  p.add_option("model", "model name (default: the first id of /v1/models)");
  p.add_option("served-model-name", "name sent in requests (default: --model)");
  p.add_option("tokenizer",
               "tokenizer.json directory (default: the server's /tokenize and /detokenize)");
  p.add_option("dataset-name", "random, sharegpt or synthetic", "random");
  p.add_option("dataset-path", "ShareGPT JSON file, or the synthetic config JSON");
  p.add_option("num-prompts", "number of requests", "1000");
  p.add_option("random-input-len", "random dataset: input tokens", "1024");
  p.add_option("random-output-len", "random dataset: output tokens", "128");
  p.add_option("random-range-ratio", "random dataset: lengths uniform in [L(1-r), L(1+r)]", "0.0");
  p.add_option("random-prefix-len", "random dataset: shared prefix tokens", "0");
  p.add_option("input-len", "alias of --random-input-len");
  p.add_option("output-len", "alias of --random-output-len");
  p.add_option("sharegpt-output-len", "ShareGPT: fixed output length instead of the reply's");
  p.add_option("request-rate", "requests per second (Poisson / gamma arrivals), or inf", "inf");
  p.add_option("burstiness", "gamma shape of inter-arrival times (1.0 = Poisson)", "1.0");
  p.add_option("max-concurrency", "at most this many requests in flight");
  p.add_flag("ignore-eos", "send ignore_eos so every request generates its full output length");
  p.add_option("seed", "random seed", "0");
  p.add_option("percentile-metrics", "comma list of ttft,tpot,itl,e2el", "ttft,tpot,itl");
  p.add_option("metric-percentiles", "comma list of percentiles", "99");
  p.add_multi_option("goodput", "SLOs as KEY:VALUE in ms (ttft, tpot, e2el)");
  p.add_option("num-warmups", "warm-up requests before measuring", "0");
  p.add_flag("save-result", "write the result JSON");
  p.add_flag("save-detailed", "accepted: per-request arrays are always in the result JSON");
  p.add_option("result-dir", "directory of the result JSON", ".");
  p.add_option("result-filename", "file name of the result JSON");
  p.add_option("label", "label of the run (used in the default file name)");
  p.add_multi_option("metadata", "KEY=VALUE pairs stored in the result JSON");
  p.add_option("extra-body", "JSON object merged into every request body");
  p.add_multi_option("header", "extra HTTP headers KEY=VALUE");
  p.add_option("request-id-prefix", "prefix of the x-request-id header", "benchmark-serving");
  p.add_flag("disable-tqdm", "no progress bar");
  p.add_option("ready-check-timeout-sec",
               "seconds to wait for a first successful request (0: skip)", "0");
  p.add_option("temperature", "sampling temperature sent with each request");
  p.add_option("top-p", "top_p sent with each request");
  p.add_option("top-k", "top_k sent with each request");
  p.add_option("min-p", "min_p sent with each request");
  p.add_option("logprobs", "completions: logprobs per token requested with each request");
  p.add_flag("append-result", "append the result JSON as a line to an existing file");
  p.add_flag("trust-remote-code", "accepted; the tokenizer is chunkpipe's own");
  p.add_option("tokenizer-mode", "auto, slow or hf (chunkpipe's tokenizer.json reader)", "auto");
  p.add_flag("use-beam-search", "not supported (vLLM V1 serves no beam search either)");
  p.add_flag("profile", "not built: chunkpipe has no /start_profile");
  p.add_option("report", "also write a self-contained HTML report (plots) to this file");
  p.add_alias("-n", "num-prompts");
  if (auto st = p.parse(argc, argv, 3); !st.ok()) return fail(p, "serve", st, true);
  if (p.help_requested()) {
    std::printf("%s", p.usage().c_str());
    return 0;
  }
  const std::string backend = *p.option("backend");
  if (backend != "openai" && backend != "openai-chat" && backend != "vllm") {
    return fail(p, "serve",
                common::invalid_argument("argument --backend: invalid choice: '" + backend +
                                         "' (choose from 'openai', 'openai-chat', 'vllm')"),
                true);
  }
  if (p.flag("use-beam-search"))
    return fail(p, "serve",
                common::unimplemented("--use-beam-search: beam search is not served by chunkpipe"),
                false);
  if (p.flag("profile"))
    return fail(p, "serve",
                common::unimplemented("--profile: the torch profiler endpoints (/start_profile) "
                                      "are not built in chunkpipe"),
                false);
  if (const std::string mode = *p.option("tokenizer-mode");
      mode != "auto" && mode != "slow" && mode != "hf") {
    return fail(p, "serve",
                common::invalid_argument("argument --tokenizer-mode: '" + mode +
                                         "' is not built in chunkpipe (it reads tokenizer.json: "
                                         "'auto', 'slow', 'hf')"),
                true);
  }
  const bool chat = backend == "openai-chat";
  std::string base =
      p.option("base-url").value_or("http://" + *p.option("host") + ":" + *p.option("port"));
  while (!base.empty() && base.back() == '/') base.pop_back();
  const std::string endpoint =
      p.option("endpoint").value_or(chat ? "/v1/chat/completions" : "/v1/completions");
  std::vector<std::string> headers;
  if (const char* key = std::getenv("OPENAI_API_KEY"))
    headers.push_back(std::string("Authorization: Bearer ") + key);
  if (auto hs = p.option("header")) {
    for (const auto& kv : split_list(*hs, '\n')) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos)
        return fail(
            p, "serve",
            common::invalid_argument("argument --header: expected KEY=VALUE, got '" + kv + "'"),
            true);
      headers.push_back(kv.substr(0, eq) + ": " + kv.substr(eq + 1));
    }
  }
  if (auto md = p.option("metadata")) {
    for (const auto& kv : split_list(*md, '\n')) {
      if (kv.find('=') == std::string::npos)
        return fail(
            p, "serve",
            common::invalid_argument("argument --metadata: expected KEY=VALUE, got '" + kv + "'"),
            true);
    }
  }
  auto num_prompts = p.int_option("num-prompts", 1);
  auto seed = p.int_option("seed", 0);
  auto warmups = p.int_option("num-warmups", 0);
  auto rate_text = *p.option("request-rate");
  auto burstiness = p.double_option("burstiness");
  for (const auto* r : {&num_prompts, &seed, &warmups}) {
    if (!r->ok()) return fail(p, "serve", r->status(), true);
  }
  if (!burstiness.ok() || *burstiness <= 0)
    return fail(p, "serve",
                common::invalid_argument("argument --burstiness: must be a positive number"), true);
  double rate = -1;
  if (rate_text != "inf") {
    auto r = p.double_option("request-rate");
    if (!r.ok() || *r <= 0)
      return fail(
          p, "serve",
          common::invalid_argument("argument --request-rate: must be a positive number or inf"),
          true);
    rate = *r;
  }
  std::optional<int> max_concurrency;
  if (p.given("max-concurrency")) {
    auto c = p.int_option("max-concurrency", 1);
    if (!c.ok()) return fail(p, "serve", c.status(), true);
    max_concurrency = static_cast<int>(*c);
  }
  json extra_body = json::object();
  if (auto eb = p.option("extra-body")) {
    extra_body = json::parse(*eb, nullptr, false);
    if (extra_body.is_discarded() || !extra_body.is_object()) {
      return fail(p, "serve",
                  common::invalid_argument("argument --extra-body: invalid JSON object"), true);
    }
  }
  bench::SummaryConfig sc;
  sc.backend = backend;
  sc.endpoint_type = backend;
  sc.label = p.option("label").value_or("");
  sc.num_prompts = *num_prompts;
  sc.request_rate = rate;
  sc.burstiness = *burstiness;
  sc.max_concurrency = max_concurrency;
  sc.percentile_metrics = split_list(*p.option("percentile-metrics"), ',');
  for (const auto& m : sc.percentile_metrics) {
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el") {
      return fail(
          p, "serve",
          common::invalid_argument("argument --percentile-metrics: unknown metric '" + m + "'"),
          true);
    }
  }
  sc.metric_percentiles.clear();
  for (const auto& v : split_list(*p.option("metric-percentiles"), ',')) {
    common::Result<double> q = parse_float_value("metric-percentiles", v);
    if (!q.ok() || !(*q >= 0 && *q <= 100)) {
      return fail(p, "serve",
                  common::invalid_argument("argument --metric-percentiles: invalid value '" + v +
                                           "' (percentiles are numbers in [0, 100])"),
                  true);
    }
    sc.metric_percentiles.push_back(*q);
  }
  if (auto g = p.option("goodput")) {
    for (const auto& kv : split_list(*g, '\n')) {
      const size_t colon = kv.find(':');
      const std::string k = kv.substr(0, colon);
      common::Result<double> ms = colon == std::string::npos
                                      ? common::invalid_argument("no value")
                                      : parse_float_value("goodput", kv.substr(colon + 1));
      if ((k != "ttft" && k != "tpot" && k != "e2el") || !ms.ok() || !(*ms >= 0)) {
        return fail(p, "serve",
                    common::invalid_argument("argument --goodput: expected ttft:MS, tpot:MS or "
                                             "e2el:MS with MS a number of milliseconds >= 0, "
                                             "got '" +
                                             kv + "'"),
                    true);
      }
      sc.goodput_ms[k] = *ms;
    }
  }

  // Model name from the server unless given.
  std::string model = p.option("model").value_or("");
  if (model.empty()) {
    auto models = httpclient::http_json(base + "/v1/models", "", headers);
    if (!models.ok()) return fail(p, "serve", models.status(), false);
    if (!(*models)["data"].is_array() || (*models)["data"].empty()) {
      return fail(p, "serve", common::invalid_argument(base + "/v1/models lists no model"), false);
    }
    model = (*models)["data"][0]["id"].get<std::string>();
  }
  const std::string served_name = p.option("served-model-name").value_or(model);
  sc.model_id = model;
  sc.tokenizer_id = p.option("tokenizer").value_or(model);

  // Dataset.
  std::unique_ptr<bench::TokenizerAccess> tok;
  if (auto dir = p.option("tokenizer")) {
    auto t = bench::local_tokenizer(*dir);
    if (!t.ok()) return fail(p, "serve", t.status(), false);
    tok = std::move(t).value();
  } else {
    tok = bench::server_tokenizer(base, headers);
  }
  const std::string dataset = *p.option("dataset-name");
  common::Result<std::vector<bench::SampleRequest>> samples = common::invalid_argument("unset");
  if (dataset == "random") {
    if (p.given("dataset-path")) {
      return fail(p, "serve",
                  common::invalid_argument("--dataset-path is not used by the random dataset"),
                  true);
    }
    bench::RandomDatasetConfig rc;
    rc.num_prompts = *num_prompts;
    auto in =
        p.given("input-len") ? p.int_option("input-len", 1) : p.int_option("random-input-len", 1);
    auto out = p.given("output-len") ? p.int_option("output-len", 1)
                                     : p.int_option("random-output-len", 1);
    auto prefix = p.int_option("random-prefix-len", 0);
    auto ratio = p.double_option("random-range-ratio");
    if (!in.ok()) return fail(p, "serve", in.status(), true);
    if (!out.ok()) return fail(p, "serve", out.status(), true);
    if (!prefix.ok()) return fail(p, "serve", prefix.status(), true);
    if (!ratio.ok()) return fail(p, "serve", ratio.status(), true);
    rc.input_len = *in;
    rc.output_len = *out;
    rc.prefix_len = *prefix;
    rc.range_ratio = *ratio;
    rc.seed = static_cast<uint64_t>(*seed);
    samples = bench::random_dataset(rc, *tok);
  } else if (dataset == "sharegpt" || dataset == "synthetic") {
    if (!p.given("dataset-path"))
      return fail(p, "serve", common::invalid_argument("--dataset-path is required for " + dataset),
                  true);
    if (dataset == "sharegpt") {
      int64_t fixed = 0;
      if (p.given("sharegpt-output-len")) {
        auto v = p.int_option("sharegpt-output-len", 1);
        if (!v.ok()) return fail(p, "serve", v.status(), true);
        fixed = *v;
      }
      samples = bench::sharegpt_dataset(*p.option("dataset-path"), *num_prompts, fixed,
                                        static_cast<uint64_t>(*seed), *tok);
    } else {
      samples =
          bench::synthetic_dataset(*p.option("dataset-path"), static_cast<uint64_t>(*seed), *tok);
    }
  } else {
    return fail(p, "serve",
                common::invalid_argument("argument --dataset-name: invalid choice: '" + dataset +
                                         "' (choose from 'random', 'sharegpt', 'synthetic')"),
                true);
  }
  if (!samples.ok()) return fail(p, "serve", samples.status(), false);
  sc.num_prompts = static_cast<int64_t>(samples->size());

  bench::ServeRunOptions run;
  run.chat = chat;
  run.url = base + endpoint;
  run.headers = headers;
  run.model = served_name;
  run.extra_body = extra_body;
  run.ignore_eos = p.flag("ignore-eos");
  for (auto [k, out] : {std::pair{"temperature", &run.temperature}, std::pair{"top-p", &run.top_p},
                        std::pair{"min-p", &run.min_p}}) {
    if (!p.given(k)) continue;
    auto v = p.double_option(k);
    if (!v.ok()) return fail(p, "serve", v.status(), true);
    *out = *v;
  }
  if (p.given("logprobs")) {
    auto v = p.int_option("logprobs", 0);
    if (!v.ok()) return fail(p, "serve", v.status(), true);
    run.logprobs = static_cast<int>(*v);
  }
  if (p.given("top-k")) {
    auto v = p.int_option("top-k", -1);
    if (!v.ok()) return fail(p, "serve", v.status(), true);
    run.top_k = static_cast<int>(*v);
  }
  run.request_id_prefix = *p.option("request-id-prefix");
  run.request_rate = rate;
  run.burstiness = *burstiness;
  run.max_concurrency = max_concurrency;
  run.num_warmups = *warmups;
  {
    auto timeout = p.int_option("ready-check-timeout-sec", 0);
    if (!timeout.ok()) return fail(p, "serve", timeout.status(), true);
    run.ready_check_timeout_s = static_cast<double>(*timeout);
  }
  run.seed = static_cast<uint64_t>(*seed);
  run.progress = !p.flag("disable-tqdm") && isatty(STDERR_FILENO);
  bench::ServeRunResult ran = bench::run_serve_benchmark(*samples, run);
  if (ran.ready_check_error)
    return fail(p, "serve", common::unavailable(*ran.ready_check_error), false);
  auto& results = ran.results;
  const double duration = ran.duration_s;
  int printed = 0;
  for (size_t i = 0; i < results.size() && printed < 10; ++i) {
    if (!results[i].success) std::printf("Error %zu: %s\n", i, results[i].error.c_str()), ++printed;
  }
  const double client_cpu_ms = ran.client_cpu_ms_per_request;
  bench::Summary s = bench::summarize(results, duration, sc);
  s.result["client_cpu_ms_per_request"] = client_cpu_ms;
  std::printf("%s", s.text.c_str());
  std::printf("Client CPU time per request (ms):        %.3f\n", client_cpu_ms);
  if (auto report = p.option("report")) {
    std::ofstream f(*report);
    if (!f)
      return fail(p, "serve", common::invalid_argument("cannot write --report file " + *report),
                  false);
    f << bench::render_html_report(results, s, "chunkpipe bench serve: " + model);
    std::printf("Saved report to %s\n", report->c_str());
  }
  if (p.flag("save-result")) {
    if (auto md = p.option("metadata")) {
      for (const auto& kv : split_list(*md, '\n')) {  // each has an '=' (checked above)
        const size_t eq = kv.find('=');
        s.result[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
    }
    std::string name = p.option("result-filename").value_or("");
    if (name.empty()) {
      const std::string base_name = std::filesystem::path(model).filename().string();
      name = (sc.label.empty() ? backend : sc.label) + "-" +
             (rate < 0 ? std::string("inf") : std::to_string(rate)) + "qps" +
             (max_concurrency ? "-concurrency" + std::to_string(*max_concurrency) : "") + "-" +
             base_name + "-" + s.result["date"].get<std::string>() + ".json";
    }
    const std::filesystem::path dir = *p.option("result-dir");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    // As vLLM writes it: one JSON object, and with --append-result a newline before each one
    // a non-empty file gets.
    const bool append = p.flag("append-result");
    std::ofstream f(dir / name, append ? std::ios::app : std::ios::trunc);
    if (!f)
      return fail(p, "serve", common::invalid_argument("cannot write " + (dir / name).string()),
                  false);
    if (append && std::filesystem::file_size(dir / name, ec) > 0 && !ec) f << "\n";
    f << s.result.dump();
    std::printf("Saved result to %s\n", (dir / name).string().c_str());
  }
  return 0;
}

// In-process engine for `latency` and `throughput`.
struct LocalEngine {
  std::unique_ptr<model::DeepseekV3Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<engine::EngineCore> core;
};

void add_engine_flags(ArgParser& p) {
  p.add_positional("MODEL", "model directory");
  p.add_option("tokenizer", "tokenizer directory (default: MODEL)");
  p.add_option("max-num-batched-tokens", "token budget per step", "8192");
  p.add_option("max-num-seqs", "maximum sequences per step", "256");
  p.add_option("max-model-len", "context length", "4096");
  p.add_option("block-size", "KV cache block size", "128");
  p.add_option("kv-cache-memory", "KV cache bytes", std::to_string(int64_t{1} << 30));
  p.add_option("threads", "CPU threads",
               std::to_string(std::max(1u, std::thread::hardware_concurrency())));
  p.add_option("seed", "random seed", "0");
  add_dtype_option(p);
  add_kv_cache_dtype_option(p);
  p.add_option("output-json", "write the figures as JSON here");
}

common::Result<LocalEngine> start_engine(const ArgParser& p, kernels::ActivationPrecision precision,
                                         model::KvCacheDtype kv_dtype) {
  LocalEngine e;
  kernels::set_activation_precision(precision);  // process-wide, before the first forward
  CP_ASSIGN_OR_RETURN(e.model,
                      model::DeepseekV3Model::load(p.positional("MODEL"), {.load_mtp = false}));
  CP_ASSIGN_OR_RETURN(
      e.tok, tokenizer::Tokenizer::load(p.option("tokenizer").value_or(p.positional("MODEL"))));
  engine::EngineConfig c;
  // Sized as `serve` sizes an engine (cli/engine_sizing.h), from an explicit KV cache size.
  SizingInput in;
  in.max_position_embeddings = e.model->config().max_position_embeddings;
  CP_ASSIGN_OR_RETURN(in.max_model_len, p.int_option("max-model-len", 1));
  in.allow_long_max_model_len = true;  // a benchmark may ask for more than the checkpoint says
  CP_ASSIGN_OR_RETURN(in.max_num_batched_tokens, p.int_option("max-num-batched-tokens", 1));
  CP_ASSIGN_OR_RETURN(int64_t seqs, p.int_option("max-num-seqs", 1, kMaxIntFlag));
  in.max_num_seqs = static_cast<int32_t>(seqs);
  CP_ASSIGN_OR_RETURN(int64_t bs, p.int_option("block-size", 1, kMaxBlockSize));
  in.block_size = static_cast<int>(bs);
  c.bf16_kv_cache = kv_dtype == model::KvCacheDtype::kBf16;
  in.kv_bytes_per_block = worker::ModelRunner::kv_bytes_per_block(e.model->config(), in.block_size,
                                                                  false, false, kv_dtype);
  CP_ASSIGN_OR_RETURN(in.kv_cache_bytes, p.int_option("kv-cache-memory", 1));
  CP_ASSIGN_OR_RETURN(Sizing sizing, plan_sizing(in));
  c.scheduler.max_num_batched_tokens = sizing.max_num_batched_tokens;
  c.scheduler.max_num_seqs = in.max_num_seqs;
  c.scheduler.max_model_len = sizing.max_model_len;
  c.block_size = in.block_size;
  c.num_kv_blocks = sizing.num_kv_blocks;
  CP_ASSIGN_OR_RETURN(int64_t threads, p.int_option("threads", 1, kMaxThreads));
  c.num_threads = static_cast<int>(threads);
  CP_ASSIGN_OR_RETURN(int64_t seed, p.int_option("seed", 0));
  c.seed = static_cast<uint64_t>(seed);
  c.enable_prefix_caching = false;  // as vLLM's latency benchmark forces
  c.model_eos_token_id = static_cast<int32_t>(e.model->config().eos_token_id);
  c.model_vocab_size = e.model->config().vocab_size;
  e.core = std::make_unique<engine::EngineCore>(
      std::make_unique<engine::UniProcExecutor>(*e.model, engine::runner_options(c)), *e.tok, c);
  return e;
}

// Runs `prompts` to completion at once; returns seconds.
double run_batch(engine::EngineCore& core, const std::vector<std::vector<int32_t>>& prompts,
                 int64_t output_len, int64_t* output_tokens, const std::string& tag) {
  std::mutex mu;
  std::condition_variable cv;
  size_t finished = 0;
  int64_t produced = 0;
  const double t0 = common::now_seconds();
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::EngineRequest r;
    r.request_id = tag + "-" + std::to_string(i);
    r.prompt_token_ids = prompts[i];
    r.sampling.temperature = 1.0;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = static_cast<int32_t>(output_len);
    core.add_request(std::move(r), [&](const engine::RequestOutput& o) {
      if (!o.finished) return;
      std::lock_guard<std::mutex> lock(mu);
      produced += o.num_output_tokens;
      ++finished;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return finished == prompts.size(); });
  if (output_tokens) *output_tokens = produced;
  return common::now_seconds() - t0;
}

std::vector<std::vector<int32_t>> random_prompts(int64_t n, int64_t len, int32_t vocab,
                                                 uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> out(n, std::vector<int32_t>(len));
  for (auto& p : out) {
    for (auto& id : p) id = std::uniform_int_distribution<int32_t>(3, vocab - 1)(rng);
  }
  return out;
}

int run_bench_latency(int argc, char** argv) {
  ArgParser p(
      "chunkpipe bench latency",
      "Latency of one batch through the in-process engine (flags of `vllm bench latency`).");
  add_engine_flags(p);
  p.add_option("input-len", "prompt tokens", "32");
  p.add_option("output-len", "generated tokens", "128");
  p.add_option("batch-size", "requests per batch", "8");
  p.add_option("num-iters-warmup", "warm-up iterations", "10");
  p.add_option("num-iters", "measured iterations", "30");
  if (auto st = p.parse(argc, argv, 3); !st.ok()) return fail(p, "latency", st, true);
  if (p.help_requested()) {
    std::printf("%s", p.usage().c_str());
    return 0;
  }
  auto in = p.int_option("input-len", 1), out = p.int_option("output-len", 1),
       batch = p.int_option("batch-size", 1);
  auto warm = p.int_option("num-iters-warmup", 0), iters = p.int_option("num-iters", 1);
  for (const auto* r : {&in, &out, &batch, &warm, &iters}) {
    if (!r->ok()) return fail(p, "latency", r->status(), true);
  }
  auto precision = parse_dtype_option(p, p.positional("MODEL"));
  if (!precision.ok()) return fail(p, "latency", precision.status(), true);
  auto kv_dtype = parse_kv_cache_dtype_option(p);
  if (!kv_dtype.ok()) return fail(p, "latency", kv_dtype.status(), true);
  auto e = start_engine(p, *precision, *kv_dtype);
  if (!e.ok()) return fail(p, "latency", e.status(), false);
  const auto prompts = random_prompts(
      *batch, *in, static_cast<int32_t>(std::min<int64_t>(e->model->config().vocab_size, 128000)),
      0);
  for (int64_t i = 0; i < *warm; ++i)
    run_batch(*e->core, prompts, *out, nullptr, "warmup" + std::to_string(i));
  std::vector<double> latencies;
  for (int64_t i = 0; i < *iters; ++i) {
    latencies.push_back(run_batch(*e->core, prompts, *out, nullptr, "iter" + std::to_string(i)));
  }
  double mean = 0;
  for (double l : latencies) mean += l / static_cast<double>(latencies.size());
  double var = 0;
  for (double l : latencies) var += (l - mean) * (l - mean) / static_cast<double>(latencies.size());
  std::printf("Avg latency: %.6f seconds\n", mean);
  std::printf("Std latency: %.6f seconds\n", std::sqrt(var));
  json percentiles = json::object();
  for (int q : {10, 25, 50, 75, 90, 99}) {
    const double v = bench::percentile(latencies, q);
    std::printf("%d%% percentile latency: %.6f seconds\n", q, v);
    percentiles[std::to_string(q)] = v;
  }
  if (auto path = p.option("output-json")) {
    std::ofstream(*path) << json({{"avg_latency", mean},
                                  {"std_latency", std::sqrt(var)},
                                  {"latencies", latencies},
                                  {"percentiles", percentiles}})
                                .dump(2)
                         << "\n";
  }
  e->core->shutdown();
  return 0;
}

int run_bench_throughput(int argc, char** argv) {
  ArgParser p("chunkpipe bench throughput",
              "Offline throughput of the in-process engine (flags of `vllm bench throughput`).");
  add_engine_flags(p);
  p.add_option("input-len", "prompt tokens", "128");
  p.add_option("output-len", "generated tokens", "128");
  p.add_option("num-prompts", "number of requests", "64");
  if (auto st = p.parse(argc, argv, 3); !st.ok()) return fail(p, "throughput", st, true);
  if (p.help_requested()) {
    std::printf("%s", p.usage().c_str());
    return 0;
  }
  auto in = p.int_option("input-len", 1), out = p.int_option("output-len", 1),
       n = p.int_option("num-prompts", 1);
  for (const auto* r : {&in, &out, &n}) {
    if (!r->ok()) return fail(p, "throughput", r->status(), true);
  }
  auto precision = parse_dtype_option(p, p.positional("MODEL"));
  if (!precision.ok()) return fail(p, "throughput", precision.status(), true);
  auto kv_dtype = parse_kv_cache_dtype_option(p);
  if (!kv_dtype.ok()) return fail(p, "throughput", kv_dtype.status(), true);
  auto e = start_engine(p, *precision, *kv_dtype);
  if (!e.ok()) return fail(p, "throughput", e.status(), false);
  const auto prompts = random_prompts(
      *n, *in, static_cast<int32_t>(std::min<int64_t>(e->model->config().vocab_size, 128000)), 1);
  int64_t produced = 0;
  const double elapsed = run_batch(*e->core, prompts, *out, &produced, "tp");
  const int64_t prompt_tokens = *n * *in;
  std::printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n",
              *n / elapsed, (prompt_tokens + produced) / elapsed, produced / elapsed);
  std::printf("Total num prompt tokens:  %lld\n", static_cast<long long>(prompt_tokens));
  std::printf("Total num output tokens:  %lld\n", static_cast<long long>(produced));
  if (auto path = p.option("output-json")) {
    std::ofstream(*path) << json({{"elapsed_time", elapsed},
                                  {"num_requests", *n},
                                  {"total_num_tokens", prompt_tokens + produced},
                                  {"requests_per_second", *n / elapsed},
                                  {"tokens_per_second", (prompt_tokens + produced) / elapsed}})
                                .dump(2)
                         << "\n";
  }
  e->core->shutdown();
  return 0;
}

}  // namespace

int run_bench_command(int argc, char** argv) {
  const std::string sub = argc > 2 ? argv[2] : "";
  if (sub == "serve") return run_bench_serve(argc, argv);
  if (sub == "latency") return run_bench_latency(argc, argv);
  if (sub == "throughput") return run_bench_throughput(argc, argv);
  std::fprintf(
      stderr, "usage: chunkpipe bench {serve,latency,throughput} ...\nchunkpipe bench: error: %s\n",
      sub.empty() ? "a subcommand is required" : ("invalid choice: '" + sub + "'").c_str());
  return 2;
}

}  // namespace cli
