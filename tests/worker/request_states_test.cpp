// RequestStates: the worker's view of each request follows the SchedulerOutput deltas, and a
// step whose ids could index out of bounds is refused before anything runs.
#include "worker/request_states.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace {

sched::ScheduledRequest fresh(const std::string& id, std::vector<int32_t> prompt,
                              std::vector<int32_t> blocks, int64_t scheduled) {
  sched::ScheduledRequest s;
  s.req_id = id;
  s.new_request.emplace();
  s.new_request->prompt_token_ids = std::move(prompt);
  s.new_request->sampling.seed = 3;
  s.new_block_ids = std::move(blocks);
  s.num_scheduled_tokens = scheduled;
  s.samples = scheduled == static_cast<int64_t>(s.new_request->prompt_token_ids.size());
  return s;
}

TEST(RequestStatesTest, DeltasBuildTheRequestAndFinishedIdsDropIt) {
  worker::RequestStates states(/*vocab=*/100, /*num_blocks=*/8, /*block_size=*/4);
  std::vector<worker::CachedRequestState*> got;
  sched::SchedulerOutput step;
  step.scheduled = {fresh("a", {1, 2, 3, 4, 5}, {0, 1}, 5)};
  ASSERT_TRUE(states.apply(step, &got).ok());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]->token_ids, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  model::ForwardBatch batch = worker::RequestStates::forward_batch(step, got);
  ASSERT_EQ(batch.sequences.size(), 1u);
  EXPECT_EQ(batch.num_tokens(), 5);

  sched::ScheduledRequest decode;  // the sampled token arrives with the next step
  decode.req_id = "a";
  decode.new_token_ids = {9};
  decode.num_computed_tokens = 5;
  decode.num_scheduled_tokens = 1;
  decode.samples = true;
  step.scheduled = {decode};
  ASSERT_TRUE(states.apply(step, &got).ok());
  EXPECT_EQ(got[0]->token_ids.back(), 9);
  EXPECT_EQ(got[0]->outputs().size(), 1u);
  batch = worker::RequestStates::forward_batch(step, got);
  ASSERT_EQ(batch.sequences[0].token_ids.size(), 1u);
  EXPECT_EQ(batch.sequences[0].token_ids[0], 9);
  EXPECT_EQ(batch.sequences[0].num_computed_tokens, 5);

  sched::ScheduledRequest resumed = decode;  // after a preemption: a new table, recompute all
  resumed.resumed_from_preemption = true;
  resumed.new_token_ids = {};
  resumed.new_block_ids = {6, 7};
  resumed.num_computed_tokens = 0;
  resumed.num_scheduled_tokens = 6;
  step.scheduled = {resumed};
  ASSERT_TRUE(states.apply(step, &got).ok());
  EXPECT_EQ(got[0]->block_ids, (std::vector<int32_t>{6, 7}));

  step.scheduled = {fresh("b", {1}, {2}, 1)};
  step.finished_req_ids = {"a"};
  ASSERT_TRUE(states.apply(step, &got).ok());
  EXPECT_EQ(states.size(), 1u);
}

TEST(RequestStatesTest, BadStepsAreRefusedWithTheReason) {
  auto refusal = [](const sched::ScheduledRequest& s) {
    worker::RequestStates states(100, 8, 4);
    std::vector<worker::CachedRequestState*> got;
    sched::SchedulerOutput step;
    step.scheduled = {s};
    auto st = states.apply(step, &got);
    EXPECT_FALSE(st.ok());
    return st.message();
  };
  EXPECT_NE(refusal(fresh("a", {1, 200}, {0}, 2)).find("token id 200"), std::string::npos);
  EXPECT_NE(refusal(fresh("a", {1, 2}, {8}, 2)).find("KV block 8"), std::string::npos);
  EXPECT_NE(refusal(fresh("a", {1, 2, 3, 4, 5}, {0}, 5)).find("1 blocks"), std::string::npos);
  EXPECT_NE(refusal(fresh("a", {1, 2}, {0}, 3)).find("tokens [0, 3)"), std::string::npos);
  // Counts from a peer so large that their sum wraps around: refused, not read out of range
  // (a fuzzer found that the sum was formed before either count was bounded).
  sched::ScheduledRequest wraps = fresh("a", {1, 2}, {0}, 2);
  wraps.num_computed_tokens = INT64_MAX - 255;
  wraps.num_scheduled_tokens = int64_t{1} << 58;
  EXPECT_NE(refusal(wraps).find("tokens [9223372036854775552, 9223372036854775552 + "),
            std::string::npos);
  sched::ScheduledRequest negative = fresh("a", {1, 2}, {0}, 2);
  negative.num_computed_tokens = -1;
  EXPECT_NE(refusal(negative).find("tokens [-1, 1)"), std::string::npos);
  sched::ScheduledRequest unknown;
  unknown.req_id = "ghost";
  unknown.num_scheduled_tokens = 1;
  EXPECT_NE(refusal(unknown).find("no state for request ghost"), std::string::npos);
  sched::ScheduledRequest early = fresh("a", {1, 2, 3}, {0}, 2);
  early.samples = true;
  EXPECT_NE(refusal(early).find("samples before its last token"), std::string::npos);
}

// screen(): a new request whose own ids lie outside the vocabulary is held back with the field
// and the id, the others keep their order; a step with nothing to hold back is left as it is.
TEST(RequestStatesTest, ScreenHoldsBackRequestsWithOutOfVocabularyIds) {
  worker::RequestStates states(100, 8, 4);
  sched::SchedulerOutput step;
  step.scheduled = {fresh("a", {1, 2}, {0}, 2), fresh("b", {1, 2}, {1}, 2),
                    fresh("c", {3}, {2}, 1)};
  EXPECT_FALSE(states.screen(step).kept.has_value());
  step.scheduled[1].new_request->sampling.logit_bias = {{100, 1.0f}};
  worker::ScreenedStep screened = states.screen(step);
  ASSERT_TRUE(screened.kept.has_value());
  ASSERT_EQ(screened.kept->scheduled.size(), 2u);
  EXPECT_EQ(screened.kept->scheduled[1].req_id, "c");
  EXPECT_EQ(screened.kept->total_num_scheduled_tokens, 3);
  EXPECT_EQ(screened.kept_index, (std::vector<size_t>{0, 2}));
  ASSERT_EQ(screened.rejected.size(), 1u);
  EXPECT_EQ(screened.rejected[0].why,
            "'logit_bias' holds token id 100, outside the vocabulary [0, 100)");
  std::vector<worker::CachedRequestState*> got;
  ASSERT_TRUE(states.apply(*screened.kept, &got).ok());
  EXPECT_EQ(states.size(), 2u);
}

}  // namespace
