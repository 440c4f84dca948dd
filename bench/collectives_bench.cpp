// All-reduce latency and bandwidth of the two collective backends, side by side on this
// machine: shared memory against gloo over loopback, 2 ranks (one thread each, as TP=2 runs
// one compute thread per rank), at the sizes TP all-reduces: one decode step's hidden state
// and one 512-token prefill chunk's, for the `small` model (hidden 2048) and DeepSeek-V3
// (hidden 7168). Prints the CPU and its flags first. Usage: collectives_bench [ranks] [iters]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/timer.h"
#include "cpu_line.h"
#include "dist/group_factory.h"

namespace {

struct Case {
  const char* what;
  size_t floats;
};

}  // namespace

int main(int argc, char** argv) {
  const int ranks = argc > 1 ? std::atoi(argv[1]) : 2;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 200;
  bench::print_cpu_line();
  std::printf("all_reduce (sum, f32), %d ranks, one thread each; median of %d calls\n", ranks,
              iters);
  std::printf("%-8s %-34s %12s %12s %12s\n", "backend", "payload", "bytes", "latency_us",
              "algbw_GB/s");
  const Case cases[] = {{"decode step, small (1 x 2048)", 2048},
                        {"decode step, DeepSeek-V3 (1 x 7168)", 7168},
                        {"prefill chunk, small (512 x 2048)", 512 * 2048},
                        {"prefill chunk, V3 (512 x 7168)", 512 * 7168}};
  for (const auto backend : {dist::GroupBackend::kShm, dist::GroupBackend::kGloo}) {
    auto server = dist::StoreServer::start("127.0.0.1", 0);  // a free port
    const int port = server.ok() ? (*server)->port() : 0;
    if (!server.ok()) {
      std::fprintf(stderr, "%s\n", server.status().message().c_str());
      return 1;
    }
    std::vector<std::vector<double>> median(std::size(cases));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        dist::StoreClient store("127.0.0.1", port, 30);
        dist::GroupSpec spec("bench", r, ranks);
        spec.backend = backend;
        auto group = dist::make_process_group(store, spec);
        if (!group.ok()) {
          std::fprintf(stderr, "%s\n", group.status().message().c_str());
          std::exit(1);
        }
        for (size_t c = 0; c < std::size(cases); ++c) {
          std::vector<float> data(cases[c].floats, 1.0f);
          const int n = cases[c].floats > 100000 ? std::max(10, iters / 10) : iters;
          std::vector<double> t;
          for (int i = 0; i < n + 5; ++i) {
            const double t0 = common::now_seconds();
            if (!(*group)->all_reduce(data.data(), data.size(), dist::ReduceOp::kSum).ok())
              std::exit(1);
            if (i >= 5) t.push_back(common::now_seconds() - t0);
          }
          std::sort(t.begin(), t.end());
          if (r == 0) median[c].push_back(t[t.size() / 2]);
        }
      });
    }
    for (auto& t : threads) t.join();
    for (size_t c = 0; c < std::size(cases); ++c) {
      const double s = median[c][0];
      const double bytes = double(cases[c].floats) * 4;
      std::printf("%-8s %-34s %12.0f %12.1f %12.2f\n",
                  backend == dist::GroupBackend::kShm ? "shm" : "gloo", cases[c].what, bytes,
                  s * 1e6, bytes / s / 1e9);
    }
  }
  return 0;
}
