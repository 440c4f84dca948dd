// Fuzz target: a pipeline message as a stage receives it from another process (possibly another
// host): decoding must succeed or fail with a Status, and a decoded step either is refused by
// the worker's request states or yields a forward batch whose every token and block is in range.
#include <cstddef>
#include <cstdint>

#include "worker/request_states.h"
#include "worker/stage_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int64_t kVocab = 512, kBlocks = 16;
  constexpr int kBlockSize = 4;
  dist::Message m;
  m.meta.assign(data, data + size);
  auto kind = worker::message_kind(m);
  if (!kind.ok()) return 0;
  if (*kind == worker::StageMessageKind::kProfile) {
    worker::ProfileProbe probe;
    (void)worker::decode_profile(m, &probe);
    return 0;
  }
  if (*kind == worker::StageMessageKind::kHello) {
    worker::Hello hello;
    (void)worker::decode_hello(m, &hello);
    return 0;
  }
  worker::StepEnvelope step;
  if (!worker::decode_step(m, &step).ok()) return 0;
  worker::RequestStates states(kVocab, kBlocks, kBlockSize);
  std::vector<worker::CachedRequestState*> applied;
  if (!states.apply(step.output, &applied).ok()) return 0;
  const model::ForwardBatch batch = worker::RequestStates::forward_batch(step.output, applied);
  for (const model::SequenceChunk& s : batch.sequences) {
    for (int32_t t : s.token_ids)
      if (t < 0 || t >= kVocab) __builtin_trap();
    const int64_t end = s.num_computed_tokens + static_cast<int64_t>(s.token_ids.size());
    if (end > static_cast<int64_t>(s.block_table.size()) * kBlockSize) __builtin_trap();
    for (int32_t b : s.block_table)
      if (b < 0 || b >= kBlocks) __builtin_trap();
  }
  return 0;
}
