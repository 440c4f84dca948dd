// EngineCore: request intake, the step loop, and per-token output processing.
#include "engine/engine_core.h"

#include <algorithm>
#include <limits>

#include "common/check.h"
#include "common/logging.h"
#include "common/timer.h"
#include "engine/request_log.h"
#include "sched/token_id_checks.h"

namespace engine {
namespace {

// A generator seed from the engine's seed and a request id (FNV-1a, then splitmix64).
uint64_t request_seed(uint64_t seed, const std::string& id) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

// Largest cut <= n that does not split a UTF-8 character of `s`.
size_t utf8_floor(const std::string& s, size_t n) {
  while (n > 0 && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace

EngineCore::EngineCore(std::unique_ptr<Executor> executor, const tokenizer::Tokenizer& tokenizer,
                       const EngineConfig& config)
    : tokenizer_(tokenizer),
      config_(config),
      executor_(std::move(executor)),
      kv_(static_cast<int32_t>(config.num_kv_blocks), config.block_size,
          config.enable_prefix_caching),
      scheduler_(config.scheduler, &kv_) {
  scheduler_.set_kv_connector(config_.kv_connector.get());
  const std::vector<double> token_buckets = one_two_five_buckets(config_.scheduler.max_model_len);
  for (Histogram* h : {&metrics_.request_prompt_tokens, &metrics_.request_generation_tokens,
                       &metrics_.request_params_max_tokens})
    *h = Histogram(token_buckets);
  if (const int k = config_.scheduler.num_lookahead_tokens; k > 0) {
    kv_.set_recompute_last_matched_block(true);
    metrics_.spec_decoding.accepted_per_pos.assign(static_cast<size_t>(k), 0);
  }
  start();
}

void EngineCore::start() {
  if (!config_.trace_file.empty()) executor_->enable_trace();
  if (auto eos = tokenizer_.eos_token_id()) {
    eos_ids_.push_back(*eos);
  } else if (config_.model_eos_token_id >= 0) {
    eos_ids_.push_back(config_.model_eos_token_id);
  }
  if (config_.profiling_chunk && config_.profiling_chunk->enabled) run_profiling_chunk_init();
  thread_ = std::thread([this] { loop(); });
}

double EngineCore::timing_ms(const sched::ModelRunnerOutput& out) const {
  const bool slowest = config_.profiling_chunk && config_.profiling_chunk->timing_stage == "max";
  return slowest ? out.max_stage_ms : out.last_stage_ms;
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
  if (pc.mode == sched::ProfilingChunkConfig::kPlanned) return run_planned_profiling();
  predictor_->set_merge_tail(pc.merge_tail);
  predictor_->set_chunk_align(pc.chunk_align);
  if (pc.overhead_aware && executor_->max_concurrent_batches() > 1)
    predictor_->set_overhead_aware(executor_->max_concurrent_batches());
  LOG(INFO) << "[ProfilingChunk] Scheduler initialized. base_chunk=" << base
            << ", page_size=" << config_.block_size << ", smooth_factor=" << pc.smooth_factor
            << ", min_chunk=" << pc.min_chunk;
  LOG(INFO) << "[ProfilingChunk] Running profiling initialization...";
  const auto sizes = sched::ChunkSizePredictor::profile_chunk_sizes(base);
  std::vector<std::pair<int64_t, double>> samples;
  const double t0 = common::now_seconds();
  const int total = static_cast<int>(sizes.size()) - 1;
  const bool slowest_stage = pc.timing_stage == "max";
  for (size_t i = 0; i < sizes.size(); ++i) {
    // Upstream times the last stage's own layers; timing_stage "max" takes the slowest stage.
    // A failed probe drops the sample; the step loop then sees the failure.
    auto ms = executor_->profile_ms(sizes[i], 0, sched::AttentionForm::kAuto, slowest_stage);
    if (i == 0 || !ms.ok()) continue;  // warm-up, or a failed probe
    samples.emplace_back(sizes[i], *ms);
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

std::vector<EngineCore::ProfileShape> EngineCore::planned_profile_shapes() const {
  const sched::ProfilingChunkConfig& pc = *config_.profiling_chunk;
  const int64_t B = config_.scheduler.max_num_batched_tokens;
  const int64_t min_chunk = std::clamp<int64_t>(pc.min_chunk, 1, B);
  // The longest history a chunk can follow here: the model length, less a chunk.
  const int64_t max_len = config_.scheduler.max_model_len;
  using sched::AttentionForm;
  std::vector<ProfileShape> shapes;
  auto add = [&](int64_t x, int64_t L, AttentionForm form) {
    x = std::clamp<int64_t>(x, 1, B);
    L = std::clamp<int64_t>(L, 0, std::max<int64_t>(0, max_len - x));
    const ProfileShape s{x, L, form};
    if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
  };
  // From scratch: the per-forward, per-token and self-attention terms.
  for (int64_t d : {1, 2, 4, 8, 16})
    add(std::max(B / d, min_chunk / 2), 0, AttentionForm::kExpanded);
  add(B * 3 / 4, 0, AttentionForm::kExpanded);
  add(min_chunk, 0, AttentionForm::kExpanded);
  // After history: re-expansion (per history token) against attention (per pair).
  const int64_t hist = max_len - min_chunk;
  for (int64_t L : {hist / 4, hist / 2, hist}) {
    add(min_chunk, L, AttentionForm::kExpanded);
    add(B / 2, L, AttentionForm::kExpanded);
  }
  // The absorbed form, for small chunks after long histories.
  for (int64_t L : {int64_t{0}, hist / 2, hist})
    for (int64_t x : {16, 64, 256}) add(x, L, AttentionForm::kAbsorbed);
  return shapes;
}

void EngineCore::run_planned_profiling() {
  const sched::ProfilingChunkConfig& pc = *config_.profiling_chunk;
  sched::PlanOptions plan;
  plan.max_chunk = config_.scheduler.max_num_batched_tokens;
  plan.min_chunk = std::min(pc.min_chunk, plan.max_chunk);
  plan.align = pc.chunk_align > 0 ? pc.chunk_align : 16;
  plan.num_stages = executor_->max_concurrent_batches();
  plan.min_predicted_gain = pc.min_predicted_gain;
  predictor_->set_planned(plan);
  LOG(INFO) << "[ProfilingChunk] Scheduler initialized (planned). base_chunk=" << plan.max_chunk
            << ", min_chunk=" << plan.min_chunk << ", align=" << plan.align
            << ", stages=" << plan.num_stages << ", timing_stage=" << pc.timing_stage;
  const auto shapes = planned_profile_shapes();
  LOG(INFO) << "[ProfilingChunk] Profiling " << shapes.size()
            << " chunk shapes (tokens, history, attention form)...";
  const bool slowest_stage = pc.timing_stage == "max";
  std::vector<sched::CostSample> samples;
  const double t0 = common::now_seconds();
  for (size_t i = 0; i <= shapes.size(); ++i) {
    const ProfileShape& s = shapes[i == 0 ? 0 : i - 1];  // the first shape twice: a warm-up
    auto ms = executor_->profile_ms(s.tokens, s.history, s.form, slowest_stage);
    if (i == 0 || !ms.ok()) continue;  // warm-up, or a failed probe
    samples.push_back(sched::CostSample::probe(s.form, s.tokens, s.history, *ms));
    LOG(DEBUG) << "[ProfilingChunk] chunk=" << s.tokens << " history=" << s.history << " "
               << sched::attention_form_name(s.form) << ": " << *ms << " ms";
  }
  LOG(INFO) << "[ProfilingChunk] Profiling took " << common::now_seconds() - t0 << " s";
  std::vector<std::string> log;
  {
    std::lock_guard<std::mutex> lock(mu_);  // metrics() reads the fit
    predictor_->fit_cost_model(samples, &log);
  }
  for (const std::string& line : log) LOG(INFO) << line;
  scheduler_.set_chunk_predictor(predictor_.get());
}

void EngineCore::refuse(const std::string& request_id, const std::string& why,
                        const OutputCallback& callback) const {
  LOG(WARNING) << "Request " << request_id << " refused: " << why;
  RequestOutput out;
  out.request_id = request_id;
  out.finished = true;
  out.finish_reason = sched::FinishReason::kAbort;
  out.engine_index = config_.engine_index;
  out.error = why;
  out.error_status = 400;
  callback(out);
}

void EngineCore::add_request(EngineRequest request, OutputCallback callback) {
  // Whatever sent it (the API server, a data-parallel front end), ids outside the model's rows
  // fail this request alone, before any worker sees them.
  if (config_.model_vocab_size > 0) {
    if (auto why = sched::out_of_vocab_request(request.prompt_token_ids, request.sampling,
                                               config_.model_vocab_size))
      return refuse(request.request_id, *why, callback);
  }
  auto r = std::make_unique<sched::Request>();
  r->request_id = std::move(request.request_id);
  r->prompt_token_ids = std::move(request.prompt_token_ids);
  r->sampling = std::move(request.sampling);
  r->kv_transfer_params = std::move(request.kv_transfer_params);
  r->cache_salt = std::move(request.cache_salt);
  r->recomputable = request.recomputable;
  r->priority = request.priority;
  // Logged on the caller's thread, as the client sent it (an unseeded request shows seed=None).
  if (config_.log_requests) {  // a prompt's first n ids give at most its first n characters
    const std::span<const int32_t> ids = r->prompt_token_ids;
    const size_t shown =
        config_.max_log_len < 0 ? ids.size() : std::min(ids.size(), size_t(config_.max_log_len));
    LOG(INFO) << received_request_line(r->request_id, tokenizer_.decode(ids.first(shown)), ids,
                                       r->sampling, config_.max_log_len);
  }
  // An unseeded request's generator comes from --seed and its sampling key, not from the order
  // of arrival: the same request samples the same tokens on whichever DP rank serves it.
  if (!r->sampling.seed)
    r->sampling.seed = request_seed(
        config_.seed, request.sampling_key.empty() ? r->request_id : request.sampling_key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      r->arrival_time = common::now_seconds();
      inbox_.emplace_back(std::move(r), std::move(callback));
      cv_.notify_one();
      return;
    }
  }
  RequestOutput out;
  out.request_id = r->request_id;
  out.finished = true;
  out.finish_reason = sched::FinishReason::kAbort;
  out.engine_index = config_.engine_index;
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
  if (!config_.trace_file.empty()) {
    if (auto st = executor_->write_trace(config_.trace_file); st.ok()) {
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
  s.recent_prefix_cache_queries = recent_prefix_cache_hits_.queries();
  s.recent_prefix_cache_hits = recent_prefix_cache_hits_.hits();
  const auto st = scheduler_.stats();
  s.num_running = st.num_running;
  s.num_waiting = st.num_waiting + static_cast<int32_t>(inbox_.size());
  s.kv_cache_usage = kv_.usage();
  s.num_kv_blocks = config_.num_kv_blocks;
  s.block_size = config_.block_size;
  s.stage_busy_seconds = executor_->stage_busy_seconds();
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
      // With remote workers, wake up now and then to notice one that died while idle.
      const auto idle = std::chrono::milliseconds(executor_->has_remote_workers() ? 100 : 3600000);
      // A lock-step rank waits in step_lockstep(), where the other ranks meet it.
      if (config_.dp_group == nullptr)
        cv_.wait_for(lock, idle, [&] {
          return stopping_ || !inbox_.empty() || !aborts_.empty() || scheduler_.has_requests() ||
                 !in_flight_.empty();
        });
      stopping = stopping_;
      while (!inbox_.empty()) {
        incoming.push_back(std::move(inbox_.front()));
        inbox_.pop_front();
      }
      aborts.swap(aborts_);
    }
    for (auto& [req, cb] : incoming) {
      if (tracked_.count(req->request_id)) {  // a peer reused a live id: this one fails alone
        refuse(req->request_id,
               "request id " + req->request_id + " is already running on this engine", cb);
        continue;
      }
      Tracked t;
      t.callback = std::move(cb);
      t.detokenizer = std::make_unique<tokenizer::IncrementalDetokenizer>(
          tokenizer_, req->sampling.skip_special_tokens);
      t.detokenizer->seed(req->prompt_token_ids);
      // The workers sample: they get the request's generator seed and every id that min_tokens
      // holds back.
      sched::SamplingParams& sp = req->sampling;
      sp.logprobs_mode = config_.logprobs_mode;
      sp.all_stop_token_ids = sp.stop_token_ids;
      if (!sp.ignore_eos)
        sp.all_stop_token_ids.insert(sp.all_stop_token_ids.end(), eos_ids_.begin(), eos_ids_.end());
      t.num_prompt_tokens = req->num_prompt_tokens();
      if (sp.prompt_logprobs) {
        const auto& ids = req->prompt_token_ids;
        for (size_t p = 1; p < ids.size(); ++p) {
          t.prompt_logprobs.emplace_back();
          t.prompt_logprobs.back().token = ids[p];
          t.prompt_logprobs.back().logprob = std::numeric_limits<float>::quiet_NaN();
        }
      }
      t.arrival = req->arrival_time;
      t.max_tokens = sp.max_tokens;
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
    if (const std::string why = executor_->failure(); !why.empty()) {
      fail_engine(why);
      continue;
    }
    if (config_.dp_group != nullptr) {
      step_lockstep();  // every rank steps, work or not
    } else if (scheduler_.has_requests() || !in_flight_.empty()) {
      step();
    }
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
  std::vector<std::string> ids;
  for (const auto& [id, t] : tracked_) ids.push_back(id);
  for (const std::string& id : ids) {
    RequestOutput out;
    out.error = message;
    finish(id, sched::FinishReason::kAbort, &out);
  }
  if (config_.on_fatal) config_.on_fatal(message);
}

void EngineCore::observe_finished(const Tracked& t, int64_t num_generated) {
  const double now = common::now_seconds();
  // A phase that never began counts as zero: a request aborted in the queue spent all of its
  // time there.
  const double scheduled = t.first_scheduled > 0 ? t.first_scheduled : now;
  const double first = t.first_token > 0 ? t.first_token : scheduled;
  const double last = t.last_token > 0 ? t.last_token : first;
  const double decode = last - first;
  metrics_.e2e.observe(now - t.arrival);
  metrics_.request_queue_time.observe(scheduled - t.arrival);
  metrics_.request_prefill_time.observe(first - scheduled);
  metrics_.request_decode_time.observe(decode);
  metrics_.request_inference_time.observe(last - scheduled);
  metrics_.request_time_per_output_token.observe(
      num_generated > 1 ? decode / static_cast<double>(num_generated - 1) : 0.0);
  metrics_.request_prompt_tokens.observe(static_cast<double>(t.num_prompt_tokens));
  metrics_.request_generation_tokens.observe(static_cast<double>(num_generated));
  metrics_.request_params_max_tokens.observe(static_cast<double>(t.max_tokens));
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
    observe_finished(t, r ? static_cast<int64_t>(r->output_token_ids.size()) : 0);
  }
  out->request_id = id;
  out->finished = true;
  out->engine_index = config_.engine_index;
  out->finish_reason = reason;
  out->num_prompt_tokens = t.num_prompt_tokens;
  out->num_output_tokens = r ? static_cast<int64_t>(r->output_token_ids.size()) : 0;
  out->num_cached_tokens = t.num_cached_tokens;
  if (r) out->kv_transfer_params = r->kv_handoff_params;
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
    if (config_.log_outputs) {
      const std::vector<int32_t> none;
      LOG(INFO) << generated_response_line(id, t.text, r ? r->output_token_ids : none, reason_text,
                                           config_.max_log_len);
    }
  }
  OutputCallback cb = std::move(t.callback);
  tracked_.erase(it);
  cb(*out);
}

bool EngineCore::process_token(const sched::Request& r, Tracked& t, const SampledToken& s,
                               int64_t n_out, RequestOutput* out) {
  const sched::SamplingParams& p = r.sampling;
  out->new_token_ids.push_back(s.token);
  if (p.logprobs) out->new_logprobs.push_back({s.token, s.logprob, s.top_logprobs});
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
  if (n_out >= p.max_tokens || r.num_prompt_tokens() + n_out >= config_.scheduler.max_model_len) {
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

sched::SchedulerOutput EngineCore::schedule_step(bool allow_poll, bool admit_waiting) {
  sched::SchedulerOutput so;
  std::lock_guard<std::mutex> lock(mu_);
  so = scheduler_.schedule(allow_poll, admit_waiting);
  metrics_.preemptions += so.num_preempted;
  if (!so.empty())
    metrics_.iteration_tokens.observe(static_cast<double>(so.total_num_scheduled_tokens));
  for (const auto& s : so.scheduled) {
    const sched::Request* r = scheduler_.find_request(s.req_id);
    if (r == nullptr) continue;
    if (s.num_computed_tokens < r->num_prompt_tokens()) {
      metrics_.prompt_tokens +=
          std::min(s.num_scheduled_tokens, r->num_prompt_tokens() - s.num_computed_tokens);
    }
    if (s.new_request) metrics_.external_prefix_cache_hits += r->num_external_tokens;
    auto it = tracked_.find(s.req_id);
    if (it == tracked_.end()) continue;
    it->second.num_cached_tokens = r->num_cached_tokens;
    if (it->second.first_scheduled == 0) it->second.first_scheduled = common::now_seconds();
  }
  const auto& pc = kv_.prefix_cache_stats();
  recent_prefix_cache_hits_.observe(pc.requests - prefix_cache_requests_,
                                    pc.queries - metrics_.prefix_cache_queries,
                                    pc.hits - metrics_.prefix_cache_hits);
  prefix_cache_requests_ = pc.requests;
  metrics_.prefix_cache_queries = pc.queries;
  metrics_.prefix_cache_hits = pc.hits;
  return so;
}

void EngineCore::step() {
  // vLLM's batch queue: fill the executor up to its depth, then consume the oldest output.
  const size_t depth = static_cast<size_t>(executor_->max_concurrent_batches());
  while (in_flight_.size() < depth && scheduler_.has_requests()) {
    // A connector-only step (nothing to compute) only when the executor is otherwise idle.
    InFlight f{schedule_step(/*allow_poll=*/in_flight_.empty()), 0.0};
    if (f.output.num_recomputed > 0) finish_recomputed();
    if (f.output.empty() && !f.output.kv_connector_poll) break;
    if (predictor_ && predictor_->ready()) {
      for (const auto& s : f.output.scheduled) {
        const sched::Request* r = scheduler_.find_request(s.req_id);
        if (r != nullptr && s.num_computed_tokens < r->num_prompt_tokens())
          f.predicted_ms += predictor_->predict_time(s.num_scheduled_tokens, s.num_computed_tokens);
      }
    }
    in_flight_.push_back(std::move(f));
    const StepMeta meta{next_step_id_++, in_flight_.back().predicted_ms};
    if (auto st = executor_->submit(in_flight_.back().output, meta); !st.ok())
      return fail_engine(st.message());
  }
  if (in_flight_.empty()) {
    // Nothing fits (e.g. the cache cannot hold the oldest waiting request): wait for changes.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(5));
    return;
  }
  auto result = executor_->take_oldest();
  if (!result.ok()) return fail_engine(result.status().message());
  const InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (f.predicted_ms > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    metrics_.cpp_predicted_ms_sum += f.predicted_ms;
    metrics_.cpp_measured_ms_sum += timing_ms(*result);
    ++metrics_.cpp_steps;
  }
  complete_step(f.output, *result);
  if (f.output.kv_connector_poll && result->kv_transfers.empty()) {
    // Only transfers are pending: look again in a moment (soon when a first token waits on a
    // load, less often for blocks held for a decoder), or at once when a request arrives.
    std::unique_lock<std::mutex> lock(mu_);
    const auto pause = std::chrono::milliseconds(scheduler_.has_pending_loads() ? 2 : 10);
    cv_.wait_for(lock, pause, [&] { return stopping_ || !inbox_.empty() || !aborts_.empty(); });
  }
}

void EngineCore::step_lockstep() {
  // Balance scheduling (vllm-ascend's DP admission gate): the ranks first share how many
  // requests each runs; while any runs max_num_seqs, none admits a waiting request.
  bool admit_waiting = true;
  if (config_.balance_scheduling) {
    int64_t most_running;
    {
      std::lock_guard<std::mutex> lock(mu_);
      most_running = scheduler_.num_running();
    }
    if (auto st = config_.dp_group->all_reduce(&most_running, 1, dist::ReduceOp::kMax); !st.ok())
      return fail_engine("the data-parallel group failed: " + st.message());
    admit_waiting = most_running < config_.scheduler.max_num_seqs;
  }
  sched::SchedulerOutput so = schedule_step(/*allow_poll=*/true, admit_waiting);
  if (!admit_waiting) {
    std::lock_guard<std::mutex> lock(mu_);
    if (scheduler_.stats().num_waiting > 0) ++metrics_.balance_paused_steps;  // held one back
  }
  if (so.num_recomputed > 0) finish_recomputed();
  // vLLM all-reduces token counts every forward and "anything unfinished?" every 32 steps;
  // here one all-reduce per step carries both (it costs microseconds on shared memory).
  bool unfinished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    unfinished = scheduler_.has_requests() || !inbox_.empty();
  }
  int64_t agree[2] = {so.total_num_scheduled_tokens, unfinished ? 1 : 0};
  if (auto st = config_.dp_group->all_reduce(agree, 2, dist::ReduceOp::kMax); !st.ok())
    return fail_engine("the data-parallel group failed: " + st.message());
  const bool computes = so.total_num_scheduled_tokens > 0;
  if (agree[0] > 0 && !computes) {  // another rank computes: join its collectives
    if (auto st = executor_->execute_dummy_batch(); !st.ok()) return fail_engine(st.message());
    std::lock_guard<std::mutex> lock(mu_);
    ++metrics_.dummy_batches;
  }
  if (!so.empty() || so.kv_connector_poll) {
    in_flight_.push_back(InFlight{std::move(so), 0.0});
    const StepMeta meta{next_step_id_++, 0.0};
    if (auto st = executor_->submit(in_flight_.back().output, meta); !st.ok())
      return fail_engine(st.message());
    auto result = executor_->take_oldest();
    if (!result.ok()) return fail_engine(result.status().message());
    const InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    complete_step(f.output, *result);
  }
  if (agree[0] == 0) {
    // Nobody computed: the wave is over (nothing unfinished anywhere) or every rank waits (for
    // KV, for remote blocks). Pause briefly; a new request ends the pause here, and the other
    // ranks meet this one at the next all-reduce.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(agree[1] > 0 ? 2 : 5),
                 [&] { return stopping_ || !inbox_.empty() || !aborts_.empty(); });
  }
}

void EngineCore::finish_load_failures() {
  std::vector<std::pair<std::unique_ptr<sched::Request>, std::string>> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed = scheduler_.take_load_failures();
  }
  for (auto& [r, why] : failed) {
    if (!tracked_.count(r->request_id)) continue;
    LOG(WARNING) << "Request " << r->request_id << " failed: its remote KV did not load (" << why
                 << "); kv_load_failure_policy is 'fail'";
    RequestOutput out;
    out.error = "the prompt's KV cache could not be loaded from the prefill instance: " + why;
    finish(r->request_id, sched::FinishReason::kAbort, &out);
  }
}

void EngineCore::finish_rejected(const std::vector<sched::RejectedRequest>& rejected) {
  for (const sched::RejectedRequest& r : rejected) {
    if (!tracked_.count(r.req_id)) continue;  // aborted while its step was in flight
    LOG(ERROR) << "Request " << r.req_id << " failed: the workers refused it (" << r.why
               << "); the engine serves on";
    RequestOutput out;
    out.error = "the workers refused this request: " + r.why;
    out.error_status = 500;
    finish(r.req_id, sched::FinishReason::kAbort, &out);
  }
}

void EngineCore::finish_recomputed() {
  std::vector<std::unique_ptr<sched::Request>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone = scheduler_.take_recomputed();
    metrics_.recomputed_requests += static_cast<int64_t>(gone.size());
  }
  for (auto& r : gone) {
    auto it = tracked_.find(r->request_id);
    if (it == tracked_.end()) continue;
    Tracked& t = it->second;
    // vllm-ascend's recompute scheduler: finish_reason stop, stop_reason "recomputed", no new
    // token; the proxy re-prefills the request on another pair from what it has received.
    RequestOutput out;
    out.request_id = r->request_id;
    out.finished = true;
    out.finish_reason = sched::FinishReason::kStop;
    out.engine_index = config_.engine_index;
    // No flush: a character the last tokens began is finished by the next round, whose
    // prompt ends with these tokens (IncrementalDetokenizer::seed).
    if (t.text.size() > t.sent) out.new_text = t.text.substr(t.sent);
    out.stop_reason = std::string("recomputed");
    out.num_prompt_tokens = t.num_prompt_tokens;
    out.num_output_tokens = static_cast<int64_t>(r->output_token_ids.size());
    out.num_cached_tokens = t.num_cached_tokens;
    out.kv_transfer_params = r->kv_handoff_params;
    {
      std::lock_guard<std::mutex> lock(mu_);
      metrics_.request_success["stop"]++;
      observe_finished(t, static_cast<int64_t>(r->output_token_ids.size()));
    }
    LOG(INFO) << "Request " << r->request_id << " recomputed: no KV slots for it on this decoder";
    OutputCallback cb = std::move(t.callback);
    tracked_.erase(it);
    cb(out);
  }
}

void EngineCore::log_spec_decoding(double now) {
  if (config_.scheduler.num_lookahead_tokens == 0) return;
  if (spec_logged_at_ == 0) spec_logged_at_ = now;
  if (now - spec_logged_at_ < kSpecDecodingLogSeconds) return;
  std::string line;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const engine::SpecDecodingCounters& c = metrics_.spec_decoding;
    if (c.num_drafts != spec_logged_.num_drafts)
      line = c.log_line(spec_logged_, now - spec_logged_at_);
    spec_logged_ = c;
  }
  spec_logged_at_ = now;
  if (!line.empty()) LOG(INFO) << line;
}

void EngineCore::complete_step(const sched::SchedulerOutput& so,
                               const sched::ModelRunnerOutput& result) {
  const bool timing = predictor_ && predictor_->ready() && predictor_->need_timing();
  if (timing && predictor_->planned()) {
    // Refinement: steps whose chunks all ran in one form chosen by the cost model (a decode,
    // whose form the model picks, makes the step unattributable).
    std::vector<std::pair<int64_t, int64_t>> chunks;
    const sched::AttentionForm form =
        so.scheduled.empty() ? sched::AttentionForm::kAuto : so.scheduled[0].attention_form;
    bool one_form = form != sched::AttentionForm::kAuto;
    for (const auto& s : so.scheduled) {
      one_form = one_form && s.attention_form == form;
      chunks.emplace_back(s.num_scheduled_tokens, s.num_computed_tokens);
    }
    std::vector<std::string> log;
    if (one_form) {
      std::lock_guard<std::mutex> lock(mu_);
      predictor_->record_planned_step(chunks, form, timing_ms(result), &log);
    }
    for (const std::string& line : log) LOG(INFO) << line;
  } else if (timing) {  // CPP online calibration: (chunk, history) of every scheduled request
    std::vector<std::pair<int64_t, int64_t>> chunks;
    for (const auto& s : so.scheduled)
      chunks.emplace_back(s.num_scheduled_tokens, s.num_computed_tokens);
    std::vector<std::string> log;
    {
      std::lock_guard<std::mutex> lock(mu_);  // metrics() reads the fit
      predictor_->record_step(chunks, timing_ms(result), &log);
    }
    for (const std::string& line : log) LOG(INFO) << line;
    if (!predictor_->need_timing())
      LOG(INFO) << "[ProfilingChunk] Online calibration finished; step timing is off";
  }
  // Before the scheduler's update: a refused request's blocks hold no KV and must never reach
  // the prefix cache.
  finish_rejected(result.rejected);
  collect_prompt_logprobs(so, result);
  std::vector<std::vector<int32_t>> sampled(so.scheduled.size());
  for (size_t i = 0; i < so.scheduled.size(); ++i) {
    if (!so.scheduled[i].samples) continue;
    for (const SampledToken& t : result.sampled[i]) sampled[i].push_back(t.token);
  }
  std::vector<int32_t> appended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    appended = scheduler_.update(so, sampled, result.draft_token_ids);
    scheduler_.update_kv_transfers(result.kv_transfers);
    sched::KvTransferStats& m = metrics_.kv_transfer;
    m.pulls_in_flight = 0;  // a gauge: this report's value replaces the last
    m += result.kv_transfers.stats;
    // Drafts count as vLLM counts them: before stop conditions cut the accepted tokens.
    for (size_t i = 0; i < so.scheduled.size(); ++i) {
      const size_t num_spec = so.scheduled[i].spec_token_ids.size();
      if (appended[i] > 0 && num_spec > 0)
        metrics_.spec_decoding.observe(static_cast<int64_t>(num_spec), appended[i] - 1);
    }
  }
  if (!result.kv_transfers.failed_recving.empty()) finish_load_failures();
  const double now = common::now_seconds();
  log_spec_decoding(now);
  for (size_t i = 0; i < so.scheduled.size(); ++i) {
    if (appended[i] == 0) continue;
    const std::string& id = so.scheduled[i].req_id;
    const sched::Request* r = scheduler_.find_request(id);
    auto tracked = tracked_.find(id);
    CHECK(r != nullptr && tracked != tracked_.end()) << "a token for an unknown request " << id;
    Tracked& t = tracked->second;
    {
      std::lock_guard<std::mutex> lock(mu_);
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
    out.prompt_logprobs = std::move(t.prompt_logprobs);  // non-empty on the first output only
    t.prompt_logprobs.clear();
    // The step's tokens in order, each through the stop checks: one that stops the request
    // drops the tokens after it (accepted drafts past a stop string, EOS or max_tokens).
    const size_t before = r->output_token_ids.size() - static_cast<size_t>(appended[i]);
    bool finished = false;
    size_t j = 0;
    while (j < static_cast<size_t>(appended[i]) && !finished) {
      finished =
          process_token(*r, t, result.sampled[i][j], static_cast<int64_t>(before + j + 1), &out);
      ++j;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      metrics_.generation_tokens += static_cast<int64_t>(j);
      if (finished) scheduler_.truncate_output(id, before + j);
    }
    if (finished) {
      finish(id, out.finish_reason, &out);
    } else {
      out.num_output_tokens = static_cast<int64_t>(r->output_token_ids.size());
      t.callback(out);
    }
  }
}

void EngineCore::collect_prompt_logprobs(const sched::SchedulerOutput& so,
                                         const sched::ModelRunnerOutput& out) {
  for (size_t i = 0; i < so.scheduled.size() && i < out.prompt_logprobs.size(); ++i) {
    const std::vector<SampledToken>& entries = out.prompt_logprobs[i];
    if (entries.empty()) continue;
    auto it = tracked_.find(so.scheduled[i].req_id);
    if (it == tracked_.end()) continue;
    std::vector<SampledToken>& filed = it->second.prompt_logprobs;  // empty once delivered
    // Entry j scores position num_computed + j, that is prompt token num_computed + j + 1.
    const size_t first = static_cast<size_t>(so.scheduled[i].num_computed_tokens);
    for (size_t j = 0; j < entries.size() && first + j < filed.size(); ++j) {
      if (entries[j].token == filed[first + j].token) filed[first + j] = entries[j];
    }
  }
}

}  // namespace engine
