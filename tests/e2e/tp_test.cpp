// Tensor and expert parallelism through `chunkpipe serve`: ranks are processes of the binary,
// and greedy outputs over 8 prompts, streamed and not, equal TP=1's for TP=2, TP=2 with expert
// parallelism, TP=4 with expert parallelism (oversubscribed on purpose) and PP=2 x TP=2 with
// dynamic chunked prefill. A TP rank killed mid-stream fails the requests in flight with an
// error and the server exits 1, leaving no rank behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel_serving.h"
#include "server_process.h"
#include "test_model.h"

namespace {

using json = nlohmann::json;

// 4 heads and 8 experts: splits 2 and 4 ways.
const std::string& model_dir() {
  static const std::string dir = e2e::make_model("tp_model", 4, 4, 5);
  return dir;
}

// float32 activations: under bfloat16 (auto for this checkpoint) the all-reduce's summation
// order moves a partial sum across a bf16 rounding boundary now and then, as it does on GPUs,
// and a random-weight model's slim argmax margins turn such a flip into another token.
std::vector<std::string> flags(std::vector<std::string> extra) {
  extra.insert(extra.end(), {"--dtype", "float32"});
  return e2e::parallel_flags(std::move(extra));
}

// The greedy completion of prompt i, whole or assembled from the stream.
std::string complete(const e2e::ServerProcess& s, int i, bool stream) {
  return e2e::complete(s, e2e::greedy(i), stream);
}

TEST(TensorParallelServeTest, GreedyOutputsMatchOneRank) {
  const std::string cpp =
      R"({"scheduler_config": {"profiling_chunk_config": {"enabled": true, "min_chunk": 16}}})";
  struct Layout {
    const char* name;
    std::vector<std::string> extra;
  };
  const std::vector<Layout> layouts = {
      {"tp2", {"--tensor-parallel-size", "2"}},
      {"tp2_ep", {"--tensor-parallel-size", "2", "--enable-expert-parallel"}},
      {"tp4_ep", {"-tp", "4", "--enable-expert-parallel"}},
      {"pp2_tp2_cpp",
       {"--tensor-parallel-size", "2", "--pipeline-parallel-size", "2", "--additional-config",
        cpp}}};
  e2e::ServerProcess one(model_dir(), flags({}), "/tmp/chunkpipe_tp_one.log");
  ASSERT_TRUE(one.ready());
  std::vector<std::string> want;
  for (int i = 0; i < 8; ++i) want.push_back(complete(one, i, false));
  for (const Layout& l : layouts) {
    e2e::ServerProcess s(model_dir(), flags(l.extra),
                         std::string("/tmp/chunkpipe_tp_") + l.name + ".log");
    ASSERT_TRUE(s.ready()) << l.name;
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(complete(s, i, false), want[size_t(i)]) << l.name << " prompt " << i;
      EXPECT_EQ(complete(s, i, true), want[size_t(i)]) << l.name << " prompt " << i << " streamed";
    }
    EXPECT_EQ(s.stop(), 0) << l.name;
  }
}

TEST(TensorParallelServeTest, ARankKilledMidStreamFailsRequestsAndTheServerExitsOne) {
  e2e::ServerProcess s(model_dir(),
                       flags({"--tensor-parallel-size", "2", "--max-model-len", "8192",
                              "--kv-cache-memory", "64000000"}),
                       "/tmp/chunkpipe_tp_death.log");
  ASSERT_TRUE(s.ready());
  const std::vector<pid_t> ranks = e2e::child_processes(s.pid(), "pp-stage");
  ASSERT_EQ(ranks.size(), 2u) << "two rank processes under the server";
  const std::vector<pid_t> rank1 = e2e::child_processes(s.pid(), "--tp-rank 1 ");
  ASSERT_EQ(rank1.size(), 1u);
  e2e::BackgroundStream streaming(s, "/v1/completions",
                                  json{{"prompt", "stream until a rank dies"},
                                       {"max_tokens", 8000},
                                       {"ignore_eos", true},
                                       {"stream", true}}
                                      .dump());
  ASSERT_TRUE(streaming.wait_chunks(4, 6000)) << "the stream did not start";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(rank1[0], SIGKILL), 0);
  streaming.join();
  const std::string body = streaming.body();
  EXPECT_NE(body.find("EngineDeadError"), std::string::npos) << body.substr(0, 300);
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(s.wait_exit(20), 1) << "the server must exit 1 after losing a rank";
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 10.0) << "nothing may hang in a collective";
  std::printf("    TP rank 1 killed: the stream failed and the server exited in %.1f s\n", seconds);
  EXPECT_NE(kill(ranks[0], 0), 0) << "rank 0 must not outlive the server";
}

}  // namespace
