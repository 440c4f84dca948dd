// EngineRequest and RequestOutput survive the wire field for field, and truncated bytes are
// refused.
#include "engine/engine_wire.h"

#include <gtest/gtest.h>

namespace {

TEST(EngineWireTest, RequestAndOutputRoundTrip) {
  engine::EngineRequest q;
  q.request_id = "cmpl-1-0";
  q.prompt_token_ids = {1, 2, 3};
  q.sampling.temperature = 0.7;
  q.sampling.seed = 42;
  q.sampling.max_tokens = 9;
  q.sampling.stop = {"END", "\n\n"};
  q.sampling.ignore_eos = true;
  q.sampling.skip_special_tokens = false;
  q.sampling.logprobs = 2;
  q.sampling.logit_bias = {{5, -100.0f}};
  const auto bytes = engine::encode_request(q);
  auto back = engine::decode_request(bytes);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->request_id, q.request_id);
  EXPECT_EQ(back->prompt_token_ids, q.prompt_token_ids);
  EXPECT_EQ(back->sampling.seed, std::optional<uint64_t>(42));
  EXPECT_EQ(back->sampling.stop, q.sampling.stop);
  EXPECT_TRUE(back->sampling.ignore_eos);
  EXPECT_FALSE(back->sampling.skip_special_tokens);
  EXPECT_EQ(back->sampling.logprobs, std::optional<int32_t>(2));
  EXPECT_EQ(back->sampling.logit_bias, q.sampling.logit_bias);
  for (size_t cut : {size_t{0}, bytes.size() / 2, bytes.size() - 1}) {
    EXPECT_FALSE(engine::decode_request({bytes.begin(), bytes.begin() + long(cut)}).ok()) << cut;
  }

  engine::RequestOutput o;
  o.request_id = "cmpl-1-0";
  o.new_token_ids = {7};
  o.new_logprobs = {{7, -0.25f, {{7, -0.25f}, {8, -2.0f}}}};
  o.new_text = "hé";
  o.finished = true;
  o.finish_reason = sched::FinishReason::kStop;
  o.stop_reason = std::string("END");
  o.num_prompt_tokens = 3;
  o.num_output_tokens = 1;
  o.kv_transfer_params = R"({"do_remote_prefill": true})";
  const auto obytes = engine::encode_output(o);
  auto oback = engine::decode_output(obytes);
  ASSERT_TRUE(oback.ok()) << oback.status().message();
  EXPECT_EQ(oback->new_logprobs.size(), 1u);
  EXPECT_EQ(oback->new_logprobs[0].top_logprobs.size(), 2u);
  EXPECT_EQ(oback->new_text, "hé");
  EXPECT_EQ(oback->finish_reason, sched::FinishReason::kStop);
  EXPECT_EQ(std::get<std::string>(oback->stop_reason), "END");
  EXPECT_EQ(oback->kv_transfer_params, o.kv_transfer_params);
  auto bad = obytes;
  bad.push_back(0);
  EXPECT_FALSE(engine::decode_output(bad).ok());
}

}  // namespace
