// EngineCore: request intake, the step loop, and per-token output processing.
#include "engine/engine_core.h"

#include <algorithm>

#include "common/check.h"
#include "common/logging.h"
#include "common/timer.h"

namespace engine {
namespace {

// Largest cut <= n that does not split a UTF-8 character of `s`.
size_t utf8_floor(const std::string& s, size_t n) {
  while (n > 0 && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace

EngineCore::EngineCore(const model::DeepseekV3Model& model, const tokenizer::Tokenizer& tokenizer,
                       const EngineConfig& config)
    : model_config_(model.config()),
      tokenizer_(tokenizer),
      config_(config),
      kv_(static_cast<int32_t>(config.num_kv_blocks), config.block_size,
          config.enable_prefix_caching),
      scheduler_(config.scheduler, &kv_),
      runner_(std::make_unique<worker::ModelRunner>(model, config.num_kv_blocks, config.block_size,
                                                    config.num_threads, config.expanded_kv_cache)),
      seed_rng_(config.seed) {
  start();
}

EngineCore::EngineCore(std::unique_ptr<worker::PipelineExecutor> pipeline,
                       const tokenizer::Tokenizer& tokenizer, const EngineConfig& config)
    : model_config_(pipeline->config()),
      tokenizer_(tokenizer),
      config_(config),
      kv_(static_cast<int32_t>(config.num_kv_blocks), config.block_size,
          config.enable_prefix_caching),
      scheduler_(config.scheduler, &kv_),
      pipeline_(std::move(pipeline)),
      seed_rng_(config.seed) {
  start();
}

void EngineCore::start() {
  if (pipeline_ && !config_.trace_file.empty()) pipeline_->enable_trace();
  if (auto eos = tokenizer_.eos_token_id()) {
    eos_ids_.push_back(*eos);
  } else {
    eos_ids_.push_back(static_cast<int32_t>(model_config_.eos_token_id));
  }
  if (config_.profiling_chunk && config_.profiling_chunk->enabled) run_profiling_chunk_init();
  thread_ = std::thread([this] { loop(); });
}

double EngineCore::timing_ms(const worker::PipelineExecutor::StepOutput& out) const {
  const bool slowest = config_.profiling_chunk && config_.profiling_chunk->timing_stage == "max";
  return slowest ? out.max_stage_ms : out.last_stage_ms;
}

double EngineCore::profile_ms(int64_t num_tokens) {
  if (pipeline_) {
    // Upstream times the last stage's own layers; timing_stage "max" takes the slowest stage.
    // A failed probe returns -1 (the sample is dropped); the step loop then sees the failure.
    const int last = pipeline_->num_stages() - 1;
    const bool every_stage =
        config_.profiling_chunk && config_.profiling_chunk->timing_stage == "max";
    double slowest = -1;
    for (int s = every_stage ? 0 : last; s <= last; ++s) {
      auto ms = pipeline_->profile_stage_ms(s, num_tokens);
      if (!ms.ok()) return -1;
      slowest = std::max(slowest, *ms);
    }
    return slowest;
  }
  return runner_->profile_prefill_ms(num_tokens, config_.scheduler.max_num_batched_tokens);
}

EngineCore::~EngineCore() {
  shutdown();
}

void EngineCore::run_profiling_chunk_init() {
  const sched::ProfilingChunkConfig& pc = *config_.profiling_chunk;
  const int64_t base = config_.scheduler.max_num_batched_tokens;
  predictor_ = std::make_unique<sched::ChunkSizePredictor>(
      base, config_.block_size, pc.smooth_factor, pc.min_chunk, pc.max_fit_chunk);
  predictor_->set_need_timing(pc.need_timing);
  predictor_->set_merge_tail(pc.merge_tail);
  predictor_->set_chunk_align(pc.chunk_align);
  if (pc.overhead_aware && pipeline_) predictor_->set_overhead_aware(pipeline_->num_stages());
  LOG(INFO) << "[ProfilingChunk] Scheduler initialized. base_chunk=" << base
            << ", page_size=" << config_.block_size << ", smooth_factor=" << pc.smooth_factor
            << ", min_chunk=" << pc.min_chunk;
  LOG(INFO) << "[ProfilingChunk] Running profiling initialization...";
  const auto sizes = sched::ChunkSizePredictor::profile_chunk_sizes(base);
  std::vector<std::pair<int64_t, double>> samples;
  const double t0 = common::now_seconds();
  const int total = static_cast<int>(sizes.size()) - 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double ms = profile_ms(sizes[i]);
    if (i == 0 || ms < 0) continue;  // warm-up, or a failed probe
    samples.emplace_back(sizes[i], ms);
    if (i % 6 == 0) {
      LOG(INFO) << "[ProfilingChunk] Profiling prefill latency: " << i << "/" << total
                << " samples done (chunk=" << sizes[i] << ", elapsed=" << common::now_seconds() - t0
                << "s)";
    }
  }
  std::vector<std::string> log;
  {
    std::lock_guard<std::mutex> lock(mu_);  // metrics() reads the fit
    predictor_->fit_profile(samples, &log);
  }
  for (const std::string& line : log) LOG(INFO) << line;
  scheduler_.set_chunk_predictor(predictor_.get());
}

void EngineCore::add_request(std::unique_ptr<sched::Request> request, OutputCallback callback) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      request->arrival_time = common::now_seconds();
      inbox_.emplace_back(std::move(request), std::move(callback));
      cv_.notify_one();
      return;
    }
  }
  RequestOutput out;
  out.request_id = request->request_id;
  out.finished = true;
  out.finish_reason = sched::FinishReason::kAbort;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.error = fatal_error_;
  }
  callback(out);
}

