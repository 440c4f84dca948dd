// Stage processes: start-up handshake, step submission, output collection, failure watch.
#include "engine/pipeline_executor.h"

#include <sys/wait.h>
#include <algorithm>

#include <csignal>
#include <cstdio>
#include <unordered_set>

#include "common/check.h"
#include "common/logging.h"
#include "common/timer.h"
#include "dist/process.h"

namespace engine {

using namespace worker;  // the stage protocol and launcher

common::Result<std::unique_ptr<PipelineExecutor>> PipelineExecutor::create(
    const PipelineOptions& options) {
  CP_ASSIGN_OR_RETURN(std::vector<StageSpec> specs, plan_stages(options));
  PipelineTopology topo = options.topology;
  topo.num_stages = options.num_stages;
  topo.tp_size = options.tensor_parallel_size;
  if (topo.node_rank != 0)
    return common::invalid_argument("the engine runs on node 0; use --headless elsewhere");
  std::unique_ptr<PipelineExecutor> ex(new PipelineExecutor());
  for (const StageSpec& s : specs) ex->ranges_.emplace_back(s.layer_begin, s.layer_end);
  ex->kv_aggregator_ = KvOutputAggregator(ex->num_stages());
  ex->busy_seconds_.assign(options.num_stages, 0.0);
  const std::string binary =
      options.worker_binary.empty() ? dist::self_binary() : options.worker_binary;
  CP_ASSIGN_OR_RETURN(ex->local_, launch_local_stages(specs, topo, binary));
  ex->stage_monitor_ = std::make_unique<worker::StageMonitor>(ex->local_);
  ex->receiver_ = std::thread([raw = ex.get()] { raw->receive_loop(); });
  ex->monitor_ = std::thread([raw = ex.get()] { raw->monitor_loop(); });

  // Start-up handshake: the hello comes back once every stage has loaded its slice.
  CP_RETURN_IF_ERROR(ex->local_.driver_send->send(encode_hello({})));
  const double deadline = common::now_seconds() + options.startup_timeout_s;
  {
    std::unique_lock<std::mutex> lock(ex->mu_);
    while (ex->inbox_.empty() && ex->failure_.empty()) {
      if (common::now_seconds() > deadline) {
        lock.unlock();
        ex->fail("the pipeline stages did not start within " +
                 std::to_string(static_cast<int>(options.startup_timeout_s)) + " s");
        lock.lock();
        break;
      }
      ex->cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }
  CP_ASSIGN_OR_RETURN(dist::Message m, ex->next_message());
  Hello hello;
  CP_RETURN_IF_ERROR(decode_hello(m, &hello));
  if (static_cast<int>(hello.stages.size()) != options.num_stages)
    return common::data_loss("the start-up handshake passed " +
                             std::to_string(hello.stages.size()) + " of " +
                             std::to_string(options.num_stages) + " stages");
  for (size_t i = 0; i < hello.stages.size(); ++i) {
    if (hello.num_blocks[i] < options.num_blocks) {  // e.g. a --headless host sized differently
      return common::invalid_argument(
          "pipeline stage " + std::to_string(hello.stages[i]) + " has a KV cache of " +
          std::to_string(hello.num_blocks[i]) + " blocks, fewer than the engine's " +
          std::to_string(options.num_blocks) + ": give every node the same KV cache flags");
    }
  }
  return ex;
}

PipelineExecutor::~PipelineExecutor() {
  if (failure().empty() && local_.driver_send) {
    // Orderly stop: the shutdown message travels the ring and each stage exits after passing it.
    (void)local_.driver_send->send(encode_shutdown());
    const double deadline = common::now_seconds() + 10.0;
    while (common::now_seconds() < deadline && !stage_monitor_->all_exited())
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stopping_ = true;
  if (monitor_.joinable()) monitor_.join();
  if (stage_monitor_) stage_monitor_->kill_remaining();
  local_.close_all();
  if (receiver_.joinable()) receiver_.join();
}

void PipelineExecutor::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.empty()) return;
    failure_ = why;
    cv_.notify_all();
  }
  if (!stopping_) LOG(ERROR) << "Pipeline failed: " << why;
  local_.close_all();
}

