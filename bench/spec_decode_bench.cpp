// MTP speculative decoding against plain decoding, side by side on one model in one run: decode
// tokens/s and TPOT of B concurrent greedy requests (prompts of P random ids, N output tokens),
// for each batch size B and k drafts per step. Two cases, since random weights give near-zero
// acceptance: "measured" runs the real MTP drafter (its acceptance is the honest zero point);
// "forced a" replays drafts from the plain run, each right with probability a
// (engine/draft_replay_executor.h: the drafter still runs, so its cost stays in every step).
// Every configuration must reproduce the plain run's tokens (checked). Prints the CPU first.
// Usage: spec_decode_bench MODEL_DIR [--threads 2] [--batches 1,8,32] [--ks 1,3]
//        [--alphas 0,0.6,0.8,0.9] [--tokens 48] [--prompt 32] [--rounds 1] [--tokenizer DIR]
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/timer.h"
#include "cpu_line.h"
#include "engine/draft_replay_executor.h"
#include "engine/engine_core.h"
#include "engine/uniproc_executor.h"
#include "kernels/cpu_features.h"
#include "model/deepseek_v3.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Options {
  std::string model_dir, tokenizer_dir;
  int threads = 2, tokens = 48, prompt = 32, rounds = 1;
  std::vector<int> batches = {1, 8, 32}, ks = {1, 3};
  std::vector<double> alphas = {0, 0.6, 0.8, 0.9};
};

template <typename T>
std::vector<T> list(const std::string& s) {
  std::vector<T> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    out.push_back(static_cast<T>(std::stod(item)));
  return out;
}

struct Run {
  double decode_tps = 0;  // output tokens after each request's first, per second
  double tpot_ms = 0;     // mean over requests of (finish - first token) / (tokens - 1)
  double acceptance = 0;  // accepted / drafted (speculative runs)
  double mean_accepted_length = 0;
  std::vector<std::vector<int32_t>> outputs;
};

