// Prints the bytes of the step message the engine sends to pipeline stage 0 (encode_step of the
// SchedulerOutput, exactly what PipelineExecutor::submit sends), step by step, for
//   1. one 32k-token prompt chunked at 1024 tokens, then a few decode steps;
//   2. decode steps of 64 running requests (1k-token prompts).
// Beside each figure, the bytes the previous message layout (each step's chunk tokens and the
// whole block table of every sequence) would have sent. No model runs: the scheduler drives.
// Usage: step_message_bench [PROMPT_TOKENS] [CHUNK] [DECODE_REQUESTS]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>

#include "kv/kv_cache_manager.h"
#include "sched/scheduler.h"
#include "worker/stage_protocol.h"

namespace {

size_t step_bytes(const sched::SchedulerOutput& so) {
  worker::StepEnvelope step;
  step.output = so;
  return worker::encode_step(step, {}).meta.size();
}

// The layout before the engine seams: per sequence its chunk's token ids, num_computed, the whole
// block table and a sampling flag (sampling parameters not counted).
size_t old_layout_bytes(const sched::SchedulerOutput& so, const kv::KvCacheManager& kv) {
  size_t bytes = 1 + 8 + 8 + 8;
  for (const auto& s : so.scheduled) {
    bytes += 8 + 4 * static_cast<size_t>(s.num_scheduled_tokens) + 8 + 8 +
             4 * kv.block_table(s.req_id).size() + 1;
  }
  return bytes;
}

std::unique_ptr<sched::Request> request(const std::string& id, int64_t tokens) {
  auto r = std::make_unique<sched::Request>();
  r->request_id = id;
  r->prompt_token_ids.resize(static_cast<size_t>(tokens));
  std::iota(r->prompt_token_ids.begin(), r->prompt_token_ids.end(), 1);
  r->sampling.max_tokens = 1 << 20;
  return r;
}

void run(sched::Scheduler& s, const kv::KvCacheManager& kv, int steps, const char* what) {
  std::printf("%s\n%6s %10s %10s %12s\n", what, "step", "tokens", "bytes", "old layout");
  for (int i = 0; i < steps; ++i) {
    sched::SchedulerOutput so = s.schedule();
    if (so.empty()) break;
    std::printf("%6d %10lld %10zu %12zu\n", i,
                static_cast<long long>(so.total_num_scheduled_tokens), step_bytes(so),
                old_layout_bytes(so, kv));
    std::vector<int32_t> sampled;
    for (const auto& r : so.scheduled) sampled.push_back(r.samples ? 7 : -1);
    s.update(so, sampled);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t prompt = argc > 1 ? std::atoll(argv[1]) : 32768;
  const int64_t chunk = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int decoders = argc > 3 ? std::atoi(argv[3]) : 64;
  const int block = 16;
  {
    kv::KvCacheManager kv(static_cast<int32_t>((prompt + 64) / block + 8), block, false);
    sched::Scheduler s({chunk, 4, prompt + 64}, &kv);
    s.add_request(request("long", prompt));
    run(s, kv, static_cast<int>((prompt + chunk - 1) / chunk) + 4,
        ("one prompt of " + std::to_string(prompt) + " tokens in chunks of " +
         std::to_string(chunk) + ", then decode")
            .c_str());
  }
  {
    const int64_t each = 1024;
    kv::KvCacheManager kv(static_cast<int32_t>(decoders * ((each + 128) / block + 2)), block,
                          false);
    sched::Scheduler s({each * decoders, decoders, each + 128}, &kv);
    for (int i = 0; i < decoders; ++i) s.add_request(request("r" + std::to_string(i), each));
    run(s, kv, 6,
        (std::to_string(decoders) + " requests of " + std::to_string(each) +
         " prompt tokens: the prefill step, then decode steps")
            .c_str());
  }
  return 0;
}
