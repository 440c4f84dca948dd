// `chunkpipe pp-stage ...`: one pipeline-stage process, started by `serve` (or a --headless
// node) with its layer slice, cache size and the two links of the ring. Not for direct use.
#include <unistd.h>

#include <csignal>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/logging.h"
#include "transfer/kv_connector_factory.h"
#include "transfer/kv_transfer_config.h"
#include "worker/stage_launcher.h"
#include "worker/stage_worker.h"

namespace cli {
namespace {

transfer::ConnectorPlacement placement(const worker::StageSpec& spec) {
  transfer::ConnectorPlacement at;
  at.dp_rank = spec.kv_dp_rank;
  at.pp_size = spec.num_stages;
  at.tp_size = spec.tp_size;
  at.block_size = spec.block_size;
  return at;
}

}  // namespace

int run_pp_stage_command(int argc, char** argv) {
  const std::vector<std::string> args(argv + 2, argv + argc);
  auto parsed = worker::parse_stage_worker_args(args);
  if (!parsed.ok()) {
    LOG(ERROR) << parsed.status().message();
    return 2;
  }
  // The server that started this stage decides when it ends (shutdown message, or SIGKILL
  // through the parent-death signal); a Ctrl-C sent to the whole process group must not kill
  // a stage before the server has drained it.
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGPIPE, SIG_IGN);
  const worker::StageSpec& spec = parsed->spec;
  common::set_log_prefix("(PipelineStage" + std::to_string(spec.stage) +
                         (spec.tp_size > 1 ? "_TP" + std::to_string(spec.tp_rank) : "") +
                         " pid=" + std::to_string(getpid()) + ")");
  const std::string name = "pipeline stage " + std::to_string(spec.stage);
  int exit_code = 1;
  {
    dist::Communicator comm;
    if (spec.tp_rank == 0) {  // the other TP ranks get their messages from this one
      auto in = worker::open_link(parsed->recv_link, /*sending=*/false, name + " input");
      auto out = worker::open_link(parsed->send_link, /*sending=*/true, name + " output");
      if (!in.ok() || !out.ok()) {
        LOG(ERROR) << (in.ok() ? out.status() : in.status()).message();
        return 1;
      }
      comm.set_recv_link(worker::upstream_peer(spec), std::move(in).value());
      comm.set_send_link(worker::downstream_peer(spec), std::move(out).value());
    }
    std::shared_ptr<worker::KvConnectorWorker> connector;
    // TP rank 0 of the stage serves the stage's KV (every rank holds the same latent cache).
    if (!spec.kv_transfer_config.empty() && spec.tp_rank == 0) {
      auto config = transfer::parse_kv_transfer_config(spec.kv_transfer_config);
      auto made = config.ok()
                      ? transfer::make_worker_connector(*config, placement(spec), spec.stage)
                      : common::Result<std::shared_ptr<worker::KvConnectorWorker>>(config.status());
      if (!made.ok()) {
        LOG(ERROR) << made.status().message();
        return 1;
      }
      connector = std::move(made).value();
    }
    exit_code = worker::run_stage_worker(spec, comm, std::move(connector));
  }
  dist::flush_tcp_links();  // the forwarded shutdown must reach the next host before we exit
  return exit_code;
}

}  // namespace cli
