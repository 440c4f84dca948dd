// Stage process loop: receiver thread + compute loop.
#include "worker/stage_worker.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "common/process_memory.h"
#include "common/timer.h"
#include "dist/group_factory.h"
#include "dist/host_ip.h"
#include "kernels/gemm.h"
#include "model/deepseek_v3.h"
#include "model/tensor_parallel.h"
#include "model/weight_census.h"
#include "worker/model_runner.h"
#include "worker/numa_binding.h"
#include "worker/stage_protocol.h"

namespace worker {
namespace {

// Adds this stage's connector report to what the earlier stages reported for the step.
void append_report(sched::KvTransferReport mine, sched::KvTransferReport* all) {
  auto move_all = [](auto& from, auto& to) {
    to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  };
  move_all(mine.finished_sending, all->finished_sending);
  move_all(mine.finished_recving, all->finished_recving);
  move_all(mine.failed_recving, all->failed_recving);
  all->stats += mine.stats;
}

// Messages received ahead of the compute loop, oldest first.
class Inbox {
 public:
  void push(dist::Message m) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(m));
    cv_.notify_one();
  }
  void fail(std::string why) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(why);
    failed_ = true;
    cv_.notify_one();
  }
  // False when the link failed and nothing is left.
  bool pop(dist::Message* m, std::string* error) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return failed_ || !queue_.empty(); });
    if (queue_.empty()) {
      *error = error_;
      return false;
    }
    *m = std::move(queue_.front());
    queue_.pop_front();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<dist::Message> queue_;
  bool failed_ = false;
  std::string error_;
};

// TP rank 0 hands each ring message to the stage's other ranks: sizes, then meta and data.
common::Status share_message(dist::ProcessGroup& group, dist::Message* m) {
  int64_t sizes[2] = {int64_t(m->meta.size()), int64_t(m->data.size())};
  CP_RETURN_IF_ERROR(group.broadcast(sizes, sizeof(sizes), 0));
  if (group.rank() != 0) {
    if (sizes[0] < 0 || sizes[1] < 0 || sizes[0] > (int64_t(1) << 34) ||
        sizes[1] > (int64_t(1) << 34))
      return common::data_loss("a malformed message size from tensor-parallel rank 0");
    m->meta.resize(size_t(sizes[0]));
    m->data.resize(size_t(sizes[1]));
  }
  CP_RETURN_IF_ERROR(group.broadcast(m->meta.data(), m->meta.size(), 0));
  return group.broadcast(m->data.data(), m->data.size() * sizeof(float), 0);
}

// A TP rank other than 0: computes its shard of every step rank 0 shares, answers nothing.
int follow_stage_leader(const StageSpec& spec, const std::string& name, dist::ProcessGroup& group,
                        ModelRunner& runner) {
  while (true) {
    dist::Message m;
    common::Status st = share_message(group, &m);
    auto kind = message_kind(m);
    if (st.ok()) st = kind.status();
    if (st.ok() && *kind == StageMessageKind::kShutdown) return 0;
    if (st.ok() && *kind == StageMessageKind::kProfile) {
      ProfileProbe probe;
      st = decode_profile(m, &probe);
      if (st.ok() && probe.stage == spec.stage)
        runner.profile_ms(probe.num_tokens, probe.history, probe.form);
    } else if (st.ok() && *kind == StageMessageKind::kDummy) {
      st = runner.execute_dummy_batch();
    } else if (st.ok() && *kind != StageMessageKind::kHello) {
      StepEnvelope step;
      st = decode_step(m, &step);
      if (st.ok()) st = runner.execute_model(step.output, std::move(m.data)).status();
    }
    if (!st.ok()) {
      LOG(ERROR) << name << ": " << st.message();
      return 1;
    }
  }
}

// The stage's TP group, met in the store at spec.store ("HOST:PORT").
common::Result<std::unique_ptr<dist::ProcessGroup>> join_stage_group(const StageSpec& spec) {
  const size_t colon = spec.store.rfind(':');
  if (colon == std::string::npos)
    return common::invalid_argument("pp-stage: --store expects HOST:PORT, got " + spec.store);
  dist::StoreClient store(spec.store.substr(0, colon), std::atoi(spec.store.c_str() + colon + 1),
                          300);
  dist::GroupSpec g("tp.stage" + std::to_string(spec.stage), spec.tp_rank, spec.tp_size);
  g.address = dist::host_ip(spec.store.substr(0, colon));  // where gloo peers dial this rank
  // A rank stuck in a collective with a dead peer cannot serve again: end the process, as a
  // failed collective would, so that the engine sees the stage fail.
  g.on_stuck = dist::exit_process_when_stuck;
  return dist::make_process_group(store, g);
}