void EngineCore::abort_request(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  aborts_.push_back(request_id);
  cv_.notify_one();
}

void EngineCore::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  if (pipeline_ && !config_.trace_file.empty()) {
    if (auto st = pipeline_->write_trace(config_.trace_file); st.ok()) {
      LOG(INFO) << "Wrote the pipeline trace to " << config_.trace_file;
    } else {
      LOG(ERROR) << st.message();
    }
  }
}

MetricsSnapshot EngineCore::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  MetricsSnapshot s;
  s.totals = metrics_;
  const auto st = scheduler_.stats();
  s.num_running = st.num_running;
  s.num_waiting = st.num_waiting + static_cast<int32_t>(inbox_.size());
  s.kv_cache_usage = kv_.usage();
  s.num_kv_blocks = config_.num_kv_blocks;
  s.block_size = config_.block_size;
  if (pipeline_) s.stage_busy_seconds = pipeline_->stage_busy_seconds();
  if (predictor_ && predictor_->ready()) {
    s.cpp_ready = true;
    s.cpp_a = predictor_->a();
    s.cpp_b = predictor_->b();
    s.cpp_c = predictor_->c();
    s.cpp_target_ms = predictor_->target_ms();
  }
  return s;
}

void EngineCore::loop() {
  while (true) {
    std::vector<std::pair<std::unique_ptr<sched::Request>, OutputCallback>> incoming;
    std::vector<std::string> aborts;
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // With a pipeline, wake up now and then to notice a stage that died while idle.
      cv_.wait_for(lock, std::chrono::milliseconds(pipeline_ ? 100 : 3600 * 1000), [&] {
        return stopping_ || !inbox_.empty() || !aborts_.empty() ||
               scheduler_.has_unfinished_requests() || !in_flight_.empty();
      });
      stopping = stopping_;
      while (!inbox_.empty()) {
        incoming.push_back(std::move(inbox_.front()));
        inbox_.pop_front();
      }
      aborts.swap(aborts_);
    }
    for (auto& [req, cb] : incoming) {
      Tracked t;
      t.callback = std::move(cb);
      t.detokenizer = std::make_unique<tokenizer::IncrementalDetokenizer>(
          tokenizer_, req->sampling.skip_special_tokens);
      t.rng.seed(req->sampling.seed ? *req->sampling.seed : seed_rng_());
      t.num_prompt_tokens = req->num_prompt_tokens();
      t.arrival = req->arrival_time;
      const std::string id = req->request_id;
      tracked_.emplace(id, std::move(t));
      std::lock_guard<std::mutex> lock(mu_);
      scheduler_.add_request(std::move(req));
    }
    if (stopping) {
      for (auto& [id, t] : tracked_) aborts.push_back(id);
    }
    for (const std::string& id : aborts) {
      if (!tracked_.count(id)) continue;
      RequestOutput out;
      {
        std::lock_guard<std::mutex> lock(mu_);
        out.error = fatal_error_;
      }
      finish(id, sched::FinishReason::kAbort, &out);
    }
    if (stopping) return;
    if (pipeline_ && !pipeline_->failure().empty()) {
      fail_engine(pipeline_->failure());
      continue;
    }
    if (scheduler_.has_unfinished_requests() || !in_flight_.empty()) step();
  }
}