Run run_batch(const model::DeepseekV3Model& model, const tokenizer::Tokenizer& tok,
              const Options& o, int batch, int k, double alpha,
              const std::vector<std::vector<int32_t>>* reference) {
  engine::EngineConfig c;
  c.scheduler = {/*max_num_batched_tokens=*/std::max(4096, batch * o.prompt),
                 /*max_num_seqs=*/std::max(batch, 1), /*max_model_len=*/4096};
  c.scheduler.num_lookahead_tokens = k;
  c.block_size = 16;
  c.num_kv_blocks = batch * ((o.prompt + o.tokens + 2 * k + 15) / 16 + 2) + 8;
  c.num_threads = o.threads;
  c.enable_prefix_caching = false;
  std::unique_ptr<engine::Executor> executor =
      std::make_unique<engine::UniProcExecutor>(model, engine::runner_options(c));
  std::vector<std::string> ids;
  for (int i = 0; i < batch; ++i) ids.push_back("b" + std::to_string(i));
  if (reference != nullptr && alpha >= 0) {
    std::unordered_map<std::string, std::vector<int32_t>> ref;
    for (int i = 0; i < batch; ++i) ref[ids[i]] = (*reference)[i];
    executor = std::make_unique<engine::DraftReplayExecutor>(std::move(executor), ref, alpha, 17);
  }
  engine::EngineCore core(std::move(executor), tok, c);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<double> first(batch, 0), last(batch, 0);
  Run r;
  r.outputs.resize(batch);
  int finished = 0;
  const int64_t vocab = model.config().vocab_size;
  for (int i = 0; i < batch; ++i) {
    engine::EngineRequest q;
    q.request_id = ids[i];
    for (int j = 0; j < o.prompt; ++j)
      q.prompt_token_ids.push_back(static_cast<int32_t>((i * 7919 + j * 104729 + 17) % vocab));
    q.sampling.temperature = 0;
    q.sampling.ignore_eos = true;
    q.sampling.max_tokens = o.tokens;
    core.add_request(std::move(q), [&, i](const engine::RequestOutput& out) {
      const double now = common::now_seconds();
      std::lock_guard<std::mutex> lock(mu);
      if (first[i] == 0) first[i] = now;
      last[i] = now;
      r.outputs[i].insert(r.outputs[i].end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (out.finished) {
        ++finished;
        cv.notify_all();
      }
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished == batch; });
  }
  const double start = *std::max_element(first.begin(), first.end());
  const double end = *std::max_element(last.begin(), last.end());
  double tpot = 0;
  for (int i = 0; i < batch; ++i) tpot += (last[i] - first[i]) / (o.tokens - 1);
  r.tpot_ms = 1000.0 * tpot / batch;
  r.decode_tps = double(batch) * (o.tokens - 1) / std::max(end - start, 1e-9);
  const engine::SpecDecodingCounters s = core.metrics().totals.spec_decoding;
  if (s.num_draft_tokens > 0) {
    r.acceptance = double(s.num_accepted_tokens) / double(s.num_draft_tokens);
    r.mean_accepted_length = 1.0 + double(s.num_accepted_tokens) / double(s.num_drafts);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: spec_decode_bench MODEL_DIR [--threads N] [--batches 1,8,32] "
                 "[--ks 1,3] [--alphas 0,0.6,0.8,0.9] [--tokens N] [--prompt P] "
                 "[--rounds R] [--tokenizer DIR]\n");
    return 2;
  }
  o.model_dir = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--threads")
      o.threads = std::stoi(v);
    else if (f == "--batches")
      o.batches = list<int>(v);
    else if (f == "--ks")
      o.ks = list<int>(v);
    else if (f == "--alphas")
      o.alphas = list<double>(v);
    else if (f == "--tokens")
      o.tokens = std::stoi(v);
    else if (f == "--prompt")
      o.prompt = std::stoi(v);
    else if (f == "--rounds")
      o.rounds = std::stoi(v);
    else if (f == "--tokenizer")
      o.tokenizer_dir = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  bench::print_cpu_line();
  std::printf("kernels: %s\n", kernels::kernel_paths_line().c_str());
  auto model = model::DeepseekV3Model::load(o.model_dir);
  auto tok = tokenizer::Tokenizer::load(o.tokenizer_dir.empty() ? o.model_dir : o.tokenizer_dir);
  if (!model.ok() || !tok.ok()) {
    std::fprintf(stderr, "error: %s\n",
                 (model.ok() ? tok.status() : model.status()).message().c_str());
    return 1;
  }
  const model::ModelConfig& mc = (*model)->config();
  std::printf(
      "model: %s (hidden %lld, %d layers, %d MTP layer(s), vocab %lld), %d threads, "
      "prompt %d, %d output tokens, greedy\n",
      o.model_dir.c_str(), static_cast<long long>(mc.hidden_size), mc.num_hidden_layers,
      mc.num_nextn_predict_layers, static_cast<long long>(mc.vocab_size), o.threads, o.prompt,
      o.tokens);
  // step ms: one step's time (TPOT × tokens per step), whose ratio to the plain step bounds
  // the gain: speedup <= mean length / (step ms / plain step ms).
  std::printf("%5s %3s %-10s %10s %10s %12s %9s %8s %8s\n", "batch", "k", "drafts", "acceptance",
              "mean len", "decode t/s", "TPOT ms", "step ms", "speedup");
  int mismatches = 0;
  for (int round = 0; round < o.rounds; ++round) {
    for (int batch : o.batches) {
      run_batch(**model, **tok, o, std::min(batch, 2), 0, -1, nullptr);  // warm-up
      const Run plain = run_batch(**model, **tok, o, batch, 0, -1, nullptr);
      std::printf("%5d %3d %-10s %10s %10s %12.2f %9.2f %8.2f %8s\n", batch, 0, "none", "-", "-",
                  plain.decode_tps, plain.tpot_ms, plain.tpot_ms, "1.00x");
      for (int k : o.ks) {
        std::vector<double> cases = {-1.0};  // the real drafter first
        cases.insert(cases.end(), o.alphas.begin(), o.alphas.end());
        for (double alpha : cases) {
          const Run s = run_batch(**model, **tok, o, batch, k, alpha, &plain.outputs);
          if (s.outputs != plain.outputs) ++mismatches;
          char label[32];
          if (alpha < 0)
            std::snprintf(label, sizeof(label), "measured");
          else
            std::snprintf(label, sizeof(label), "forced %.1f", alpha);
          std::printf("%5d %3d %-10s %10.3f %10.2f %12.2f %9.2f %8.2f %7.2fx%s\n", batch, k, label,
                      s.acceptance, s.mean_accepted_length, s.decode_tps, s.tpot_ms,
                      s.tpot_ms * std::max(1.0, s.mean_accepted_length),
                      s.decode_tps / plain.decode_tps,
                      s.outputs == plain.outputs ? "" : "  OUTPUTS DIFFER");
          std::fflush(stdout);
        }
      }
    }
  }
  if (mismatches > 0) std::printf("%d configurations changed the greedy tokens\n", mismatches);
  return mismatches == 0 ? 0 : 1;
}
