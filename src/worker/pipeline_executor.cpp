// Stage threads and the hand-over of hidden states between them.
#include "worker/pipeline_executor.h"

#include <algorithm>
#include <cstdio>

#include "common/check.h"
#include "common/timer.h"

namespace worker {

common::Result<std::vector<std::pair<int, int>>> partition_layers(int num_layers, int num_stages,
                                                                  const std::vector<int>& counts) {
  std::vector<std::pair<int, int>> ranges;
  if (!counts.empty()) {
    if (static_cast<int>(counts.size()) != num_stages) {
      return common::invalid_argument("the layer partition has " + std::to_string(counts.size()) +
                                      " entries for " + std::to_string(num_stages) +
                                      " pipeline stages");
    }
    int begin = 0, total = 0;
    for (int c : counts) {
      if (c <= 0) return common::invalid_argument("every pipeline stage needs at least one layer");
      total += c;
    }
    if (total != num_layers) {
      return common::invalid_argument("the layer partition covers " + std::to_string(total) +
                                      " layers but the model has " + std::to_string(num_layers));
    }
    for (int c : counts) {
      ranges.emplace_back(begin, begin + c);
      begin += c;
    }
    return ranges;
  }
  if (num_stages > num_layers) {
    return common::invalid_argument(std::to_string(num_stages) + " pipeline stages for " +
                                    std::to_string(num_layers) + " layers");
  }
  const int base = num_layers / num_stages, rem = num_layers % num_stages;
  int begin = 0;
  for (int s = 0; s < num_stages; ++s) {
    const int n = base + (s < rem ? 1 : 0);
    ranges.emplace_back(begin, begin + n);
    begin += n;
  }
  return ranges;
}

common::Result<std::unique_ptr<PipelineExecutor>> PipelineExecutor::create(
    const std::string& model_dir, int num_stages, const std::vector<int>& layer_counts,
    int threads_per_stage, int64_t num_blocks, int block_size, bool pin_stages,
    bool expanded_kv_cache) {
  CP_ASSIGN_OR_RETURN(model::ModelConfig config, model::load_model_config(model_dir));
  std::unique_ptr<PipelineExecutor> ex(new PipelineExecutor());
  CP_ASSIGN_OR_RETURN(ex->ranges_,
                      partition_layers(config.num_hidden_layers, num_stages, layer_counts));
  for (int s = 0; s < num_stages; ++s) {
    auto stage = std::make_unique<Stage>();
    stage->index = s;
    model::LoadOptions opts;
    opts.layer_begin = ex->ranges_[s].first;
    opts.layer_end = ex->ranges_[s].second;
    opts.load_embedding = s == 0;
    opts.load_head = s == num_stages - 1;
    opts.load_mtp = false;
    CP_ASSIGN_OR_RETURN(stage->model, model::DeepseekV3Model::load(model_dir, opts));
    stage->cache = std::make_unique<model::LatentKvCache>(
        config.num_total_layers(), opts.layer_begin, opts.layer_end, num_blocks, block_size,
        config.kv_cache_row_dim(), expanded_kv_cache ? config.expanded_kv_row_dim() : 0);
    stage->pool = std::make_unique<common::ThreadPool>(threads_per_stage);
    if (pin_stages) {  // stage s on cores [s·t, (s+1)·t) (wrapping when stages outnumber cores)
      const int ncpu = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
      for (int t = 0; t < threads_per_stage; ++t)
        stage->cpus.push_back((s * threads_per_stage + t) % ncpu);
    }
    ex->stages_.push_back(std::move(stage));
  }
  for (auto& stage : ex->stages_) {
    Stage* st = stage.get();
    st->thread = std::thread([raw = ex.get(), st] { raw->stage_loop(*st); });
  }
  return ex;
}

PipelineExecutor::~PipelineExecutor() {
  for (auto& s : stages_) {
    std::lock_guard<std::mutex> lock(s->mu);
    stopping_ = true;
    s->cv.notify_all();
  }
  for (auto& s : stages_) {
    if (s->thread.joinable()) s->thread.join();
  }
}

void PipelineExecutor::submit(StepInput input) {
  Job job;
  job.input = std::make_shared<StepInput>(std::move(input));
  ++in_flight_;
  Stage& first = *stages_.front();
  std::lock_guard<std::mutex> lock(first.mu);
  first.queue.push_back(std::move(job));
  first.cv.notify_one();
}

PipelineExecutor::StepOutput PipelineExecutor::wait_oldest() {
  CHECK(in_flight_ > 0) << "wait_oldest with nothing in flight";
  std::unique_lock<std::mutex> lock(out_mu_);
  out_cv_.wait(lock, [&] { return !outputs_.empty(); });
  Job job = std::move(outputs_.front());
  outputs_.pop_front();
  --in_flight_;
  return {std::move(job.logits), job.last_stage_ms, job.max_stage_ms};
}

void PipelineExecutor::stage_loop(Stage& s) {
  s.pool->pin_threads(s.cpus);  // from the stage thread, which is the pool's thread 0
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      s.cv.wait(lock, [&] { return stopping_ || !s.queue.empty(); });
      if (stopping_) return;
      job = std::move(s.queue.front());
      s.queue.pop_front();
    }
    const double t0 = common::now_seconds();
    run_stage(s, job);
    const double dt = common::now_seconds() - t0;
    job.last_stage_ms = dt * 1000.0;
    job.max_stage_ms = std::max(job.max_stage_ms, dt * 1000.0);
    s.busy_seconds.store(s.busy_seconds.load() + dt);
    if (tracing_) {
      int64_t tokens = 0, history = 0;
      for (const auto& seq : job.input->sequences) {
        tokens += static_cast<int64_t>(seq.token_ids.size());
        history += seq.num_computed_tokens;
      }
      std::lock_guard<std::mutex> lock(trace_mu_);
      trace_.push_back({s.index, job.input->step_id, t0, dt, job.input->predicted_ms, tokens,
                        history, static_cast<int64_t>(job.input->sequences.size())});
    }
    if (s.index + 1 < num_stages()) {
      Stage& next = *stages_[s.index + 1];
      std::lock_guard<std::mutex> lock(next.mu);
      next.queue.push_back(std::move(job));
      next.cv.notify_one();
    } else {
      std::lock_guard<std::mutex> lock(out_mu_);
      outputs_.push_back(std::move(job));
      out_cv_.notify_one();
    }
  }
}