void EngineCore::fail_engine(const std::string& why) {
  LOG(ERROR) << "EngineCore failed: " << why;
  const std::string message = "EngineCore encountered an issue: " + why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dead_ = true;
    stopping_ = true;
    fatal_error_ = message;
  }
  in_flight_.clear();
  in_flight_predicted_ms_.clear();
  std::vector<std::string> ids;
  for (const auto& [id, t] : tracked_) ids.push_back(id);
  for (const std::string& id : ids) {
    RequestOutput out;
    out.error = message;
    finish(id, sched::FinishReason::kAbort, &out);
  }
  retired_.clear();
  if (config_.on_fatal) config_.on_fatal(message);
}

void EngineCore::finish(const std::string& id, sched::FinishReason reason, RequestOutput* out) {
  auto it = tracked_.find(id);
  CHECK(it != tracked_.end()) << "finish of untracked request " << id;
  Tracked& t = it->second;
  std::unique_ptr<sched::Request> r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r = reason == sched::FinishReason::kAbort ? scheduler_.abort_request(id)
                                              : scheduler_.finish_request(id, reason);
    metrics_.request_success[sched::finish_reason_name(reason)]++;
    metrics_.e2e.observe(common::now_seconds() - t.arrival);
  }
  out->request_id = id;
  out->finished = true;
  out->finish_reason = reason;
  out->num_prompt_tokens = t.num_prompt_tokens;
  out->num_output_tokens = r ? static_cast<int64_t>(r->output_token_ids.size()) : 0;
  out->num_cached_tokens = t.num_cached_tokens;
  if (reason != sched::FinishReason::kAbort) {
    // A matched stop string already cut the text; bytes held by the detokenizer lie past it.
    if (!std::holds_alternative<std::string>(out->stop_reason)) t.text += t.detokenizer->flush();
    if (t.text.size() > t.sent) out->new_text += t.text.substr(t.sent);
  }
  if (config_.log_requests) {
    const double now = common::now_seconds();
    const char* reason_text = sched::finish_reason_name(reason);
    LOG(INFO) << "Finished request " << id
              << ": finish_reason=" << (reason_text ? reason_text : "none")
              << " prompt_tokens=" << out->num_prompt_tokens
              << " output_tokens=" << out->num_output_tokens
              << " ttft_ms=" << (t.first_token > 0 ? (t.first_token - t.arrival) * 1000 : -1.0)
              << " e2e_ms=" << (now - t.arrival) * 1000;
  }
  OutputCallback cb = std::move(t.callback);
  tracked_.erase(it);
  // Steps still in flight may point at the request: keep it alive until they are consumed.
  if (r && !in_flight_.empty()) retired_.push_back(std::move(r));
  cb(*out);
}