// The DP x TP expert group, met in the data-parallel group's store at spec.experts_store. Its
// collectives wait on other DP ranks' forwards, bounded as the DP group's are.
common::Result<std::unique_ptr<dist::ProcessGroup>> join_expert_group(const StageSpec& spec) {
  const size_t colon = spec.experts_store.rfind(':');
  if (colon == std::string::npos)
    return common::invalid_argument("pp-stage: --experts-store expects HOST:PORT, got " +
                                    spec.experts_store);
  const std::string host = spec.experts_store.substr(0, colon);
  dist::StoreClient store(host, std::atoi(spec.experts_store.c_str() + colon + 1), 600);
  const model::DataParallelExperts ep = expert_group_rank(spec);
  dist::GroupSpec g("ep.stage" + std::to_string(spec.stage), ep.rank, ep.size);
  if (const char* env = std::getenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"))
    g.timeout_s = std::max(1.0, std::atof(env));
  g.address = dist::host_ip(host);
  g.on_stuck = dist::exit_process_when_stuck;
  return dist::make_process_group(store, g);
}

// The startup line that says what this rank holds.
void log_placement(const StageSpec& spec, const model::ModelConfig& c, const char* backend) {
  const model::TensorParallel tp{spec.tp_rank, spec.tp_size, spec.expert_parallel};
  const model::ShardRange heads = model::even_shard(c.num_attention_heads, tp);
  std::string experts = "none";
  if (c.n_routed_experts > 0) {
    if (spec.expert_parallel) {
      const model::DataParallelExperts ep = expert_group_rank(spec);
      const model::ShardRange e =
          ep.active() ? model::even_shard(c.n_routed_experts, {ep.rank, ep.size, true})
                      : model::even_shard(c.n_routed_experts, tp);
      experts = "experts " + std::to_string(e.begin) + "-" + std::to_string(e.end - 1) +
                (ep.active() ? " whole (expert-parallel rank " + std::to_string(ep.rank) + " of " +
                                   std::to_string(ep.size) + " over DP x TP)"
                             : std::string(" whole (expert parallel)")) +
                ", shared experts whole";
    } else {
      const model::ShardRange part = model::even_shard(c.moe_intermediate_size, tp);
      experts = "all " + std::to_string(c.n_routed_experts) + " experts, intermediate columns " +
                std::to_string(part.begin) + "-" + std::to_string(part.end - 1);
    }
  }
  const int64_t vocab_rows = model::vocab_shard_rows(c.vocab_size, tp);
  LOG(INFO) << "Pipeline stage " << spec.stage << " tensor-parallel rank " << spec.tp_rank << "/"
            << spec.tp_size << ": attention heads " << heads.begin << "-" << heads.end - 1 << "; "
            << experts << "; vocabulary rows " << vocab_rows * tp.rank << "-"
            << std::min<int64_t>(c.vocab_size, vocab_rows * (tp.rank + 1)) - 1
            << "; collectives over " << backend;
}

}  // namespace

