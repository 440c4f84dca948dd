// ModelRunner's speculative decoding with the MTP layers (w8a8-mtp.md Part 2): verification of a
// request's drafts against the target's logits, and the drafter. Drafts are greedy. Step 0 runs
// MTP on every row the step computed and kept (its latent KV at those positions; rows after a
// rejection are skipped); steps 1 .. k-1 run one row per drafting request, at positions the next
// step rewrites, and recycle the MTP hidden state after shared_head.norm.
#include <algorithm>

#include "common/check.h"
#include "worker/model_runner.h"
#include "worker/sampler.h"

namespace worker {

std::vector<sched::SampledToken> ModelRunner::sample_request(CachedRequestState& st,
                                                             const std::vector<int32_t>& spec,
                                                             const float* logits) {
  const int64_t V = model_.config().vocab_size;
  std::vector<sched::SampledToken> tokens;
  // The penalties and min_tokens see each accepted draft as an output before the next one.
  std::vector<int32_t> history;
  if (!spec.empty()) history.assign(st.outputs().begin(), st.outputs().end());
  for (size_t j = 0; j <= spec.size(); ++j) {
    std::vector<float> row(logits + static_cast<int64_t>(j) * V,
                           logits + static_cast<int64_t>(j + 1) * V);
    std::mt19937_64 rng(st.generator());  // one draw per token position, wherever it runs
    const TokenHistory seen{st.prompt(), spec.empty() ? st.outputs() : std::span(history)};
    if (j == spec.size()) {  // every draft accepted (or none): the bonus token
      tokens.push_back(sample_token(row, st.sampling, seen, rng));
      break;
    }
    VerifiedToken v = verify_draft(row, st.sampling, seen, spec[j], rng);
    tokens.push_back(std::move(v.sampled));
    if (!v.accepted) break;
    history.push_back(spec[j]);
  }
  return tokens;
}

common::Status ModelRunner::propose_drafts(const sched::SchedulerOutput& output,
                                           const std::vector<CachedRequestState*>& states,
                                           const model::ForwardBatch& batch,
                                           const std::vector<float>& normed, StepResult* result) {
  const int64_t H = model_.config().hidden_size, V = model_.config().vocab_size;
  const int64_t T = batch.num_tokens();
  const int num_mtp = model_.num_mtp_layers();
  // Step 0's next token of each row: the one at the row's position + 1, from the known tokens,
  // then the tokens this step emitted.
  struct Drafting {
    size_t entry;
    int64_t row;       // step 0's row whose output drafts the first token
    int64_t position;  // that row's position; step s runs at position + s
  };
  // Rows after a rejection are left out: their MTP KV would be rewritten by the next step.
  model::ForwardBatch step0;
  std::vector<int32_t> next;
  std::vector<float> prev;  // the kept rows of `normed`
  std::vector<Drafting> drafting;
  int64_t row = 0;
  for (size_t i = 0; i < output.scheduled.size(); ++i) {
    const sched::ScheduledRequest& s = output.scheduled[i];
    const CachedRequestState& st = *states[i];
    const int64_t known = static_cast<int64_t>(st.token_ids.size());
    const std::vector<sched::SampledToken>& emitted = result->sampled[i];
    int64_t keep = s.num_scheduled_tokens;
    if (s.samples && !emitted.empty())
      keep = known + static_cast<int64_t>(emitted.size()) - 1 - s.num_computed_tokens;
    const int64_t first_kept = static_cast<int64_t>(next.size());
    for (int64_t j = 0; j < keep; ++j) {
      const int64_t after = s.num_computed_tokens + j + 1 - known;  // index past the known ones
      next.push_back(after < 0 ? st.token_ids[static_cast<size_t>(s.num_computed_tokens + j + 1)]
                               : emitted[static_cast<size_t>(after)].token);
    }
    prev.insert(prev.end(), normed.begin() + row * H, normed.begin() + (row + keep) * H);
    model::SequenceChunk chunk = batch.sequences[i];
    chunk.token_ids = chunk.token_ids.subspan(0, static_cast<size_t>(keep));
    step0.sequences.push_back(chunk);
    if (s.samples && !emitted.empty())
      drafting.push_back({i, first_kept + keep - 1, s.num_computed_tokens + keep - 1});
    row += s.num_scheduled_tokens;
  }
  CHECK(row == T) << "the batch and the step disagree";
  std::vector<float> mtp_hidden(next.size() * static_cast<size_t>(H));
  CP_RETURN_IF_ERROR(model_.mtp_forward(step0, prev.data(), /*from_main=*/true, next, cache_, pool_,
                                        mtp_hidden.data(), 0));
  // Each draft step: the drafting rows' logits, argmax, then (but for the last) one MTP row per
  // request at the next position. A collective head or MoE (lock step) runs on every rank the
  // same number of times, so a rank without drafting rows still calls them (the head with no
  // rows, the layer on a padding row in the dummy block).
  std::vector<float> h(drafting.size() * H);
  for (size_t d = 0; d < drafting.size(); ++d)
    std::copy_n(mtp_hidden.begin() + drafting[d].row * H, H, h.begin() + d * H);
  const bool lockstep = model_.needs_lockstep();
  for (int step = 0; step < num_spec_; ++step) {
    const int layer = step % num_mtp;
    const int64_t n = static_cast<int64_t>(drafting.size());
    std::vector<float> logits(static_cast<size_t>(n * V));
    if (n > 0 || lockstep)
      CP_RETURN_IF_ERROR(model_.mtp_head_logits(h.data(), n, logits.data(), pool_, layer));
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int64_t d = 0; d < n; ++d) {
      const float* r = logits.data() + d * V;
      tokens[d] = static_cast<int32_t>(std::max_element(r, r + V) - r);
      result->draft_token_ids[drafting[d].entry].push_back(tokens[d]);
    }
    if (step + 1 == num_spec_) break;
    // The next step's row sits at position + step + 1; a request whose block table ends
    // before it stops drafting (the scheduler reserves k lookahead slots, so only a request at
    // max_model_len gets here).
    model::ForwardBatch next_batch;
    std::vector<int32_t> next_tokens;
    std::vector<float> next_h;
    std::vector<Drafting> kept;
    for (int64_t d = 0; d < n; ++d) {
      const CachedRequestState& st = *states[drafting[d].entry];
      const int64_t pos = drafting[d].position + step + 1;
      if (pos >= static_cast<int64_t>(st.block_ids.size()) * cache_.block_size()) continue;
      kept.push_back(drafting[d]);
      next_tokens.push_back(tokens[d]);
      next_h.insert(next_h.end(), h.begin() + d * H, h.begin() + (d + 1) * H);
    }
    static const int32_t kPadToken = 0;
    if (kept.empty() && !(lockstep && dummy_block_ >= 0)) break;
    for (size_t d = 0; d < kept.size(); ++d) {
      const CachedRequestState& st = *states[kept[d].entry];
      next_batch.sequences.push_back({std::span<const int32_t>(&next_tokens[d], 1),
                                      kept[d].position + step + 1, st.block_ids});
    }
    if (kept.empty()) {  // lock step: a padding row in the dummy block
      next_tokens.push_back(kPadToken);
      next_h.assign(static_cast<size_t>(H), 0.0f);
      next_batch.sequences.push_back(
          {std::span<const int32_t>(&kPadToken, 1), 0, std::span<const int32_t>(&dummy_block_, 1)});
    }
    std::vector<float> out(next_h.size());
    CP_RETURN_IF_ERROR(model_.mtp_forward(next_batch, next_h.data(), /*from_main=*/false,
                                          next_tokens, cache_, pool_, out.data(),
                                          (step + 1) % num_mtp));
    if (kept.empty()) out.clear();
    drafting = std::move(kept);
    h = std::move(out);
  }
  return {};
}

}  // namespace worker