std::string PipelineExecutor::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void PipelineExecutor::receive_loop() {
  while (true) {
    dist::Message m;
    if (auto st = local_.driver_recv->recv(&m); !st.ok()) {
      if (!stopping_) fail("the link from the last pipeline stage broke: " + st.message());
      return;
    }
    auto kind = message_kind(m);
    if (!kind.ok()) {
      fail(kind.status().message());
      return;
    }
    if (*kind == StageMessageKind::kShutdown) return;
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(std::move(m));
    cv_.notify_all();
  }
}

void PipelineExecutor::monitor_loop() {
  while (!stopping_) {
    if (auto failed = stage_monitor_->poll(); failed && !stopping_) fail(*failed);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

common::Result<dist::Message> PipelineExecutor::next_message() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !inbox_.empty() || !failure_.empty(); });
  if (!failure_.empty()) return common::Status(common::StatusCode::kInternal, failure_);
  dist::Message m = std::move(inbox_.front());
  inbox_.pop_front();
  return m;
}

common::Status PipelineExecutor::submit(const sched::SchedulerOutput& output,
                                        const StepMeta& meta) {
  if (auto why = failure(); !why.empty()) return common::Status(common::StatusCode::kInternal, why);
  StepEnvelope step;
  step.step_id = meta.step_id;
  step.predicted_ms = meta.predicted_ms;
  step.output = output;
  InFlight f;
  f.meta = meta;
  for (const auto& s : output.scheduled) {
    f.samples.push_back(s.samples);
    f.req_ids.push_back(s.req_id);
    f.num_spec.push_back(s.spec_token_ids.size());
    f.tokens += s.num_scheduled_tokens;
    f.history += s.num_computed_tokens;
  }
  in_flight_.push_back(std::move(f));
  dist::Message m = encode_step(step, {});
  bytes_sent_ += static_cast<int64_t>(m.meta.size());
  auto st = local_.driver_send->send(m);
  if (!st.ok()) {
    fail("cannot send a step to pipeline stage 0: " + st.message());
    return common::Status(common::StatusCode::kInternal, failure());
  }
  return {};
}

