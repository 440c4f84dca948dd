// `chunkpipe cpp-sim`: the CPP scale simulator. From a model's dimensions and a stage's compute
// rates (or a cost model fitted by a chunkpipe server here, read from its log) it predicts the
// TTFT of one prompt with fixed chunks, with vllm-ascend's chunking and with chunkpipe's plan,
// through the same planner and pipeline recurrence the scheduler uses, and prints each plan.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "cli/arg_parser.h"
#include "cli/commands.h"
#include "cli/flag_limits.h"
#include "model/config.h"
#include "sched/chunk_planner.h"
#include "sched/chunk_predictor.h"
#include "sched/cost_from_dims.h"

namespace cli {
namespace {

common::Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return common::not_found(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

sched::ModelDims dims_of(const model::ModelConfig& c) {
  sched::ModelDims d;
  d.hidden = c.hidden_size;
  d.layers = c.num_hidden_layers;
  d.dense_layers = c.n_routed_experts > 0 ? c.first_k_dense_replace : c.num_hidden_layers;
  d.heads = c.num_attention_heads;
  d.q_lora_rank = c.q_lora_rank.value_or(0);
  d.kv_lora_rank = c.kv_lora_rank;
  d.qk_nope = c.qk_nope_head_dim;
  d.qk_rope = c.qk_rope_head_dim;
  d.v_head = c.v_head_dim;
  d.routed_experts = c.n_routed_experts;
  d.experts_per_token = c.num_experts_per_tok;
  d.shared_experts = c.n_shared_experts;
  d.moe_inter = c.moe_intermediate_size;
  d.inter = c.intermediate_size;
  d.vocab = c.vocab_size;
  return d;
}

// One form's coefficients from "c=%f ms, token=%f us, history=%f us, pair=%f ns" after `name:`.
bool parse_form(const std::string& line, const std::string& name, sched::FormCoefficients* f) {
  const size_t at = line.find(name + ": c=");
  if (at == std::string::npos) return false;
  double c, token, history, pair;
  if (std::sscanf(line.c_str() + at + name.size(),
                  ": c=%lf ms, token=%lf us, history=%lf us, pair=%lf ns", &c, &token, &history,
                  &pair) != 4)
    return false;
  *f = {true, c, token * 1e-3, history * 1e-3, pair * 1e-6};
  return true;
}

// The last cost model a server logged ("[ProfilingChunk] Cost model..."), refined if it was.
common::Result<sched::ChunkCostModel> cost_model_from_log(const std::string& path) {
  CP_ASSIGN_OR_RETURN(std::string text, read_file(path));
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find("[ProfilingChunk] Cost model") != std::string::npos) last = line;
  sched::FormCoefficients expanded, absorbed;
  if (last.empty() || !parse_form(last, "expanded", &expanded))
    return common::invalid_argument(path + ": no \"[ProfilingChunk] Cost model\" line");
  parse_form(last, "absorbed", &absorbed);
  return sched::ChunkCostModel(expanded, absorbed);
}

sched::ChunkCostModel scaled(const sched::ChunkCostModel& m, double factor) {
  auto scale = [&](sched::FormCoefficients f) {
    f.per_token_ms *= factor;
    f.per_history_ms *= factor;
    f.per_pair_ms *= factor;
    return f;
  };
  return sched::ChunkCostModel(scale(m.expanded()),
                               m.absorbed().valid ? scale(m.absorbed()) : m.absorbed());
}

void print_plan(const char* name, const sched::ChunkPlan& plan, bool chunks) {
  std::printf("%-13s %3zu chunks  TTFT %10.1f ms  stage work %10.1f ms  bubble %5.1f%%\n", name,
              plan.chunks.size(), plan.ttft_ms, plan.work_ms, 100 * plan.bubble());
  if (!chunks) return;
  std::string line = "   ";
  for (const auto& c : plan.chunks) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), " %lld@%lld%s %.0fms", static_cast<long long>(c.tokens),
                  static_cast<long long>(c.history),
                  c.form == sched::AttentionForm::kAbsorbed ? "(abs)" : "", c.ms);
    if (line.size() + std::strlen(buf) > 100) {
      std::printf("%s\n", line.c_str());
      line = "   ";
    }
    line += buf;
  }
  std::printf("%s\n", line.c_str());
}

}  // namespace