void PipelineExecutor::run_stage(Stage& s, Job& job) {
  const StepInput& in = *job.input;
  const model::ForwardBatch batch = to_forward_batch(in);
  if (s.index == 0) {
    job.hidden.assign(batch.num_tokens() * s.model->config().hidden_size, 0.0f);
    s.model->embed(batch, job.hidden.data());
  }
  s.model->run_layers(batch, ranges_[s.index].first, ranges_[s.index].second, job.hidden.data(),
                      *s.cache, *s.pool);
  if (s.index + 1 == num_stages())
    job.logits = logits_for_samples(*s.model, in, job.hidden.data(), *s.pool);
}

common::Status PipelineExecutor::write_trace(const std::string& path) const {
  std::lock_guard<std::mutex> lock(trace_mu_);
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
  std::vector<double> out;
  for (const auto& s : stages_) out.push_back(s->busy_seconds.load());
  return out;
}

double PipelineExecutor::profile_stage_ms(int stage, int64_t num_tokens) {
  Stage& s = *stages_[stage];
  const int64_t n =
      std::clamp<int64_t>(num_tokens, 1, s.cache->num_blocks() * s.cache->block_size());
  Job job;
  job.input = std::make_shared<StepInput>(
      dummy_prefill(n, s.model->config().vocab_size, s.cache->block_size()));
  job.hidden.assign(n * s.model->config().hidden_size, 0.0f);  // non-first stages: zero input
  const double t0 = common::now_seconds();
  run_stage(s, job);
  return (common::now_seconds() - t0) * 1000.0;
}

}  // namespace worker
