// Hand-written exposition (see ecosystem.md §6: parity with prometheus_client is easier to
// control than through prometheus-cpp): HELP/TYPE lines, _total counters, cumulative buckets.
#include "server/metrics_text.h"

#include <cmath>
#include <optional>
#include <sstream>
#include <vector>

#include "common/process_memory.h"

namespace server {
namespace {

// Python float repr for the values we emit (integers get ".0").
std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::abs(v) < 1e15) {
    std::ostringstream s;
    s << static_cast<int64_t>(v) << ".0";
    return s.str();
  }
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

// Families in first-seen order, each with its HELP/TYPE once and the samples of every engine
// that reported it (Prometheus wants a family's samples together).
class Writer {
 public:
  void set_labels(std::string labels) { labels_ = std::move(labels); }
  const std::string& labels() const { return labels_; }
  void gauge(const std::string& name, const std::string& help, double v) {
    family(name, help, "gauge");
    sample(name + "{" + labels_ + "} " + num(v));
  }
  void counter(const std::string& name, const std::string& help, double v) {
    family(name, help, "counter");
    sample(name + "_total{" + labels_ + "} " + num(v));
  }
  void histogram(const std::string& name, const std::string& help, const engine::Histogram& h) {
    family(name, help, "histogram");
    uint64_t cum = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cum += h.counts[i];
      sample(name + "_bucket{" + labels_ + ",le=\"" + num(h.bounds[i]) + "\"} " + num(double(cum)));
    }
    sample(name + "_bucket{" + labels_ + ",le=\"+Inf\"} " + num(double(h.count)));
    sample(name + "_count{" + labels_ + "} " + num(double(h.count)));
    sample(name + "_sum{" + labels_ + "} " + num(h.sum));
  }
  // Starts (or returns to) a family; the samples that follow belong to it.
  void family(const std::string& name, const std::string& help, const char* type) {
    for (size_t i = 0; i < families_.size(); ++i)
      if (families_[i].name == name) {
        current_ = i;
        return;
      }
    families_.push_back(
        {name, "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n", {}});
    current_ = families_.size() - 1;
  }
  void sample(std::string line) { families_[current_].samples.push_back(std::move(line)); }
  std::string str() const {
    std::string out;
    for (const Family& f : families_) {
      out += f.head;
      for (const std::string& line : f.samples) out += line + "\n";
    }
    return out;
  }

 private:
  struct Family {
    std::string name, head;
    std::vector<std::string> samples;
  };
  std::string labels_;
  std::vector<Family> families_;
  size_t current_ = 0;
};

