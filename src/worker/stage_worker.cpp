// Stage process loop: receiver thread + compute loop.
#include "worker/stage_worker.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "common/thread_pool.h"
#include "common/timer.h"
#include "model/deepseek_v3.h"
#include "worker/stage_protocol.h"

namespace worker {
namespace {

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

class StageRunner {
 public:
  StageRunner(const StageSpec& spec, std::unique_ptr<model::DeepseekV3Model> model)
      : spec_(spec),
        model_(std::move(model)),
        cache_(model_->config().num_total_layers(), spec.layer_begin, spec.layer_end,
               spec.num_blocks, spec.block_size, model_->config().kv_cache_row_dim(),
               spec.expanded_kv_cache ? model_->config().expanded_kv_row_dim() : 0),
        pool_(spec.threads) {}

  bool first() const { return spec_.stage == 0; }
  bool last() const { return spec_.stage + 1 == spec_.num_stages; }
  void pin() { pool_.pin_threads(spec_.cpus); }

  // Runs the stage's layers on a step; returns the payload for the next rank (the last stage
  // samples into `sampled` instead).
  common::Result<std::vector<float>> run_step(const StepInput& in, std::vector<float> hidden,
                                              std::vector<std::optional<SampledToken>>* sampled) {
    CP_RETURN_IF_ERROR(check_ids(in));
    const model::ForwardBatch batch = to_forward_batch(in);
    const int64_t H = model_->config().hidden_size;
    const int64_t rows = batch.num_tokens();
    if (first()) {
      hidden.assign(rows * H, 0.0f);
      model_->embed(batch, hidden.data());
    } else if (static_cast<int64_t>(hidden.size()) != rows * H) {
      return common::data_loss("stage " + std::to_string(spec_.stage) + " received " +
                               std::to_string(hidden.size()) + " hidden values for " +
                               std::to_string(rows) + " tokens");
    }
    model_->run_layers(batch, spec_.layer_begin, spec_.layer_end, hidden.data(), cache_, pool_);
    if (!last()) return hidden;
    *sampled = sample_step(*model_, in, hidden.data(), pool_);
    return std::vector<float>{};
  }

  // Ids from another process index the cache, the embedding and the sampler's tables: a bad one
  // is refused rather than read or written out of bounds.
  common::Status check_ids(const StepInput& in) const {
    const int64_t vocab = model_->config().vocab_size;
    auto bad = [&](const std::string& what, int64_t v, int64_t limit) {
      return common::data_loss(what + " " + std::to_string(v) + " is outside [0, " +
                               std::to_string(limit) + ") on stage " + std::to_string(spec_.stage));
    };
    for (const auto& seq : in.sequences) {
      for (int32_t b : seq.block_table)
        if (b < 0 || b >= cache_.num_blocks()) return bad("KV block", b, cache_.num_blocks());
      if (first()) {
        for (int32_t t : seq.token_ids)
          if (t < 0 || t >= vocab) return bad("token id", t, vocab);
      }
      if (last() && seq.samples) {
        for (const auto* ids :
             {&seq.sample.prompt_token_ids, &seq.sample.output_token_ids, &seq.sample.stop_ids}) {
          for (int32_t t : *ids)
            if (t < 0 || t >= vocab) return bad("token id", t, vocab);
        }
      }
    }
    return {};
  }

  double profile_ms(int64_t num_tokens) {
    const int64_t n = std::clamp<int64_t>(num_tokens, 1, cache_.num_blocks() * cache_.block_size());
    const StepInput in = dummy_prefill(n, model_->config().vocab_size, cache_.block_size());
    std::vector<float> hidden(first() ? 0 : n * model_->config().hidden_size, 0.0f);
    std::vector<std::optional<SampledToken>> sampled;
    const double t0 = common::now_seconds();
    auto out = run_step(in, std::move(hidden), &sampled);
    return (common::now_seconds() - t0) * 1000.0;
  }

 private:
  const StageSpec& spec_;
  std::unique_ptr<model::DeepseekV3Model> model_;
  model::LatentKvCache cache_;
  common::ThreadPool pool_;
};

}  // namespace

int run_stage_worker(const StageSpec& spec, dist::Communicator& comm) {
  const std::string name = "pipeline stage " + std::to_string(spec.stage);
  model::LoadOptions opts;
  opts.layer_begin = spec.layer_begin;
  opts.layer_end = spec.layer_end;
  opts.load_embedding = spec.stage == 0;
  opts.load_head = spec.stage + 1 == spec.num_stages;
  opts.load_mtp = false;
  auto model = model::DeepseekV3Model::load(spec.model_dir, opts);
  if (!model.ok()) {
    LOG(ERROR) << name << ": " << model.status().message();
    return 1;
  }
  StageRunner runner(spec, std::move(model).value());
  runner.pin();

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
    auto kind = message_kind(m);
    common::Status st = kind.status();
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
      if (st.ok() && probe.stage == spec.stage) probe.ms = runner.profile_ms(probe.num_tokens);
      if (st.ok()) st = comm.send(downstream_peer(spec), encode_profile(probe));
    } else if (st.ok()) {
      StepEnvelope step;
      st = decode_step(m, &step);
      if (st.ok()) {
        const double t0 = common::now_seconds();
        auto payload = runner.run_step(step.input, std::move(m.data), &step.sampled);
        step.timings.push_back({spec.stage, t0, common::now_seconds() - t0});
        st = payload.ok()
                 ? comm.send(downstream_peer(spec), encode_step(step, std::move(payload).value()))
                 : payload.status();
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
