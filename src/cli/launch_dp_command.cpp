// `chunkpipe launch-dp`: vllm-ascend's examples/external_online_dp/launch_online_dp.py, with
// its flags and semantics. For each local index i it runs
//   bash ./run_dp_template.sh VISIBLE PORT DP_SIZE DP_RANK DP_ADDRESS DP_RPC_PORT TP_SIZE
// (VISIBLE the local devices i*tp .. (i+1)*tp-1, PORT = --vllm-start-port + i, DP_RANK =
// --dp-rank-start + i), then waits for all of them. Unlike upstream, --dp-rpc-port has a
// working default, SIGINT/SIGTERM reach every rank (each script runs in its own process group,
// so its server gets the signal too), and the exit status says if one failed.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cli/arg_parser.h"
#include "cli/commands.h"
#include "cli/flag_limits.h"
#include "common/logging.h"
#include "dist/process.h"

namespace cli {
namespace {

std::atomic<int> g_launch_signal{0};
extern "C" void on_launch_signal(int sig) {
  g_launch_signal = sig;
}

}  // namespace

int run_launch_dp_command(int argc, char** argv) {
  ArgParser p("chunkpipe launch-dp",
              "Starts this node's data-parallel ranks, one server each, through "
              "./run_dp_template.sh (launch_online_dp.py's flags).");
  p.add_option("dp-size", "global data-parallel size of the instance");
  p.add_option("tp-size", "tensor-parallel size of each rank", "1");
  p.add_option("dp-size-local", "ranks on this node (default: --dp-size)", "-1");
  p.add_option("dp-rank-start", "first global rank on this node", "0");
  p.add_option("dp-address", "address of the node that holds rank 0");
  p.add_option("dp-rpc-port", "rank 0's data-parallel rpc port", "12345");
  p.add_option("vllm-start-port", "API port of local rank 0 (rank i: start + i)", "9000");
  p.add_option("template", "the per-rank script (chunkpipe extension)", "./run_dp_template.sh");
  auto usage_error = [&](const std::string& msg) {
    std::fprintf(stderr, "%s\nchunkpipe launch-dp: error: %s\n", p.usage().c_str(), msg.c_str());
    return 2;
  };
  if (auto st = p.parse(argc, argv, 2); !st.ok()) return usage_error(st.message());
  if (p.help_requested()) {
    std::printf("%s", p.usage().c_str());
    return 0;
  }
  if (!p.option("dp-size")) return usage_error("the following arguments are required: --dp-size");
  if (!p.option("dp-address"))
    return usage_error("the following arguments are required: --dp-address");
  auto dp_size = p.int_option("dp-size", 1, kMaxRanks);
  auto tp_size = p.int_option("tp-size", 1, kMaxRanks);
  auto local = p.int_option("dp-size-local", -1, kMaxRanks);
  auto start = p.int_option("dp-rank-start", 0, kMaxRanks);
  auto rpc_port = p.int_option("dp-rpc-port", 1, 65535);
  auto start_port = p.int_option("vllm-start-port", 1, 65535);
  for (const auto* r : {&dp_size, &tp_size, &local, &start, &rpc_port, &start_port})
    if (!r->ok()) return usage_error(r->status().message());
  const int64_t n_local = *local < 0 ? *dp_size : *local;
  if (*start + n_local > *dp_size)
    return usage_error("--dp-rank-start " + std::to_string(*start) + " + --dp-size-local " +
                       std::to_string(n_local) + " exceeds --dp-size " + std::to_string(*dp_size));
  if (*start_port + n_local - 1 > 65535)
    return usage_error("--vllm-start-port leaves ranks without a port");
  const std::string tmpl = *p.option("template");
  if (!std::filesystem::exists(tmpl)) {
    std::fprintf(stderr, "chunkpipe launch-dp: error: %s not found in the current directory\n",
                 tmpl.c_str());
    return 1;
  }
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  struct sigaction sa {};
  sa.sa_handler = on_launch_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::vector<pid_t> pids;
  std::vector<int64_t> ranks;
  for (int64_t i = 0; i < n_local; ++i) {
    std::string visible;
    for (int64_t d = i * *tp_size; d < (i + 1) * *tp_size; ++d)
      visible += (visible.empty() ? "" : ",") + std::to_string(d);
    const int64_t rank = *start + i, port = *start_port + i;
    const std::vector<std::string> args = {tmpl,
                                           visible,
                                           std::to_string(port),
                                           std::to_string(*dp_size),
                                           std::to_string(rank),
                                           *p.option("dp-address"),
                                           std::to_string(*rpc_port),
                                           std::to_string(*tp_size)};
    auto pid = dist::spawn_process("/bin/bash", args, {}, /*own_process_group=*/true);
    if (!pid.ok()) {
      LOG(ERROR) << pid.status().message();
      for (pid_t q : pids) kill(-q, SIGTERM);
      return 1;
    }
    LOG(INFO) << "data-parallel rank " << rank << ": port " << port << ", devices " << visible
              << " (pid " << *pid << ")";
    pids.push_back(*pid);
    ranks.push_back(rank);
  }
  // Every rank's processes come back here when their script ends before them (a subreaper),
  // so that launch-dp returns only after each server has exited.
  int failed = 0;
  bool forwarded = false;
  while (true) {
    if (const int sig = g_launch_signal.load(); sig != 0 && !forwarded) {
      LOG(INFO) << "signal " << sig << ": stopping every rank";
      for (pid_t q : pids) kill(-q, SIGTERM);  // each script and its server
      forwarded = true;
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == ECHILD) break;  // nothing left
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] != pid) continue;
      const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (clean) {
        LOG(INFO) << "data-parallel rank " << ranks[i] << ": its script exited with status 0";
      } else {
        LOG(ERROR) << "data-parallel rank " << ranks[i] << ": its script "
                   << (WIFEXITED(status)
                           ? "exited with status " + std::to_string(WEXITSTATUS(status))
                           : "was killed by signal " + std::to_string(WTERMSIG(status)));
        ++failed;
      }
    }
  }
  return failed > 0 && !forwarded ? 1 : 0;
}

}  // namespace cli
