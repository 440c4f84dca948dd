// Tensor-parallel throughput side by side on this machine: TP=1 with two threads against TP=2
// with one thread per rank (and TP=2 with expert parallelism), on one checkpoint. Prefill of
// N tokens from an empty cache, then D single-token decode steps; tokens/s of each, and with
// expert parallelism the MoE layers' dispatch + combine time against their expert time.
// Ranks run as threads of this process, each with its own shard, cache, one-thread pool and
// the shared-memory group serve uses between rank processes. Prints the CPU and its flags.
// Usage: tp_bench MODEL_DIR [prefill_tokens=512] [decode_steps=32]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/thread_pool.h"
#include "common/timer.h"
#include "cpu_line.h"
#include "dist/group_factory.h"
#include "model/deepseek_v3.h"

namespace {

struct Figures {
  double prefill_tps = 0, decode_tps = 0;
  model::MoeTimes prefill_moe, moe;  // the prefill's, then the decode steps'
};

// One rank's run: prefill, then decode steps; the same calls on every rank of the group.
Figures run_rank(model::DeepseekV3Model& m, int threads, int prefill, int decode) {
  const model::ModelConfig& c = m.config();
  const int bs = 128;
  const int64_t total = prefill + decode;
  const int64_t nb = (total + bs - 1) / bs;
  model::LatentKvCache cache(c.num_total_layers(), 0, c.num_hidden_layers, nb, bs,
                             c.kv_cache_row_dim());
  std::vector<int32_t> table(static_cast<size_t>(nb)), ids(static_cast<size_t>(total));
  std::iota(table.begin(), table.end(), 0);
  for (int64_t i = 0; i < total; ++i) ids[size_t(i)] = int32_t((i * 7919 + 13) % c.vocab_size);
  common::ThreadPool pool(threads);
  std::vector<float> hidden, logits(size_t(c.vocab_size));
  auto forward = [&](int64_t start, int64_t n) {
    model::ForwardBatch batch;
    batch.sequences.push_back({std::span<const int32_t>(ids.data() + start, n), start, table});
    hidden.assign(size_t(n * c.hidden_size), 0.0f);
    CHECK(m.embed(batch, hidden.data()).ok()) << "forward failed";
    CHECK(m.run_layers(batch, 0, c.num_hidden_layers, hidden.data(), cache, pool).ok())
        << "forward failed";
    m.final_norm(hidden.data() + (n - 1) * c.hidden_size, 1, hidden.data());
    CHECK(m.compute_logits(hidden.data(), 1, logits.data(), pool).ok()) << "forward failed";
  };
  Figures f;
  double t0 = common::now_seconds();
  forward(0, prefill);
  f.prefill_tps = prefill / (common::now_seconds() - t0);
  const model::MoeTimes before = m.moe_times();
  f.prefill_moe = before;
  t0 = common::now_seconds();
  for (int i = 0; i < decode; ++i) forward(prefill + i, 1);
  f.decode_tps = decode / (common::now_seconds() - t0);
  f.moe = m.moe_times();
  f.moe.dispatch_s -= before.dispatch_s;
  f.moe.experts_s -= before.experts_s;
  f.moe.combine_s -= before.combine_s;
  f.moe.layers -= before.layers;
  return f;
}

Figures run_tp(const std::string& dir, int tp, bool ep, int prefill, int decode) {
  auto server = dist::StoreServer::start("127.0.0.1", 0);  // a free port
  const int port = server.ok() ? (*server)->port() : 0;
  CHECK(server.ok()) << server.status().message();
  std::vector<Figures> out(static_cast<size_t>(tp));
  std::vector<std::thread> ranks;
  for (int r = 0; r < tp; ++r) {
    ranks.emplace_back([&, r] {
      model::LoadOptions lo;
      lo.load_mtp = false;
      lo.tp = {r, tp, ep};
      auto m = model::DeepseekV3Model::load(dir, lo);
      CHECK(m.ok()) << m.status().message();
      dist::StoreClient store("127.0.0.1", port, 300);
      dist::GroupSpec spec("bench", r, tp);
      auto group = dist::make_process_group(store, spec);
      CHECK(group.ok()) << group.status().message();
      (*m)->set_process_group(group->get());
      CHECK((*group)->barrier().ok()) << "barrier";  // every shard is loaded
      out[size_t(r)] = run_rank(**m, 1, prefill, decode);
    });
  }
  for (auto& t : ranks) t.join();
  return out[0];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: tp_bench MODEL_DIR [prefill_tokens] [decode_steps]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int prefill = argc > 2 ? std::atoi(argv[2]) : 512;
  const int decode = argc > 3 ? std::atoi(argv[3]) : 32;
  bench::print_cpu_line();
  std::printf("model %s: prefill %d tokens, then %d decode steps\n", dir.c_str(), prefill, decode);
  std::printf("%-34s %14s %14s\n", "layout", "prefill tok/s", "decode tok/s");
  Figures one;
  {
    model::LoadOptions lo;
    lo.load_mtp = false;
    auto m = model::DeepseekV3Model::load(dir, lo);
    CHECK(m.ok()) << m.status().message();
    one = run_rank(**m, 2, prefill, decode);
  }
  std::printf("%-34s %14.1f %14.2f\n", "TP=1, 2 threads", one.prefill_tps, one.decode_tps);
  const Figures tp2 = run_tp(dir, 2, false, prefill, decode);
  std::printf("%-34s %14.1f %14.2f   (%.2fx / %.2fx of TP=1)\n", "TP=2, 1 thread per rank",
              tp2.prefill_tps, tp2.decode_tps, tp2.prefill_tps / one.prefill_tps,
              tp2.decode_tps / one.decode_tps);
  const Figures ep2 = run_tp(dir, 2, true, prefill, decode);
  std::printf("%-34s %14.1f %14.2f   (%.2fx / %.2fx of TP=1)\n", "TP=2 + EP, 1 thread per rank",
              ep2.prefill_tps, ep2.decode_tps, ep2.prefill_tps / one.prefill_tps,
              ep2.decode_tps / one.decode_tps);
  for (const auto& [what, t] :
       {std::make_pair("prefill", ep2.prefill_moe), std::make_pair("decode step", ep2.moe)}) {
    if (t.layers == 0) continue;
    const double n = double(t.layers);
    std::printf(
        "EP per MoE layer, %s (rank 0): dispatch %.3f ms + combine %.3f ms against experts "
        "%.3f ms\n",
        what, t.dispatch_s / n * 1e3, t.combine_s / n * 1e3, t.experts_s / n * 1e3);
  }
  return 0;
}