bool EngineCore::process_token(sched::Request* r, Tracked& t, const SampledToken& s,
                               RequestOutput* out) {
  const sched::SamplingParams& p = r->sampling;
  out->new_token_ids.push_back(s.token);
  if (p.logprobs) out->new_logprobs.push_back({s.token, s.logprob, s.top_logprobs});
  const int64_t n_out = static_cast<int64_t>(r->output_token_ids.size());
  const bool past_min = n_out >= p.min_tokens;
  const bool is_eos = std::find(eos_ids_.begin(), eos_ids_.end(), s.token) != eos_ids_.end();
  if (past_min && is_eos && !p.ignore_eos) {
    out->finish_reason = sched::FinishReason::kStop;
    return true;
  }
  t.text += t.detokenizer->push(s.token);
  if (past_min && std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), s.token) !=
                      p.stop_token_ids.end()) {
    out->finish_reason = sched::FinishReason::kStop;
    out->stop_reason = s.token;
    return true;
  }
  size_t max_stop = 0;
  if (past_min) {
    for (const std::string& stop : p.stop) {
      max_stop = std::max(max_stop, stop.size());
      if (stop.empty()) continue;
      // Only new text can complete a match: search from just before the unsent tail.
      const size_t from = t.sent >= stop.size() ? t.sent - stop.size() + 1 : 0;
      const size_t pos = t.text.find(stop, from);
      if (pos != std::string::npos) {
        t.text.resize(p.include_stop_str_in_output ? pos + stop.size() : pos);
        out->finish_reason = sched::FinishReason::kStop;
        out->stop_reason = stop;
        return true;
      }
    }
  }
  if (n_out >= p.max_tokens || r->num_tokens() >= config_.scheduler.max_model_len) {
    out->finish_reason = sched::FinishReason::kLength;
    return true;
  }
  // Hold back what could still become a stop string.
  const size_t hold = max_stop > 0 ? max_stop - 1 : 0;
  if (t.text.size() > t.sent + hold) {
    const size_t upto = utf8_floor(t.text, t.text.size() - hold);
    if (upto > t.sent) {
      out->new_text += t.text.substr(t.sent, upto - t.sent);
      t.sent = upto;
    }
  }
  return false;
}

sched::SchedulerOutput EngineCore::schedule_step() {
  sched::SchedulerOutput so;
  std::lock_guard<std::mutex> lock(mu_);
  so = scheduler_.schedule();
  metrics_.preemptions += so.num_preempted;
  if (!so.empty())
    metrics_.iteration_tokens.observe(static_cast<double>(so.total_num_scheduled_tokens));
  for (const auto& s : so.scheduled) {
    if (s.num_computed_tokens < s.request->num_prompt_tokens()) {
      metrics_.prompt_tokens +=
          std::min(s.num_scheduled_tokens, s.request->num_prompt_tokens() - s.num_computed_tokens);
    }
    auto it = tracked_.find(s.request->request_id);
    if (it != tracked_.end()) it->second.num_cached_tokens = s.request->num_cached_tokens;
  }
  const auto& pc = kv_.prefix_cache_stats();
  metrics_.prefix_cache_queries = pc.queries;
  metrics_.prefix_cache_hits = pc.hits;
  return so;
}

void EngineCore::step() {
  if (pipeline_) return step_pipelined();
  sched::SchedulerOutput so = schedule_step();
  if (so.empty()) {
    // Nothing fits (e.g. the cache cannot hold the oldest waiting request): wait for changes.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(5));
    return;
  }
  const double exec_start = common::now_seconds();
  auto logits = runner_->execute(so, kv_);
  std::vector<std::optional<SampledToken>> tokens(so.scheduled.size());
  for (size_t i = 0; i < so.scheduled.size(); ++i) {
    if (so.scheduled[i].samples)
      tokens[i] = worker::sample_with_spec(logits[i], sample_spec(*so.scheduled[i].request));
  }
  complete_step(so, tokens, (common::now_seconds() - exec_start) * 1000.0);
}

worker::SampleSpec EngineCore::sample_spec(const sched::Request& r) {
  std::vector<int32_t> stop_ids = r.sampling.stop_token_ids;
  if (!r.sampling.ignore_eos) stop_ids.insert(stop_ids.end(), eos_ids_.begin(), eos_ids_.end());
  // One draw from the request's generator per sampled token, wherever the sampling runs.
  return worker::make_sample_spec(r, std::move(stop_ids), tracked_.at(r.request_id).rng());
}