int run_stage_worker(const StageSpec& spec, dist::Communicator& comm,
                     std::shared_ptr<KvConnectorWorker> kv_connector) {
  const std::string name =
      "pipeline stage " + std::to_string(spec.stage) +
      (spec.tp_size > 1 ? " tensor-parallel rank " + std::to_string(spec.tp_rank) : "");
  if (spec.numa_node >= 0) {  // before the load, so the weights' pages land on the node
    const NumaBinding binding{spec.numa_node, spec.cpus};
    if (auto st = apply_numa_binding(binding); !st.ok()) {
      LOG(ERROR) << name << ": " << st.message();
      return 1;
    }
    LOG(INFO) << name << ": bound to NUMA " << binding_text(binding);
  }
  model::LoadOptions opts;
  opts.tp = {spec.tp_rank, spec.tp_size, spec.expert_parallel};
  opts.dp_experts = expert_group_rank(spec);
  opts.layer_begin = spec.layer_begin;
  opts.layer_end = spec.layer_end;
  opts.load_embedding = spec.stage == 0;
  opts.load_head = spec.stage + 1 == spec.num_stages;
  opts.load_mtp = spec.num_speculative_tokens > 0;
  opts.lm_head_int8 = spec.lm_head_int8;
  // Before any forward runs on the stage's threads.
  kernels::set_activation_precision(spec.bf16_activations ? kernels::ActivationPrecision::kBf16
                                                          : kernels::ActivationPrecision::kF32);
  auto model = model::DeepseekV3Model::load(spec.model_dir, opts);
  if (!model.ok()) {
    LOG(ERROR) << name << ": " << model.status().message();
    return 1;
  }
  const std::unique_ptr<model::DeepseekV3Model> slice = std::move(model).value();
  LOG(INFO) << name << ": " << model::census_line(model::weight_census(slice->weights()))
            << "; resident memory " << model::gib_text(common::resident_bytes());
  std::unique_ptr<dist::ProcessGroup> group;
  if (spec.tp_size > 1) {
    auto joined = join_stage_group(spec);
    if (!joined.ok()) {
      LOG(ERROR) << name << ": " << joined.status().message();
      return 1;
    }
    group = std::move(joined).value();
    slice->set_process_group(group.get());
  }
  std::unique_ptr<dist::ProcessGroup> expert_group;
  if (opts.dp_experts.active()) {
    auto joined = join_expert_group(spec);
    if (!joined.ok()) {
      LOG(ERROR) << name << ": " << joined.status().message();
      return 1;
    }
    expert_group = std::move(joined).value();
    slice->set_expert_group(expert_group.get());
  }
  if (group) log_placement(spec, slice->config(), group->backend());
  RunnerOptions ro;
  ro.layer_begin = spec.layer_begin;
  ro.layer_end = spec.layer_end;
  ro.num_blocks = spec.num_blocks;
  ro.block_size = spec.block_size;
  ro.num_threads = spec.threads;
  ro.expanded_kv_cache = spec.expanded_kv_cache;
  ro.kv_cache_dtype = spec.bf16_kv_cache ? model::KvCacheDtype::kBf16 : model::KvCacheDtype::kF32;
  ro.num_speculative_tokens = spec.num_speculative_tokens;
  ro.kv_connector = std::move(kv_connector);
  ro.dummy_block = opts.dp_experts.active();  // lock step: dummy batches go into a scratch block
  ModelRunner runner(*slice, ro);
  if (auto st = runner.init_status(); !st.ok()) {
    LOG(ERROR) << name << ": " << st.message();
    return 1;
  }
  runner.pin_threads(spec.cpus);
  if (spec.tp_rank > 0) return follow_stage_leader(spec, name, *group, runner);

  Inbox inbox;
  std::thread receiver([&] {
    while (true) {
      dist::Message m;
      if (auto st = comm.recv(upstream_peer(spec), &m); !st.ok()) {
        inbox.fail(st.message());
        return;
      }
      const bool shutdown =
          m.meta.size() == 1 && m.meta[0] == static_cast<uint8_t>(StageMessageKind::kShutdown);
      inbox.push(std::move(m));
      if (shutdown) return;
    }
  });
  int exit_code = 1;
  std::string error;
  while (true) {
    dist::Message m;
    if (!inbox.pop(&m, &error)) {
      LOG(ERROR) << name << ": the link from the previous rank failed: " << error;
      break;
    }
    common::Status st = group ? share_message(*group, &m) : common::Status();
    if (!st.ok()) {
      LOG(ERROR) << name << ": " << st.message();
      break;
    }
    auto kind = message_kind(m);
    st = kind.status();
    if (st.ok() && *kind == StageMessageKind::kShutdown) {
      (void)comm.send(downstream_peer(spec), m);  // the next rank may already be gone
      exit_code = 0;
      break;
    }
    if (st.ok() && *kind == StageMessageKind::kHello) {
      Hello hello;
      st = decode_hello(m, &hello);
      hello.stages.push_back(spec.stage);
      hello.pids.push_back(static_cast<int32_t>(getpid()));
      hello.num_blocks.push_back(spec.num_blocks);
      if (st.ok()) st = comm.send(downstream_peer(spec), encode_hello(hello));
    } else if (st.ok() && *kind == StageMessageKind::kProfile) {
      ProfileProbe probe;
      st = decode_profile(m, &probe);
      if (st.ok() && probe.stage == spec.stage)
        probe.ms = runner.profile_ms(probe.num_tokens, probe.history, probe.form);
      if (st.ok()) st = comm.send(downstream_peer(spec), encode_profile(probe));
    } else if (st.ok() && *kind == StageMessageKind::kDummy) {
      st = runner.execute_dummy_batch();
      if (st.ok()) st = comm.send(downstream_peer(spec), m);
    } else if (st.ok()) {
      StepEnvelope step;
      st = decode_step(m, &step);
      if (st.ok()) {
        const double t0 = common::now_seconds();
        auto result = runner.execute_model(step.output, std::move(m.data));
        step.timings.push_back({spec.stage, t0, common::now_seconds() - t0});
        if (result.ok()) {
          step.sampled = std::move(result->sampled);
          step.draft_token_ids = std::move(result->draft_token_ids);
          step.prompt_logprobs = std::move(result->prompt_logprobs);
          step.rejected = std::move(result->rejected);  // every stage refuses the same ones
          append_report(std::move(result->transfers), &step.transfers);
          // Only the tokens go back to the engine, which remembers its own steps.
          if (spec.stage + 1 == spec.num_stages) step.output = {};
          st = comm.send(downstream_peer(spec), encode_step(step, std::move(result->hidden)));
        } else {
          st = common::data_loss("stage " + std::to_string(spec.stage) + ": " +
                                 result.status().message());
        }
      }
    }
    if (!st.ok()) {
      LOG(ERROR) << name << ": " << st.message();
      break;
    }
  }
  comm.close();
  receiver.join();
  return exit_code;
}

}  // namespace worker