void render_engine(Writer& w, const engine::MetricsSnapshot& s, const std::string& model_name,
                   const std::string& engine_index,
                   const ParentRequestMetrics::Histograms* parents) {
  w.set_labels("model_name=\"" + model_name + "\",engine=\"" + engine_index + "\"");
  const engine::Metrics& m = s.totals;
  w.gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
          s.num_running);
  w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
          s.num_waiting);
  w.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
          s.kv_cache_usage);
  w.gauge("vllm:gpu_cache_usage_perc",
          "KV-cache usage (deprecated name of vllm:kv_cache_usage_perc).", s.kv_cache_usage);
  w.counter("vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            double(m.prefix_cache_queries));
  w.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
            double(m.prefix_cache_hits));
  w.counter("vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms "
            "of number of cached tokens.",
            double(m.external_prefix_cache_hits));
  w.counter("vllm:gpu_prefix_cache_queries", "Deprecated alias of vllm:prefix_cache_queries.",
            double(m.prefix_cache_queries));
  w.counter("vllm:gpu_prefix_cache_hits", "Deprecated alias of vllm:prefix_cache_hits.",
            double(m.prefix_cache_hits));
  w.counter("chunkpipe:recomputed_requests",
            "Requests a PD decoder without KV slots finished with stop_reason \"recomputed\" "
            "for the proxy to re-prefill (vllm-ascend's recompute scheduler).",
            double(m.recomputed_requests));
  const sched::KvTransferStats& kv = m.kv_transfer;
  w.counter("chunkpipe:kv_pull_bytes", "Bytes of KV cache this decoder pulled from prefillers.",
            double(kv.bytes_pulled));
  w.counter("chunkpipe:kv_pull_blocks",
            "KV blocks (per layer) this decoder pulled from prefillers.", double(kv.blocks_pulled));
  w.counter("chunkpipe:kv_pull_seconds", "Seconds spent reading remote KV blocks.",
            kv.read_seconds);
  w.counter("chunkpipe:kv_pull_failures",
            "Remote KV loads that failed or timed out (the request recomputed or failed).",
            double(kv.pulls_failed));
  w.gauge("chunkpipe:kv_pulls_in_flight", "Remote KV loads in progress.",
          double(kv.pulls_in_flight));
  w.counter("chunkpipe:kv_leases_expired",
            "Prefilled requests whose blocks were freed because no decoder released them in "
            "time (VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT).",
            double(kv.leases_expired));
  w.counter("chunkpipe:kv_late_releases",
            "DONEs from decoders for blocks this prefiller had already freed: after the lease "
            "expired, or a second release of one request.",
            double(kv.late_releases));
  w.counter("chunkpipe:dp_dummy_batches",
            "Forwards a data-parallel rank in lock step ran without work of its own, to join the "
            "collectives of ranks that had some.",
            double(m.dummy_batches));
  w.counter("chunkpipe:dp_balance_paused_steps",
            "Steps in which balance scheduling held this rank's waiting requests back, because a "
            "rank of its data-parallel group ran max_num_seqs requests.",
            double(m.balance_paused_steps));
  const engine::SpecDecodingCounters& sd = m.spec_decoding;
  if (!sd.accepted_per_pos.empty()) {  // speculative decoding is on
    w.counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.",
              double(sd.num_drafts));
    w.counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
              double(sd.num_draft_tokens));
    w.counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
              double(sd.num_accepted_tokens));
    w.family("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
             "counter");
    for (size_t p = 0; p < sd.accepted_per_pos.size(); ++p)
      w.sample("vllm:spec_decode_num_accepted_tokens_per_pos_total{" + w.labels() + ",position=\"" +
               std::to_string(p) + "\"} " + num(double(sd.accepted_per_pos[p])));
  }
  w.counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.",
            double(m.preemptions));
  w.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", double(m.prompt_tokens));
  w.counter("vllm:generation_tokens", "Number of generation tokens processed.",
            double(m.generation_tokens));
  w.family("vllm:request_success", "Count of successfully processed requests.", "counter");
  for (const char* reason : {"stop", "length", "abort"}) {
    auto it = m.request_success.find(reason);
    w.sample("vllm:request_success_total{" + w.labels() + ",finished_reason=\"" + reason + "\"} " +
             num(it == m.request_success.end() ? 0.0 : double(it->second)));
  }
  w.histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
              m.iteration_tokens);
  w.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
              m.ttft);
  w.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
              m.itl);
  w.histogram("vllm:time_per_output_token_seconds",
              "Histogram of time per output token in seconds (deprecated name).", m.itl);
  w.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
              m.e2e);
  w.histogram("vllm:request_queue_time_seconds",
              "Histogram of time spent in WAITING phase for request.", m.request_queue_time);
  w.histogram("vllm:request_inference_time_seconds",
              "Histogram of time spent in RUNNING phase for request.", m.request_inference_time);
  w.histogram("vllm:request_prefill_time_seconds",
              "Histogram of time spent in PREFILL phase for request.", m.request_prefill_time);
  w.histogram("vllm:request_decode_time_seconds",
              "Histogram of time spent in DECODE phase for request.", m.request_decode_time);
  w.histogram("vllm:request_time_per_output_token_seconds",
              "Histogram of time_per_output_token_seconds per request.",
              m.request_time_per_output_token);
  w.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
              m.request_prompt_tokens);
  w.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
              m.request_generation_tokens);
  w.histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
              m.request_params_max_tokens);
  if (parents) {
    w.histogram("vllm:request_params_n", "Histogram of the n request parameter.",
                parents->params_n);
    w.histogram("vllm:request_max_num_generation_tokens",
                "Histogram of maximum number of requested generation tokens.",
                parents->max_num_generation_tokens);
  }
  if (!s.stage_busy_seconds.empty()) {
    w.family("chunkpipe:pp_stage_busy_seconds", "Seconds each pipeline stage spent computing.",
             "counter");
    for (size_t i = 0; i < s.stage_busy_seconds.size(); ++i)
      w.sample("chunkpipe:pp_stage_busy_seconds_total{" + w.labels() + ",stage=\"" +
               std::to_string(i) + "\"} " + num(s.stage_busy_seconds[i]));
  }
  if (s.cpp_ready) {
    w.gauge("chunkpipe:cpp_target_latency_ms", "CPP target chunk latency T in milliseconds.",
            s.cpp_target_ms);
    w.gauge("chunkpipe:cpp_fit_a", "CPP latency model coefficient a (ms per token squared).",
            s.cpp_a);
    w.gauge("chunkpipe:cpp_fit_b", "CPP latency model coefficient b (ms per token).", s.cpp_b);
    w.gauge("chunkpipe:cpp_fit_c", "CPP latency model coefficient c (ms).", s.cpp_c);
    w.counter("chunkpipe:cpp_predicted_chunk_ms",
              "Predicted milliseconds of steps with prefill chunks.", m.cpp_predicted_ms_sum);
    w.counter("chunkpipe:cpp_measured_chunk_ms",
              "Measured milliseconds (last stage) of those steps.", m.cpp_measured_ms_sum);
    w.counter("chunkpipe:cpp_chunk_steps", "Steps with prefill chunks counted above.",
              double(m.cpp_steps));
  }
  w.family("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge");
  w.sample("vllm:cache_config_info{block_size=\"" + std::to_string(s.block_size) + "\",engine=\"" +
           engine_index + "\",num_gpu_blocks=\"" + std::to_string(s.num_kv_blocks) + "\"} 1.0");
}

}  // namespace

std::string render_metrics(const std::vector<engine::EngineMetrics>& engines,
                           const std::string& model_name, const ParentRequestMetrics* parents) {
  Writer w;
  // The process collector's names, as prometheus_client exports them for vLLM's API server.
  w.family("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge");
  w.sample("process_resident_memory_bytes " + num(double(common::resident_bytes())));
  w.family("chunkpipe:process_peak_resident_memory_bytes",
           "Peak resident memory size of this process in bytes.", "gauge");
  w.sample("chunkpipe:process_peak_resident_memory_bytes " +
           num(double(common::peak_resident_bytes())));
  for (const engine::EngineMetrics& e : engines) {
    std::optional<ParentRequestMetrics::Histograms> p;
    if (parents) p = parents->of_engine(e.engine_index);
    render_engine(w, e.snapshot, model_name, std::to_string(e.engine_index), p ? &*p : nullptr);
  }
  return w.str();
}

}  // namespace server