int run_cpp_sim_command(int argc, char** argv) {
  ArgParser p("chunkpipe cpp-sim",
              "Predicts one prompt's TTFT on S pipeline stages with fixed chunks, vllm-ascend's "
              "CPP and chunkpipe's planned CPP, and prints the chunk plans. The cost model comes "
              "from --fit-log (a chunkpipe server's log) or from the model's dimensions and the "
              "rates given.");
  p.add_option("model-config", "config.json of the model (default: DeepSeek-V3's dimensions)");
  p.add_option("fit-log", "a chunkpipe serve log with a \"[ProfilingChunk] Cost model\" line");
  p.add_option("fit-layers",
               "decoder layers on the fitted server's slowest stage: the fit's per-token, "
               "per-history and per-pair costs are scaled to the --model-config's layers per "
               "stage (a slice's costs predict the whole model's)");
  p.add_option("prompt", "prompt tokens", "131072");
  p.add_option("chunk", "the base chunk B (--max-num-batched-tokens)", "32768");
  p.add_option("min-chunk", "profiling_chunk_config.min_chunk (default B/8)");
  p.add_option("stages", "pipeline stages", "2");
  p.add_option("tp", "tensor-parallel devices per stage", "1");
  p.add_option("linear-tflops", "effective TFLOP/s per device on projections and MLPs", "100");
  p.add_option("attention-tflops", "effective TFLOP/s per device on attention (default: linear)");
  p.add_option("overhead-ms", "per-forward cost of a stage, ms", "0");
  p.add_option("link-gbps", "stage-to-stage bandwidth, GB/s (0: free)", "0");
  p.add_option("min-predicted-gain",
               "planned CPP keeps fixed chunks unless it predicts this fraction less TTFT "
               "(profiling_chunk_config.min_predicted_gain)",
               "0.03");
  p.add_option("link-latency-us", "stage-to-stage latency per chunk, us", "0");
  p.add_option("activation-bytes", "bytes per activation value sent between stages", "2");
  p.add_option("page-size", "KV block size (vllm-ascend aligns chunks up to max(page, 64))", "128");
  p.add_option("align", "chunkpipe's plan rounds chunks down to this", "16");
  p.add_option("calibrate-fixed-ms",
               "scale the rates so that fixed chunks take this TTFT (0: as given)", "0");
  p.add_flag("plans", "print every chunk of each plan");
  auto fail = [&](const common::Status& st, int code) { return p.fail(st, code); };
  if (auto code = p.parse_or_exit(argc, argv, 2)) return *code;
  auto prompt = p.int_option("prompt", 1, kMaxIntFlag);
  auto chunk = p.int_option("chunk", 1, kMaxIntFlag);
  auto stages = p.int_option("stages", 1, kMaxRanks);
  auto tp = p.int_option("tp", 1, kMaxRanks);
  auto page = p.int_option("page-size", 1, kMaxBlockSize);
  auto align = p.int_option("align", 1, kMaxBlockSize);
  for (auto* r : {&prompt, &chunk, &stages, &tp, &page, &align})
    if (!r->ok()) return fail(r->status(), 2);
  int64_t min_chunk = *chunk / 8;
  if (p.given("min-chunk")) {
    auto m = p.int_option("min-chunk", 1, kMaxIntFlag);
    if (!m.ok()) return fail(m.status(), 2);
    min_chunk = *m;
  }
  std::map<std::string, double> num;
  for (const char* name : {"linear-tflops", "overhead-ms", "link-gbps", "link-latency-us",
                           "activation-bytes", "calibrate-fixed-ms", "min-predicted-gain"}) {
    auto v = p.double_option(name, 0);
    if (!v.ok()) return fail(v.status(), 2);
    num[name] = *v;
  }
  num["attention-tflops"] = num["linear-tflops"];
  if (p.given("attention-tflops")) {
    auto v = p.double_option("attention-tflops", 0);
    if (!v.ok()) return fail(v.status(), 2);
    num["attention-tflops"] = *v;
  }

  sched::ModelDims dims = sched::deepseek_v3_dims();
  if (auto path = p.option("model-config")) {
    auto text = read_file(*path);
    if (!text.ok()) return fail(text.status(), 1);
    auto config = model::parse_model_config(*text, *path);
    if (!config.ok()) return fail(config.status(), 1);
    dims = dims_of(*config);
  }
  sched::ChunkCostModel model;
  if (auto log = p.option("fit-log")) {
    auto m = cost_model_from_log(*log);
    if (!m.ok()) return fail(m.status(), 1);
    model = *m;
    if (p.given("fit-layers")) {
      auto fit_layers = p.int_option("fit-layers", 1, kMaxIntFlag);
      if (!fit_layers.ok()) return fail(fit_layers.status(), 2);
      // The slowest stage holds ceil(layers / stages) layers; the per-forward c stays.
      const int64_t per_stage = (dims.layers + *stages - 1) / *stages;
      model = scaled(model, double(per_stage) / double(*fit_layers));
      std::printf("fit of %lld layer(s) per stage scaled to %lld (%lld layers over %lld stages)\n",
                  static_cast<long long>(*fit_layers), static_cast<long long>(per_stage),
                  static_cast<long long>(dims.layers), static_cast<long long>(*stages));
    }
  } else {
    if (p.given("fit-layers"))
      return fail(common::invalid_argument("--fit-layers scales a --fit-log's costs"), 2);
    sched::StageRates rates;
    rates.num_stages = static_cast<int>(*stages);
    rates.tensor_parallel = static_cast<int>(*tp);
    rates.linear_tflops = num["linear-tflops"];
    rates.attention_tflops = num["attention-tflops"];
    rates.overhead_ms = num["overhead-ms"];
    if (!(rates.linear_tflops > 0 && rates.attention_tflops > 0))
      return fail(common::invalid_argument("the TFLOP/s rates must be positive"), 2);
    model = sched::cost_model_from_dims(dims, rates);
  }

  // The planner tries every chunk count up to prompt / min_chunk, each with a recurrence over
  // its chunks; beyond a few thousand chunks that is minutes of work for no plan anyone runs.
  constexpr int64_t kMostChunks = 4096;
  const int64_t smallest = std::max<int64_t>(1, std::min(min_chunk, *chunk));
  if ((*prompt + smallest - 1) / smallest > kMostChunks) {
    return fail(common::invalid_argument("--prompt " + std::to_string(*prompt) +
                                         " in chunks of --min-chunk " + std::to_string(smallest) +
                                         " makes more than " + std::to_string(kMostChunks) +
                                         " chunks; cpp-sim plans at most that many"),
                2);
  }
  sched::PlanOptions o;
  o.prompt_tokens = *prompt;
  o.max_chunk = *chunk;
  o.min_chunk = smallest;
  o.align = *align;
  o.num_stages = static_cast<int>(*stages);
  o.min_predicted_gain = num["min-predicted-gain"];
  if (!(o.min_predicted_gain >= 0 && o.min_predicted_gain < 1))
    return fail(common::invalid_argument("argument --min-predicted-gain: must be in [0, 1)"), 2);
  if (num["link-gbps"] > 0) {
    // Hidden states and residual, [tokens, hidden] each, per hop.
    o.link_ms_per_token =
        2.0 * static_cast<double>(dims.hidden) * num["activation-bytes"] / (num["link-gbps"] * 1e6);
  }
  o.link_ms = num["link-latency-us"] / 1e3;
  if (num["calibrate-fixed-ms"] > 0) {
    const double fixed = sched::fixed_plan(model, o).ttft_ms;
    const double overhead = sched::fixed_plan(scaled(model, 0), o).ttft_ms;  // c and link only
    if (fixed > overhead)
      model = scaled(model, (num["calibrate-fixed-ms"] - overhead) / (fixed - overhead));
    std::printf("rates scaled so that fixed chunks take %.1f ms\n", num["calibrate-fixed-ms"]);
  }

  std::printf("cost model (slowest stage, ms): %s\n", model.describe().c_str());
  std::printf(
      "prompt %lld tokens, B %lld, min_chunk %lld, %d stages, link %.4f ms + %.3g ms/token\n",
      static_cast<long long>(o.prompt_tokens), static_cast<long long>(o.max_chunk),
      static_cast<long long>(o.min_chunk), o.num_stages, o.link_ms, o.link_ms_per_token);
  const bool chunks = p.flag("plans");
  const auto fixed = sched::fixed_plan(model, o);
  const auto upstream = sched::upstream_plan(model, o, static_cast<int>(*page), 1.0);
  const auto planned = sched::best_plan(model, o);
  print_plan("fixed", fixed, chunks);
  print_plan("upstream CPP", upstream, chunks);
  print_plan("planned CPP", planned, chunks);
  std::printf("TTFT ratios: upstream/fixed %.3f, planned/fixed %.3f\n",
              upstream.ttft_ms / fixed.ttft_ms, planned.ttft_ms / fixed.ttft_ms);
  return 0;
}

}  // namespace cli