void EngineCore::step_pipelined() {
  // vLLM's batch queue: fill the pipeline first, then consume the oldest output.
  const size_t depth = static_cast<size_t>(pipeline_->num_stages());
  while (in_flight_.size() < depth && scheduler_.has_unfinished_requests()) {
    sched::SchedulerOutput so = schedule_step();
    if (so.empty()) break;
    worker::StepInput in = worker::make_step_input(so, kv_);
    in.step_id = next_step_id_++;
    for (size_t i = 0; i < so.scheduled.size(); ++i) {  // the last stage samples
      if (so.scheduled[i].samples) in.sequences[i].sample = sample_spec(*so.scheduled[i].request);
    }
    if (predictor_ && predictor_->ready()) {
      for (const auto& s : so.scheduled) {
        if (s.num_computed_tokens < s.request->num_prompt_tokens()) {
          in.predicted_ms +=
              predictor_->predict_time(s.num_scheduled_tokens, s.num_computed_tokens);
        }
      }
    }
    in_flight_predicted_ms_.push_back(in.predicted_ms);
    in_flight_.push_back(std::move(so));
    if (auto st = pipeline_->submit(std::move(in)); !st.ok()) return fail_engine(st.message());
  }
  if (in_flight_.empty()) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(5));
    return;
  }
  auto result = pipeline_->wait_oldest();
  if (!result.ok()) return fail_engine(result.status().message());
  auto& out = *result;
  sched::SchedulerOutput so = std::move(in_flight_.front());
  in_flight_.pop_front();
  const double predicted = in_flight_predicted_ms_.front();
  in_flight_predicted_ms_.pop_front();
  if (predicted > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    metrics_.cpp_predicted_ms_sum += predicted;
    metrics_.cpp_measured_ms_sum += timing_ms(out);
    ++metrics_.cpp_steps;
  }
  complete_step(so, out.tokens, timing_ms(out));
  if (in_flight_.empty()) retired_.clear();
}

void EngineCore::complete_step(const sched::SchedulerOutput& so,
                               const std::vector<std::optional<SampledToken>>& sampled_tokens,
                               double exec_ms) {
  const bool timing = predictor_ && predictor_->ready() && predictor_->need_timing();
  if (timing) {  // CPP online calibration: (chunk, history) of every scheduled request
    std::vector<std::pair<int64_t, int64_t>> chunks;
    for (const auto& s : so.scheduled)
      chunks.emplace_back(s.num_scheduled_tokens, s.num_computed_tokens);
    std::vector<std::string> log;
    {
      std::lock_guard<std::mutex> lock(mu_);  // metrics() reads the fit
      predictor_->record_step(chunks, exec_ms, &log);
    }
    for (const std::string& line : log) LOG(INFO) << line;
    if (!predictor_->need_timing())
      LOG(INFO) << "[ProfilingChunk] Online calibration finished; step timing is off";
  }
  std::vector<int32_t> sampled(so.scheduled.size(), -1);
  for (size_t i = 0; i < so.scheduled.size(); ++i) {
    if (!so.scheduled[i].samples || !sampled_tokens[i]) continue;
    sched::Request* r = so.scheduled[i].request;
    // A request may have finished, been aborted or been preempted while this step was in flight.
    if (r->status != sched::RequestStatus::kRunning || !tracked_.count(r->request_id)) continue;
    sampled[i] = sampled_tokens[i]->token;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    scheduler_.update(so, sampled);
  }
  const double now = common::now_seconds();
  for (size_t i = 0; i < so.scheduled.size(); ++i) {
    if (sampled[i] < 0) continue;
    sched::Request* r = so.scheduled[i].request;
    const std::string id = r->request_id;
    Tracked& t = tracked_.at(id);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++metrics_.generation_tokens;
      if (t.first_token == 0) {
        metrics_.ttft.observe(now - t.arrival);
        t.first_token = now;
      } else {
        metrics_.itl.observe(now - t.last_token);
      }
    }
    t.last_token = now;
    RequestOutput out;
    out.request_id = id;
    out.num_prompt_tokens = t.num_prompt_tokens;
    out.num_cached_tokens = t.num_cached_tokens;
    if (process_token(r, t, *sampled_tokens[i], &out)) {
      finish(id, out.finish_reason, &out);
    } else {
      out.num_output_tokens = static_cast<int64_t>(r->output_token_ids.size());
      t.callback(out);
    }
  }
}

}  // namespace engine
