// The messages that flow around the pipeline ring (engine -> stage 0 -> ... -> last -> engine),
// FIFO on every link: a step (its SchedulerOutput plus the timings each stage adds; payload =
// hidden states; after the last stage, the sampled tokens), a profiling probe, the start-up
// hello, a dummy batch (data-parallel lock step) and shutdown. Pure encode/decode functions;
// decoding validates sizes.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/status.h"
#include "dist/communicator.h"
#include "sched/scheduler_output.h"

namespace worker {

enum class StageMessageKind : uint8_t {
  kHello = 1,
  kStep = 2,
  kProfile = 3,
  kShutdown = 4,
  kDummy = 5,  // every rank runs a one-token forward whose output is dropped
};

struct StageTiming {
  int32_t stage = 0;
  double start_s = 0;  // CLOCK_MONOTONIC seconds of the stage's host
  double duration_s = 0;
};

struct StepEnvelope {
  int64_t step_id = 0;
  double predicted_ms = 0;  // CPP's predicted time of the step's prefill chunks (0: none)
  sched::SchedulerOutput output;
  std::vector<StageTiming> timings;  // one per stage passed so far
  // Set by the last stage: entry i is sequence i's tokens (sched::ModelRunnerOutput::sampled)
  // and its drafts for the next step (speculative decoding).
  std::vector<std::vector<sched::SampledToken>> sampled;
  std::vector<std::vector<sched::SampledToken>> prompt_logprobs;  // ModelRunnerOutput's
  std::vector<std::vector<int32_t>> draft_token_ids;
  // Set by the last stage: the requests the workers refused (ModelRunnerOutput::rejected).
  std::vector<sched::RejectedRequest> rejected;
  // Set by the last stage: its KV connector's completed transfers.
  sched::KvTransferReport transfers;  // every stage appends its connector's report
};

// A CPP profiling probe: stage `stage` times a from-scratch prefill of num_tokens dummy tokens.
struct ProfileProbe {
  int32_t stage = 0;
  int64_t num_tokens = 0;
  int64_t history = 0;  // cached tokens before the chunk
  sched::AttentionForm form = sched::AttentionForm::kAuto;
  double ms = -1;  // filled in by that stage
};

// Start-up handshake: every stage appends itself once its model slice is loaded.
struct Hello {
  std::vector<int32_t> stages;
  std::vector<int32_t> pids;
  std::vector<int64_t> num_blocks;  // each stage's KV cache size in blocks
};

common::Result<StageMessageKind> message_kind(const dist::Message& m);

// Bytes of `output` on the wire (the step message's size, for benchmarks).
size_t encoded_size(const sched::SchedulerOutput& output);

dist::Message encode_step(const StepEnvelope& step, std::vector<float> payload);
common::Status decode_step(const dist::Message& m, StepEnvelope* step);
dist::Message encode_profile(const ProfileProbe& probe);
common::Status decode_profile(const dist::Message& m, ProfileProbe* probe);
dist::Message encode_hello(const Hello& hello);
common::Status decode_hello(const dist::Message& m, Hello* hello);
dist::Message encode_shutdown();
dist::Message encode_dummy();

}  // namespace worker
