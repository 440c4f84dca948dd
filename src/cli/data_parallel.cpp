// The --data-parallel-* flags, the lock-step groups and the engine processes of a node.
#include "cli/data_parallel.h"

#include <arpa/inet.h>

#include <cstdlib>

#include "cli/flag_limits.h"
#include "common/logging.h"
#include "dist/group_factory.h"
#include "dist/host_ip.h"
#include "dist/process.h"

namespace cli {

std::string data_parallel_bind_host(const DataParallelPlan& plan) {
  in_addr v4{};
  return inet_pton(AF_INET, plan.address.c_str(), &v4) == 1 ? plan.address : "*";
}

common::Status plan_data_parallel(const ArgParser& p, int tp, int pp, int lmhead,
                                  DataParallelPlan* plan) {
  CP_ASSIGN_OR_RETURN(int64_t size, p.int_option("data-parallel-size", 1, kMaxRanks));
  plan->size = static_cast<int>(size);
  plan->headless = p.flag("headless");
  plan->engine_of = p.option("dp-engine-of").value_or("");
  if (p.given("data-parallel-address")) plan->address = *p.option("data-parallel-address");
  if (p.given("data-parallel-rpc-port")) {
    CP_ASSIGN_OR_RETURN(int64_t port, p.int_option("data-parallel-rpc-port", 1));
    if (port > 65535)
      return common::invalid_argument("--data-parallel-rpc-port must be a port in [1, 65535]");
    plan->rpc_port = static_cast<int>(port);
  }
  if (p.given("data-parallel-rank")) {
    CP_ASSIGN_OR_RETURN(int64_t rank, p.int_option("data-parallel-rank", 0, kMaxRanks));
    if (rank >= size)
      return common::invalid_argument("--data-parallel-rank " + std::to_string(rank) +
                                      " must be below --data-parallel-size " +
                                      std::to_string(size));
    plan->rank = static_cast<int>(rank);
    plan->external = !plan->engine_process();
  } else if (plan->engine_process()) {
    return common::invalid_argument("--dp-engine-of needs --data-parallel-rank");
  }
  if (p.given("data-parallel-start-rank")) {
    CP_ASSIGN_OR_RETURN(int64_t start, p.int_option("data-parallel-start-rank", 0, kMaxRanks));
    plan->start_rank = static_cast<int>(start);
  }
  int64_t local = size;
  if (p.given("data-parallel-size-local")) {
    CP_ASSIGN_OR_RETURN(local, p.int_option("data-parallel-size-local", 0, kMaxRanks));
  } else if (plan->headless) {
    local = size - plan->start_rank;
  }
  plan->size_local = static_cast<int>(local);
  if (!plan->active()) {
    if (plan->headless &&
        (p.given("data-parallel-start-rank") || p.given("data-parallel-size-local")))
      return common::invalid_argument(
          "--headless data-parallel serving needs --data-parallel-size > 1");
    return {};
  }
  if (!plan->external && !plan->engine_process()) {
    if (plan->start_rank + plan->size_local > plan->size)
      return common::invalid_argument(
          "--data-parallel-start-rank " + std::to_string(plan->start_rank) +
          " + --data-parallel-size-local " + std::to_string(plan->size_local) +
          " exceeds --data-parallel-size " + std::to_string(plan->size));
    if (plan->size_local < 0)
      return common::invalid_argument("--data-parallel-size-local must not be negative");
    if (!plan->headless && plan->start_rank != 0)
      return common::invalid_argument(
          "--data-parallel-start-rank is for --headless nodes; the API server's node holds rank 0");
    if (plan->headless && plan->start_rank == 0)
      return common::invalid_argument(
          "a --headless node needs --data-parallel-start-rank > 0 (rank 0 is on the API server's "
          "node)");
  }
  plan->expert_parallel = p.flag("enable-expert-parallel");
  plan->lmhead_size = lmhead;
  if (lmhead > 1 && (tp > 1 || pp > 1))
    return common::unimplemented(
        "lmhead_tensor_parallel_size over data-parallel ranks with --tensor-parallel-size or "
        "--pipeline-parallel-size above 1 is not built yet in chunkpipe (the seeds' decoders run "
        "TP 1)");
  // vLLM's expert-parallel world is DP x TP: the experts are split over every TP rank of every
  // DP rank, which then step in lock step. With a pipeline inside a rank, the experts are split
  // over each stage's TP group instead, and the DP ranks run independently.
  plan->lockstep = pp == 1 && (plan->expert_parallel || lmhead > 1);
  if (plan->expert_parallel && !plan->lockstep)
    LOG(WARNING) << "--enable-expert-parallel with --pipeline-parallel-size " << pp
                 << ": the experts are split over each pipeline stage's tensor-parallel group, "
                    "and the data-parallel ranks step independently (expert parallelism across "
                    "DP ranks is built for pipeline-parallel size 1)";
  return {};
}

common::Result<DataParallelGroups> join_data_parallel_groups(const DataParallelPlan& plan,
                                                             const std::string& store_host,
                                                             int store_port, bool serve_store) {
  DataParallelGroups g;
  if (serve_store) {
    CP_ASSIGN_OR_RETURN(g.store,
                        dist::StoreServer::start(data_parallel_bind_host(plan), store_port));
  }
  double timeout = 300;  // vLLM's VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS bounds one forward
  if (const char* env = std::getenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"))
    timeout = std::max(1.0, std::atof(env));
  dist::StoreClient store(store_host, store_port, 600);
  dist::GroupSpec spec("dp", plan.rank, plan.size);
  spec.timeout_s = timeout;
  spec.address = dist::host_ip(store_host);
  // A rank whose group lost a peer fails its engine, and the process then exits 1; a collective
  // that gloo leaves blocked after the loss must not hold it for the timeout instead.
  spec.on_stuck = dist::exit_process_when_stuck;
  CP_ASSIGN_OR_RETURN(g.dp, dist::make_process_group(store, spec));
  if (plan.lmhead_size > 1) {
    const int group = plan.rank / plan.lmhead_size;
    dist::GroupSpec lm("lmhead.dp" + std::to_string(group), plan.rank % plan.lmhead_size,
                       plan.lmhead_size);
    lm.timeout_s = timeout;
    lm.address = spec.address;
    lm.on_stuck = spec.on_stuck;
    CP_ASSIGN_OR_RETURN(g.lmhead, dist::make_process_group(store, lm));
  }
  return g;
}

common::Result<LocalEngines> spawn_local_engines(const std::vector<std::string>& serve_args,
                                                 const DataParallelPlan& plan,
                                                 const std::string& front_end) {
  LocalEngines e;
  for (int i = 0; i < plan.size_local; ++i) {
    const int rank = plan.start_rank + i;
    std::vector<std::string> args = serve_args;
    args.insert(args.end(),
                {"--data-parallel-rank", std::to_string(rank), "--dp-engine-of", front_end});
    CP_ASSIGN_OR_RETURN(pid_t pid, dist::spawn_process(dist::self_binary(), args, {}));
    e.pids.push_back(pid);
    e.ranks.push_back(rank);
  }
  return e;
}

}  // namespace cli