common::Result<sched::ModelRunnerOutput> PipelineExecutor::take_oldest() {
  CHECK(!in_flight_.empty()) << "take_oldest with nothing in flight";
  CP_ASSIGN_OR_RETURN(dist::Message m, next_message());
  const InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  StepEnvelope step;
  CP_RETURN_IF_ERROR(decode_step(m, &step));
  if (step.step_id != f.meta.step_id)
    return common::data_loss("the pipeline returned step " + std::to_string(step.step_id) +
                             " where step " + std::to_string(f.meta.step_id) + " was due");
  sched::ModelRunnerOutput out;
  out.sampled = std::move(step.sampled);
  out.draft_token_ids = std::move(step.draft_token_ids);
  out.prompt_logprobs = std::move(step.prompt_logprobs);
  out.sampled.resize(f.samples.size());
  out.draft_token_ids.resize(f.samples.size());
  out.prompt_logprobs.resize(f.samples.size());  // the engine bounds each by its prompt
  out.kv_transfers = kv_aggregator_.aggregate(step.transfers);
  out.rejected = std::move(step.rejected);
  std::unordered_set<std::string> rejected;
  for (const sched::RejectedRequest& r : out.rejected) rejected.insert(r.req_id);
  for (size_t i = 0; i < out.sampled.size(); ++i) {
    const size_t n = out.sampled[i].size();
    if (n == 0 && rejected.count(f.req_ids[i])) continue;  // held back: it fails alone
    if (f.samples[i] ? n == 0 || n > f.num_spec[i] + 1 : n != 0)
      return common::data_loss("the last stage sent " + std::to_string(n) +
                               " tokens for a sequence that " +
                               (f.samples[i] ? "samples" : "does not sample"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const StageTiming& t : step.timings) {
    const double ms = t.duration_s * 1000.0;
    if (t.stage == num_stages() - 1) out.last_stage_ms = ms;
    out.max_stage_ms = std::max(out.max_stage_ms, ms);
    if (t.stage >= 0 && t.stage < num_stages()) busy_seconds_[t.stage] += t.duration_s;
    if (tracing_) {
      trace_.push_back({t.stage, f.meta.step_id, t.start_s, t.duration_s, f.meta.predicted_ms,
                        f.tokens, f.history, static_cast<int64_t>(f.samples.size())});
    }
  }
  return out;
}

common::Status PipelineExecutor::execute_dummy_batch() {
  CHECK(in_flight_.empty()) << "a dummy batch while steps are in flight";
  if (auto why = failure(); !why.empty()) return common::Status(common::StatusCode::kInternal, why);
  if (auto st = local_.driver_send->send(encode_dummy()); !st.ok()) {
    fail("cannot send a dummy batch to pipeline stage 0: " + st.message());
    return common::Status(common::StatusCode::kInternal, failure());
  }
  CP_ASSIGN_OR_RETURN(dist::Message m, next_message());
  CP_ASSIGN_OR_RETURN(StageMessageKind kind, message_kind(m));
  if (kind != StageMessageKind::kDummy)
    return common::data_loss("the pipeline answered a dummy batch with another message");
  return {};
}

common::Result<double> PipelineExecutor::profile_ms(int64_t num_tokens, int64_t history,
                                                    sched::AttentionForm form, bool slowest_stage) {
  const int last = num_stages() - 1;
  double slowest = -1;
  for (int s = slowest_stage ? 0 : last; s <= last; ++s) {
    CP_ASSIGN_OR_RETURN(double ms, profile_stage_ms(s, num_tokens, history, form));
    slowest = std::max(slowest, ms);
  }
  return slowest;
}

common::Result<double> PipelineExecutor::profile_stage_ms(int stage, int64_t num_tokens,
                                                          int64_t history,
                                                          sched::AttentionForm form) {
  CHECK(in_flight_.empty()) << "profiling while steps are in flight";
  ProfileProbe probe;
  probe.stage = stage;
  probe.num_tokens = num_tokens;
  probe.history = history;
  probe.form = form;
  if (auto st = local_.driver_send->send(encode_profile(probe)); !st.ok()) {
    fail("cannot send a profiling probe: " + st.message());
    return common::Status(common::StatusCode::kInternal, failure());
  }
  CP_ASSIGN_OR_RETURN(dist::Message m, next_message());
  CP_RETURN_IF_ERROR(decode_profile(m, &probe));
  if (probe.ms < 0) return common::data_loss("stage " + std::to_string(stage) + " did not profile");
  return probe.ms;
}

common::Status PipelineExecutor::write_trace(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return common::invalid_argument("--trace-file " + path + ": cannot write");
  double origin = trace_.empty() ? 0 : trace_.front().start_s;
  for (const TraceEvent& e : trace_) origin = std::min(origin, e.start_s);
  std::fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  for (int s = 0; s < num_stages(); ++s) {
    std::fprintf(f,
                 "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": "
                 "{\"name\": \"stage %d (layers %d-%d)\"}},\n",
                 s, s, ranges_[s].first, ranges_[s].second - 1);
  }
  for (size_t i = 0; i < trace_.size(); ++i) {
    const TraceEvent& e = trace_[i];
    std::fprintf(f,
                 "{\"name\": \"step %lld: %lld tokens\", \"cat\": \"chunk\", \"ph\": \"X\", "
                 "\"pid\": 0, \"tid\": %d, "
                 "\"ts\": %.1f, \"dur\": %.1f, \"args\": {\"step\": %lld, \"tokens\": %lld, "
                 "\"history\": %lld, "
                 "\"sequences\": %lld, \"predicted_ms\": %.3f, \"measured_ms\": %.3f}}%s\n",
                 static_cast<long long>(e.step_id), static_cast<long long>(e.tokens), e.stage,
                 (e.start_s - origin) * 1e6, e.duration_s * 1e6, static_cast<long long>(e.step_id),
                 static_cast<long long>(e.tokens), static_cast<long long>(e.history),
                 static_cast<long long>(e.sequences), e.predicted_ms, e.duration_s * 1000.0,
                 i + 1 < trace_.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
  return {};
}

std::vector<double> PipelineExecutor::stage_busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_seconds_;
}

}  // namespace engine
