// Ring wiring, stage process start, and the pp-stage command line.
#include "worker/stage_launcher.h"

#include <sys/wait.h>

#include <algorithm>
#include <csignal>
#include <thread>

#include "dist/process.h"
#include "worker/numa_binding.h"
#include "worker/stage_plan.h"

namespace worker {
namespace {

constexpr size_t kPipeBytes = 16 << 20;  // the receiver drains it into memory, so it can be small

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

}  // namespace

common::Status validate_topology(const PipelineTopology& t) {
  if (t.nnodes < 1) return common::invalid_argument("--nnodes must be at least 1");
  if (t.node_rank < 0 || t.node_rank >= t.nnodes) {
    return common::invalid_argument("--node-rank " + std::to_string(t.node_rank) +
                                    " is outside [0, --nnodes " + std::to_string(t.nnodes) + ")");
  }
  if (t.nnodes > 2) {
    return common::unimplemented(
        "pipeline parallel over more than 2 nodes is not built yet in chunkpipe (every TCP link "
        "is bound on node 0)");
  }
  const int world = t.num_stages * t.tp_size;
  if (world % t.nnodes != 0) {
    return common::invalid_argument(
        "--pipeline-parallel-size " + std::to_string(t.num_stages) +
        (t.tp_size > 1 ? " x --tensor-parallel-size " + std::to_string(t.tp_size) : "") +
        " is not a multiple of --nnodes " + std::to_string(t.nnodes));
  }
  if (t.nnodes > 1 && (t.master_port <= 0 || store_port(t) > 65535))
    return common::invalid_argument("--master-port " + std::to_string(t.master_port) +
                                    " is invalid");
  return {};
}

int node_of_rank(const PipelineTopology& t, int stage, int tp_rank) {
  return (stage * t.tp_size + tp_rank) / (t.num_stages * t.tp_size / t.nnodes);
}

int node_of_stage(const PipelineTopology& t, int stage) {
  return node_of_rank(t, stage, 0);
}

int store_port(const PipelineTopology& t) {
  return t.master_port + t.num_stages + 1;  // after the ring's links
}

void LocalStages::close_all() {
  for (auto& p : pipes) p.close();
  if (driver_send) driver_send->close();
  if (driver_recv) driver_recv->close();
}

common::Result<LocalStages> launch_local_stages(const std::vector<StageSpec>& specs,
                                                const PipelineTopology& topo,
                                                const std::string& worker_binary) {
  CP_RETURN_IF_ERROR(validate_topology(topo));
  const int n = topo.num_stages;
  // Link i carries messages into stage i (i < n) or, for i == n, from the last stage back to
  // the engine. The engine lives on node 0.
  auto node_of_end = [&](int stage_or_driver) {
    return stage_or_driver == kDriverPeer ? 0 : node_of_stage(topo, stage_or_driver);
  };
  LocalStages out;
  std::vector<std::string> recv_spec(n), send_spec(n);
  std::vector<std::vector<int>> child_fds(n);
  for (int i = 0; i <= n; ++i) {
    const int sender = i == 0 ? kDriverPeer : i - 1, receiver = i == n ? kDriverPeer : i;
    const int sender_node = node_of_end(sender), receiver_node = node_of_end(receiver);
    const bool sender_here = sender_node == topo.node_rank,
               receiver_here = receiver_node == topo.node_rank;
    if (!sender_here && !receiver_here) continue;
    const std::string what = "pipeline link " + std::to_string(i);
    if (sender_node == receiver_node) {
      CP_ASSIGN_OR_RETURN(dist::ShmPipe pipe, dist::ShmPipe::create(kPipeBytes));
      const std::string spec = "shm:" + std::to_string(pipe.fd());
      if (sender != kDriverPeer) {
        send_spec[sender] = spec;
        child_fds[sender].push_back(pipe.fd());
      }
      if (receiver != kDriverPeer) {
        recv_spec[receiver] = spec;
        child_fds[receiver].push_back(pipe.fd());
      }
      if (sender == kDriverPeer) {
        CP_ASSIGN_OR_RETURN(dist::ShmPipe mine, dist::ShmPipe::attach(dup(pipe.fd())));
        out.driver_send = dist::make_shm_link(std::move(mine));
      } else if (receiver == kDriverPeer) {
        CP_ASSIGN_OR_RETURN(dist::ShmPipe mine, dist::ShmPipe::attach(dup(pipe.fd())));
        out.driver_recv = dist::make_shm_link(std::move(mine));
      }
      out.pipes.push_back(std::move(pipe));
      continue;
    }
    const std::string endpoint =
        "tcp://" + topo.master_addr + ":" + std::to_string(topo.master_port + i);
    const bool bind_here = topo.node_rank == 0;
    const std::string spec = (bind_here ? "tcp-bind:" : "tcp-connect:") + endpoint;
    if (sender_here) {
      if (sender == kDriverPeer) {
        CP_ASSIGN_OR_RETURN(out.driver_send, open_link(spec, /*sending=*/true, what));
      } else {
        send_spec[sender] = spec;
      }
    } else {
      if (receiver == kDriverPeer) {
        CP_ASSIGN_OR_RETURN(out.driver_recv, open_link(spec, /*sending=*/false, what));
      } else {
        recv_spec[receiver] = spec;
      }
    }
  }
  // Tensor parallelism: the stages' ranks meet in a rendezvous store. On one host this node
  // serves it on a loopback port the kernel picks (every rank is a child of this process);
  // across hosts node 0 serves it on store_port() and the others dial --master-addr.
  const int tp = topo.tp_size;
  std::string store;
  if (tp > 1) {
    if (topo.nnodes == 1) {
      CP_ASSIGN_OR_RETURN(out.store, dist::StoreServer::start("127.0.0.1", 0));
      store = "127.0.0.1:" + std::to_string(out.store->port());
    } else {
      if (topo.node_rank == 0) {
        CP_ASSIGN_OR_RETURN(out.store, dist::StoreServer::start("*", store_port(topo)));
      }
      store = topo.master_addr + ":" + std::to_string(store_port(topo));
    }
  }
  const std::vector<int> cpus = allowed_cpus();
  const int ncpu = static_cast<int>(cpus.size());
  const int ranks_per_node = n * tp / topo.nnodes;
  // --numa-bind: the node's k-th rank on node k / (ranks per NUMA node), on its own cores.
  std::vector<NumaBinding> numa;
  if (n > 0 && specs[0].numa_node >= 0) {
    CP_ASSIGN_OR_RETURN(numa, plan_numa_binding(read_numa_topology(cpus), ranks_per_node,
                                                std::max(1, specs[0].threads)));
  }
  for (int s = 0; s < n; ++s) {
    for (int r = 0; r < tp; ++r) {
      if (node_of_rank(topo, s, r) != topo.node_rank) continue;
      StageSpec spec = specs[s];
      spec.tp_rank = r;
      spec.store = store;
      if (!numa.empty()) {
        const NumaBinding& b = numa[size_t((s * tp + r) % ranks_per_node)];
        spec.cpus = b.cpus;
        spec.numa_node = b.node;
      } else if (!spec.cpus.empty()) {  // pinned: the node's k-th rank on cores [k·t, (k+1)·t)
        const int k = (s * tp + r) % ranks_per_node, t = int(spec.cpus.size());
        for (int i = 0; i < t; ++i) spec.cpus[size_t(i)] = cpus[size_t((k * t + i) % ncpu)];
      }
      auto pid =
          r == 0 ? dist::spawn_process(worker_binary,
                                       stage_worker_args(spec, recv_spec[s], send_spec[s]),
                                       child_fds[s])
                 : dist::spawn_process(worker_binary, stage_worker_args(spec, "none", "none"), {});
      if (!pid.ok()) {  // stop the stages already started: nobody will drain them
        out.close_all();
        for (pid_t started : out.pids) {
          kill(started, SIGKILL);
          waitpid(started, nullptr, 0);
        }
        return pid.status();
      }
      out.pids.push_back(*pid);
      out.stages.push_back(s);
      out.tp_ranks.push_back(r);
    }
  }
  return out;
}

std::vector<std::string> stage_worker_args(const StageSpec& spec, const std::string& recv_link,
                                           const std::string& send_link) {
  std::vector<std::string> a = {
      "pp-stage",
      "--model",
      spec.model_dir,
      "--stage",
      std::to_string(spec.stage),
      "--num-stages",
      std::to_string(spec.num_stages),
      "--layers",
      std::to_string(spec.layer_begin) + ":" + std::to_string(spec.layer_end),
      "--threads",
      std::to_string(spec.threads),
      "--num-blocks",
      std::to_string(spec.num_blocks),
      "--block-size",
      std::to_string(spec.block_size),
      "--recv",
      recv_link,
      "--send",
      send_link};
  if (!spec.cpus.empty()) {
    a.push_back("--cpus");
    a.push_back(join_ints(spec.cpus));
  }
  if (spec.numa_node >= 0) {
    a.push_back("--numa-node");
    a.push_back(std::to_string(spec.numa_node));
  }
  if (spec.expanded_kv_cache) a.push_back("--expanded-kv-cache");
  if (spec.lm_head_int8) a.push_back("--lm-head-int8");
  if (spec.bf16_activations) a.push_back("--bf16-activations");
  if (spec.bf16_kv_cache) a.push_back("--bf16-kv-cache");
  if (spec.num_speculative_tokens > 0) {
    a.push_back("--num-speculative-tokens");
    a.push_back(std::to_string(spec.num_speculative_tokens));
  }
  if (spec.tp_size > 1) {
    for (const std::string& x :
         {std::string("--tp-rank"), std::to_string(spec.tp_rank), std::string("--tp-size"),
          std::to_string(spec.tp_size), std::string("--store"), spec.store})
      a.push_back(x);
  }
  if (spec.expert_parallel) a.push_back("--expert-parallel");
  if (spec.experts_dp_size > 1) {
    for (const std::string& x :
         {std::string("--experts-dp-rank"), std::to_string(spec.experts_dp_rank),
          std::string("--experts-dp-size"), std::to_string(spec.experts_dp_size),
          std::string("--experts-store"), spec.experts_store})
      a.push_back(x);
  }
  if (!spec.kv_transfer_config.empty()) {
    a.push_back("--kv-transfer-config");
    a.push_back(spec.kv_transfer_config);
    a.push_back("--kv-dp-rank");
    a.push_back(std::to_string(spec.kv_dp_rank));
  }
  return a;
}

common::Result<StageWorkerArgs> parse_stage_worker_args(const std::vector<std::string>& args) {
  StageWorkerArgs out;
  auto number = [](const std::string& flag, const std::string& v) -> common::Result<int64_t> {
    try {
      size_t used = 0;
      const long long x = std::stoll(v, &used);
      if (used == v.size()) return static_cast<int64_t>(x);
    } catch (...) {
    }
    return common::invalid_argument("pp-stage: " + flag + " expects an integer, got '" + v + "'");
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& f = args[i];
    if (f == "--expanded-kv-cache") {
      out.spec.expanded_kv_cache = true;
      continue;
    }
    if (f == "--lm-head-int8") {
      out.spec.lm_head_int8 = true;
      continue;
    }
    if (f == "--bf16-activations") {
      out.spec.bf16_activations = true;
      continue;
    }
    if (f == "--bf16-kv-cache") {
      out.spec.bf16_kv_cache = true;
      continue;
    }
    if (f == "--expert-parallel") {
      out.spec.expert_parallel = true;
      continue;
    }
    if (i + 1 >= args.size()) return common::invalid_argument("pp-stage: " + f + " needs a value");
    const std::string& v = args[++i];
    if (f == "--kv-transfer-config") {
      out.spec.kv_transfer_config = v;
    } else if (f == "--store") {
      out.spec.store = v;
    } else if (f == "--experts-store") {
      out.spec.experts_store = v;
    } else if (f == "--kv-dp-rank") {
      CP_ASSIGN_OR_RETURN(int64_t rank, number(f, v));
      out.spec.kv_dp_rank = static_cast<int>(rank);
    } else if (f == "--model") {
      out.spec.model_dir = v;
    } else if (f == "--recv") {
      out.recv_link = v;
    } else if (f == "--send") {
      out.send_link = v;
    } else if (f == "--layers") {
      const size_t colon = v.find(':');
      if (colon == std::string::npos)
        return common::invalid_argument("pp-stage: --layers expects BEGIN:END");
      CP_ASSIGN_OR_RETURN(int64_t b, number(f, v.substr(0, colon)));
      CP_ASSIGN_OR_RETURN(int64_t e, number(f, v.substr(colon + 1)));
      out.spec.layer_begin = static_cast<int>(b);
      out.spec.layer_end = static_cast<int>(e);
    } else if (f == "--numa-node") {
      CP_ASSIGN_OR_RETURN(int64_t node, number(f, v));
      out.spec.numa_node = static_cast<int>(node);
    } else if (f == "--cpus") {
      size_t start = 0;
      while (start <= v.size()) {
        const size_t comma = std::min(v.find(',', start), v.size());
        CP_ASSIGN_OR_RETURN(int64_t c, number(f, v.substr(start, comma - start)));
        out.spec.cpus.push_back(static_cast<int>(c));
        start = comma + 1;
      }
    } else {
      CP_ASSIGN_OR_RETURN(int64_t x, number(f, v));
      if (f == "--stage") {
        out.spec.stage = static_cast<int>(x);
      } else if (f == "--num-stages") {
        out.spec.num_stages = static_cast<int>(x);
      } else if (f == "--threads") {
        out.spec.threads = static_cast<int>(x);
      } else if (f == "--num-blocks") {
        out.spec.num_blocks = x;
      } else if (f == "--block-size") {
        out.spec.block_size = static_cast<int>(x);
      } else if (f == "--num-speculative-tokens") {
        out.spec.num_speculative_tokens = static_cast<int>(x);
      } else if (f == "--tp-rank") {
        out.spec.tp_rank = static_cast<int>(x);
      } else if (f == "--tp-size") {
        out.spec.tp_size = static_cast<int>(x);
      } else if (f == "--experts-dp-rank") {
        out.spec.experts_dp_rank = static_cast<int>(x);
      } else if (f == "--experts-dp-size") {
        out.spec.experts_dp_size = static_cast<int>(x);
      } else {
        return common::invalid_argument("pp-stage: unknown flag " + f);
      }
    }
  }
  if (out.spec.tp_size < 1 || out.spec.tp_rank < 0 || out.spec.tp_rank >= out.spec.tp_size)
    return common::invalid_argument("pp-stage: --tp-rank out of range");
  if (out.spec.num_speculative_tokens < 0 || out.spec.num_speculative_tokens > 16)
    return common::invalid_argument("pp-stage: --num-speculative-tokens out of range");
  if (out.spec.tp_size > 1 && out.spec.store.empty())
    return common::invalid_argument("pp-stage: tensor parallelism needs --store");
  if (out.spec.experts_dp_size < 1 || out.spec.experts_dp_rank < 0 ||
      out.spec.experts_dp_rank >= out.spec.experts_dp_size)
    return common::invalid_argument("pp-stage: --experts-dp-rank out of range");
  if (out.spec.experts_dp_size > 1 && (out.spec.experts_store.empty() || !out.spec.expert_parallel))
    return common::invalid_argument(
        "pp-stage: experts over data-parallel ranks need --experts-store and --expert-parallel");
  if (out.spec.tp_rank > 0 && out.recv_link.empty() && out.send_link.empty()) {
    out.recv_link = out.send_link = "none";  // fed by TP rank 0, not by the ring
  }
  if (out.spec.model_dir.empty() || out.recv_link.empty() || out.send_link.empty())
    return common::invalid_argument("pp-stage needs --model, --recv and --send");
  if (out.spec.num_stages < 1 || out.spec.stage < 0 || out.spec.stage >= out.spec.num_stages ||
      out.spec.threads < 1 || out.spec.num_blocks < 1 || out.spec.block_size < 1)
    return common::invalid_argument("pp-stage: stage, threads or cache sizes out of range");
  return out;
}

common::Result<std::unique_ptr<dist::Link>> open_link(const std::string& link, bool sending,
                                                      const std::string& what) {
  if (link.rfind("shm:", 0) == 0) {
    int fd = -1;
    try {
      fd = std::stoi(link.substr(4));
    } catch (...) {
      return common::invalid_argument(what + ": bad link " + link);
    }
    CP_ASSIGN_OR_RETURN(dist::ShmPipe pipe, dist::ShmPipe::attach(fd));
    return dist::make_shm_link(std::move(pipe));
  }
  if (link.rfind("tcp-bind:", 0) == 0)
    return dist::make_tcp_link(link.substr(9), /*bind=*/true, sending, what);
  if (link.rfind("tcp-connect:", 0) == 0)
    return dist::make_tcp_link(link.substr(12), /*bind=*/false, sending, what);
  return common::invalid_argument(what + ": unknown link " + link);
}

std::optional<std::string> StageMonitor::poll() {
  std::optional<std::string> failure;
  for (size_t i = 0; i < stages_.pids.size(); ++i) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reaped_[i]) continue;
    }
    auto how = dist::reap_if_exited(stages_.pids[i]);
    if (!how) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reaped_[i] = true;
    }
    if (!failure && !how->starts_with("exited with status 0")) {
      const int tp_rank = i < stages_.tp_ranks.size() ? stages_.tp_ranks[i] : 0;
      failure = "pipeline stage " + std::to_string(stages_.stages[i]) +
                (tp_rank > 0 ? " tensor-parallel rank " + std::to_string(tp_rank) : "") + " (pid " +
                std::to_string(stages_.pids[i]) + ") " + *how;
    }
  }
  return failure;
}

bool StageMonitor::all_exited() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::all_of(reaped_.begin(), reaped_.end(), [](bool r) { return r; });
}

void StageMonitor::kill_remaining() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < stages_.pids.size(); ++i) {
    if (reaped_[i]) continue;
    kill(stages_.pids[i], SIGKILL);
    waitpid(stages_.pids[i], nullptr, 0);
    reaped_[i] = true;
  }
}

}  // namespace worker
