// KV pull throughput of the pull connector's transport alone: a prefill-side process serves a
// KV cache of DeepSeek-V3's row width (PullSender: UCX + the ZeroMQ side channel) and a
// decode-side process pulls a prompt's blocks from it (PullReceiver), as a PD decoder does.
// Prints GB/s per pull size. Usage: kv_pull_bench [--tokens N] [--layers L] [--repeat R]
// [--block TOKENS] [--host IP] [--port P] [--serve | --pull] (default: both, forked). Set UCX_TLS
// to pick transports (e.g. UCX_TLS=tcp for the cross-host path on one machine).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "common/timer.h"
#include "model/kv_cache.h"
#include "transfer/pull_receiver.h"
#include "transfer/pull_sender.h"

namespace {

struct Args {
  int tokens = 4096, layers = 61, repeat = 3, port = 31900, block = 128;
  int64_t cache_blocks = 0;  // --cache-blocks: a cache this big (as a server has)
  std::string host = "127.0.0.1";
  bool serve = true, pull = true;
};

constexpr int64_t kRowDim = 512 + 64;  // kv_lora_rank + qk_rope_head_dim

int serve(const Args& a, int64_t num_blocks) {
  model::LatentKvCache cache(a.layers, 0, a.layers, num_blocks, a.block, kRowDim);
  const int64_t used = (a.tokens + a.block - 1) / a.block;  // written, as a prefill would
  for (int l = 0; l < a.layers; ++l)
    for (int64_t i = 0; i < used * a.block * kRowDim; ++i)
      cache.layer_f32(l)[i] = float(l + i % 97);
  transfer::PullSenderOptions o;
  o.engine_id = "bench";
  o.bind_host = a.host;
  o.port = a.port;
  auto sender = transfer::PullSender::start(o, &cache, 0, a.layers);
  if (!sender.ok()) {
    std::fprintf(stderr, "serve: %s\n", sender.status().message().c_str());
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::seconds(600));  // the puller kills us
  return 0;
}

int pull(const Args& a, int64_t num_blocks) {
  model::LatentKvCache cache(a.layers, 0, a.layers, num_blocks, a.block, kRowDim);
  cache.commit();  // as a decoder's pull connector does
  transfer::PullReceiver receiver({}, &cache, 0, a.layers);
  const int64_t blocks = (a.tokens + a.block - 1) / a.block;
  const double bytes = double(blocks) * a.layers * a.block * kRowDim * sizeof(float);
  for (int r = 0; r < 2 * a.repeat; ++r) {
    // First block by block (local ids reversed: no run coalesces), then one run per layer.
    const bool coalesced = r >= a.repeat;
    transfer::RecvTask t;
    t.req_id = "r" + std::to_string(r);
    t.remote.remote_engine_id = "bench";
    t.remote.remote_request_id = t.req_id;
    t.remote.remote_host = a.host;
    t.remote.remote_port = a.port;
    t.remote.remote_tp_size = t.remote.remote_pp_size = 1;
    for (int64_t b = 0; b < blocks; ++b) {
      t.remote_block_ids.push_back(static_cast<int32_t>(b));
      // Fresh local blocks for every pull (with --cache-blocks), as a decoder's new requests get.
      const int64_t base = a.cache_blocks > 0 ? (r * blocks) % (num_blocks - blocks) : 0;
      t.local_block_ids.push_back(static_cast<int32_t>(base + (coalesced ? b : blocks - 1 - b)));
    }
    const double t0 = common::now_seconds();
    receiver.enqueue({t});
    sched::KvTransferReport report;
    while (report.finished_recving.empty() && report.failed_recving.empty()) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      receiver.take_finished(&report);
    }
    const double s = common::now_seconds() - t0;
    if (!report.failed_recving.empty()) {
      std::printf("pull failed: %s\n", report.failed_recving[0].second.c_str());
      return 1;
    }
    std::printf("pull %d: %d tokens x %d layers = %.1f MB in %.1f ms: %.2f GB/s (%s)\n", r,
                a.tokens, a.layers, bytes / 1e6, s * 1e3, bytes / s / 1e9,
                coalesced ? "one read per layer" : "one read per block");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (f == "--tokens")
      a.tokens = std::atoi(next().c_str());
    else if (f == "--layers")
      a.layers = std::atoi(next().c_str());
    else if (f == "--repeat")
      a.repeat = std::atoi(next().c_str());
    else if (f == "--port")
      a.port = std::atoi(next().c_str());
    else if (f == "--block")
      a.block = std::atoi(next().c_str());
    else if (f == "--cache-blocks")
      a.cache_blocks = std::atoll(next().c_str());
    else if (f == "--host")
      a.host = next();
    else if (f == "--serve")
      a.pull = false;
    else if (f == "--pull")
      a.serve = false;
    else {
      std::fprintf(stderr, "unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  const char* tls = std::getenv("UCX_TLS");
  std::printf("UCX_TLS=%s, block %d tokens, row %lld floats\n", tls ? tls : "(default)", a.block,
              static_cast<long long>(kRowDim));
  const int64_t num_blocks =
      std::max<int64_t>((a.tokens + a.block - 1) / a.block + 1, a.cache_blocks);
  if (a.serve && !a.pull) return serve(a, num_blocks);
  if (a.pull && !a.serve) return pull(a, num_blocks);
  const pid_t child = fork();
  if (child == 0) _exit(serve(a, num_blocks));
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // registration of the cache
  const int rc = pull(a, num_blocks);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return rc;
}
