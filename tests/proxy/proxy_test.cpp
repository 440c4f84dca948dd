// The proxy's pieces alone: least-loaded selection with upstream's scores, leases that give
// load back on every path, draining removal, SSE event splitting across reads, and the request
// of a round after a decoder handed one back, and the rewriting of decoders' answers.
#include <gtest/gtest.h>

#include "proxy/instance_registry.h"
#include "proxy/pd_messages.h"
#include "proxy/sse_splitter.h"

namespace {

using proxy::InstanceRegistry;
using proxy::Role;

TEST(InstanceRegistryTest, PicksTheLeastLoadedAndTiesGoToTheOldest) {
  InstanceRegistry r;
  r.add(Role::kDecode, {"a", 1});
  r.add(Role::kDecode, {"b", 2});
  auto first = r.acquire(Role::kDecode, 1000);
  EXPECT_EQ(first.instance().key(), "a:1") << "a tie goes to the oldest";
  auto second = r.acquire(Role::kDecode, 10);
  EXPECT_EQ(second.instance().key(), "b:2");
  auto third = r.acquire(Role::kDecode, 10);  // b holds 10 bytes, a 1000
  EXPECT_EQ(third.instance().key(), "b:2");
  EXPECT_EQ(r.requests_in_flight(), 3);
  first.release();
  EXPECT_EQ(r.acquire(Role::kDecode, 1).instance().key(), "a:1");
}

TEST(InstanceRegistryTest, PrefillLoadIsUpstreamsTtftModel) {
  InstanceRegistry r;
  r.add(Role::kPrefill, {"p", 1});
  EXPECT_DOUBLE_EQ(InstanceRegistry::prefill_cost(4000), 4000 / 4.0 * 0.0345 + 120.0745);
  auto lease = r.acquire(Role::kPrefill, 4000);
  const auto snap = r.snapshot();
  EXPECT_DOUBLE_EQ(snap["prefill"][0]["load"].get<double>(),
                   0.3 * InstanceRegistry::prefill_cost(4000));
}

TEST(InstanceRegistryTest, LeasesGiveLoadBackWhenDestroyedOrMoved) {
  InstanceRegistry r;
  r.add(Role::kDecode, {"d", 1});
  {
    auto a = r.acquire(Role::kDecode, 100);
    proxy::Lease b = std::move(a);
    EXPECT_FALSE(a);
    EXPECT_TRUE(b);
    EXPECT_EQ(r.requests_in_flight(), 1);
  }
  EXPECT_EQ(r.requests_in_flight(), 0);
  EXPECT_EQ(r.snapshot()["decode"][0]["load"], 0.0);
}

TEST(InstanceRegistryTest, RemovedInstancesDrainAndWaitingOnesAreNotChosen) {
  InstanceRegistry r;
  r.add(Role::kDecode, {"d", 1});
  r.add(Role::kDecode, {"new", 2}, /*ready=*/false);
  auto lease = r.acquire(Role::kDecode, 1);
  EXPECT_EQ(lease.instance().key(), "d:1");
  EXPECT_TRUE(r.remove(Role::kDecode, "d:1"));
  EXPECT_FALSE(r.contains(Role::kDecode, "d:1")) << "tainted: never chosen again";
  EXPECT_FALSE(r.acquire(Role::kDecode, 1)) << "the new one is not ready";
  r.set_ready(Role::kDecode, "new:2");
  EXPECT_EQ(r.acquire(Role::kDecode, 1).instance().key(), "new:2");
  EXPECT_EQ(r.snapshot()["decode"].size(), 2u);
  lease.release();  // the last request on the removed instance ends: it goes
  EXPECT_EQ(r.snapshot()["decode"].size(), 1u);
  EXPECT_FALSE(r.remove(Role::kDecode, "nope:9"));
}

TEST(InstanceRegistryTest, Ipv6HostsAreBracketed) {
  EXPECT_EQ((proxy::InstanceInfo{"::1", 8000}.url()), "http://[::1]:8000");
  EXPECT_EQ((proxy::InstanceInfo{"10.0.0.1", 8000}.url()), "http://10.0.0.1:8000");
}

TEST(SseSplitterTest, EventsSurviveAnySplitOfTheBytes) {
  const std::string stream = "data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n";
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    proxy::SseSplitter s;
    auto events = s.push(stream.substr(0, cut));
    auto rest = s.push(stream.substr(cut));
    events.insert(events.end(), rest.begin(), rest.end());
    ASSERT_EQ(events.size(), 3u) << cut;
    EXPECT_EQ(proxy::sse_data(events[0]), "{\"a\":1}");
    EXPECT_EQ(proxy::sse_data(events[1]), "{\"b\":2}");
    EXPECT_EQ(proxy::sse_data(events[2]), "[DONE]");
    EXPECT_TRUE(s.rest().empty());
  }
  proxy::SseSplitter s;
  EXPECT_TRUE(s.push("data: {\"unfinished\"").empty());
  EXPECT_EQ(s.rest(), "data: {\"unfinished\"");
  EXPECT_EQ(proxy::sse_data(": a comment\ndata: x\ndata: y\n\n"), "x\ny");
}

// A large event (a first chunk with prompt logprobs) arriving a few bytes at a time, with its
// terminators split across reads, comes out whole and once.
TEST(SseSplitterTest, LargeEventsInSmallReadsComeOutWhole) {
  const std::string big = "data: " + std::string(200000, 'x');
  for (const std::string& end : {std::string("\n\n"), std::string("\r\n\r\n")}) {
    const std::string stream = big + end + "data: y" + end;
    proxy::SseSplitter s;
    std::vector<std::string> events;
    for (size_t at = 0; at < stream.size(); at += 3) {
      auto got = s.push(std::string_view(stream).substr(at, 3));
      events.insert(events.end(), got.begin(), got.end());
    }
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(events[0], big + end);
    EXPECT_EQ(proxy::sse_data(events[1]), "y");
    EXPECT_TRUE(s.rest().empty());
  }
}

using nlohmann::json;

std::string event(const json& chunk) {
  return "data: " + chunk.dump() + "\n\n";
}

// Each kind of decoder event: [DONE] and errors and non-JSON pass as they are, a hand-back is
// hidden, a chunk with only the ids the client did not ask for is dropped, and a chunk keeps its
// text with usage rebased onto the client's prompt and the earlier rounds.
TEST(RelayStreamEventTest, EachKindOfEventIsRelayedAsTheClientShouldSeeIt) {
  using Kind = proxy::RelayedEvent::Kind;
  proxy::EarlierRounds earlier;
  earlier.prompt_tokens = 7;
  earlier.token_ids = {1, 2, 3};
  EXPECT_EQ(proxy::relay_stream_event("data: [DONE]\n\n", false, false, earlier).kind, Kind::kDone);
  EXPECT_EQ(proxy::relay_stream_event("data: not json\n\n", false, false, earlier).kind,
            Kind::kAsIs);
  EXPECT_EQ(
      proxy::relay_stream_event(event({{"error", {{"message", "x"}}}}), false, false, earlier).kind,
      Kind::kAsIs);
  EXPECT_EQ(proxy::relay_stream_event("data: [1,2]\n\n", false, false, earlier).kind, Kind::kAsIs);

  const json handed_back = {
      {"choices", {{{"text", "ab"}, {"token_ids", {4, 5}}, {"stop_reason", "recomputed"}}}}};
  const auto back = proxy::relay_stream_event(event(handed_back), false, false, earlier);
  EXPECT_EQ(back.kind, Kind::kRecomputed);
  EXPECT_EQ(back.choice.text, "ab");
  EXPECT_EQ(back.choice.token_ids, (std::vector<int32_t>{4, 5}));

  const json ids_only = {{"choices", {{{"index", 0}, {"text", ""}, {"token_ids", {9}}}}},
                         {"prompt_token_ids", {10, 11}}};
  const auto empty = proxy::relay_stream_event(event(ids_only), false, false, earlier);
  EXPECT_EQ(empty.kind, Kind::kEmpty);
  EXPECT_EQ(empty.choice.token_ids, (std::vector<int32_t>{9}));
  EXPECT_EQ(empty.choice.prompt_token_ids, (std::vector<int32_t>{10, 11}));
  const auto kept = proxy::relay_stream_event(event(ids_only), false, true, earlier);
  ASSERT_EQ(kept.kind, Kind::kChunk);
  EXPECT_EQ(json::parse(proxy::sse_data(kept.data))["choices"][0]["token_ids"], json({9}));

  const json chat_chunk = {
      {"choices", {{{"index", 0}, {"delta", {{"content", "hi"}}}, {"token_ids", {9}}}}},
      {"usage", {{"prompt_tokens", 12}, {"completion_tokens", 2}, {"total_tokens", 14}}}};
  const auto chunk = proxy::relay_stream_event(event(chat_chunk), true, false, earlier);
  ASSERT_EQ(chunk.kind, Kind::kChunk);
  EXPECT_EQ(chunk.choice.text, "hi");
  const json out = json::parse(proxy::sse_data(chunk.data));
  EXPECT_FALSE(out["choices"][0].contains("token_ids"));
  EXPECT_EQ(out["usage"],
            json({{"prompt_tokens", 7}, {"completion_tokens", 5}, {"total_tokens", 12}}));
}

// A whole answer after two handed-back rounds: the earlier text leads, the ids are the whole
// list when asked for and null otherwise, and usage counts every round. Answers of other shapes
// pass unharmed.
TEST(FinishWholeAnswerTest, EarlierRoundsLeadAndUsageCountsThem) {
  proxy::EarlierRounds earlier;
  earlier.prompt_tokens = 4;
  earlier.text = "Hello";
  earlier.token_ids = {1, 2};
  json completion = {{"choices", {{{"text", " world"}, {"token_ids", {3}}}}},
                     {"usage", {{"prompt_tokens", 6}, {"completion_tokens", 1}}}};
  json with_ids = completion;
  proxy::finish_whole_answer(&with_ids, false, true, earlier);
  EXPECT_EQ(with_ids["choices"][0]["text"], "Hello world");
  EXPECT_EQ(with_ids["choices"][0]["token_ids"], json({1, 2, 3}));
  EXPECT_EQ(with_ids["usage"],
            json({{"prompt_tokens", 4}, {"completion_tokens", 3}, {"total_tokens", 7}}));
  proxy::finish_whole_answer(&completion, false, false, earlier);
  EXPECT_TRUE(completion["choices"][0]["token_ids"].is_null());

  json chat = {{"choices", {{{"message", {{"role", "assistant"}, {"content", nullptr}}}}}}};
  proxy::finish_whole_answer(&chat, true, false, earlier);
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "Hello");

  for (json odd : {json::parse(R"({"choices": 5})"), json::parse(R"({"choices": [7]})"),
                   json::parse(R"({"usage": {"completion_tokens": "x"}})"), json::parse("[]")}) {
    const json before = odd;
    proxy::finish_whole_answer(&odd, false, false, earlier);
    EXPECT_EQ(odd.is_object() ? odd.contains("choices") : false,
              before.is_object() ? before.contains("choices") : false)
        << before.dump();
    if (before.is_object() && before.contains("usage")) {
      EXPECT_EQ(odd["usage"]["completion_tokens"], "x");
    }
  }
}

// A handed-back request continues from its exact ids; the token budgets shrink by what was
// made (from the client's values, so rounds do not subtract twice); a chat request becomes a
// completion that keeps the sampling, masking and cache fields and drops the chat-only ones.
TEST(NextRoundRequestTest, ContinuesFromTheExactIds) {
  using nlohmann::json;
  const json chat = {{"model", "m"},
                     {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                     {"max_completion_tokens", 20},
                     {"min_tokens", 5},
                     {"temperature", 0.5},
                     {"logit_bias", {{"7", -100}}},
                     {"allowed_token_ids", {1, 2, 3}},
                     {"bad_words", {"x"}},
                     {"cache_salt", "tenant"},
                     {"priority", -2},
                     {"stream", true},
                     {"tools", json::array()},
                     {"chat_template_kwargs", {{"thinking", true}}}};
  const json first = proxy::next_round_request(chat, chat, true, {10, 11}, {12, 13, 14}, 20);
  EXPECT_EQ(first["prompt"], json({10, 11, 12, 13, 14}));
  EXPECT_EQ(first["max_tokens"], 17);
  EXPECT_EQ(first["min_tokens"], 2);
  EXPECT_FALSE(first.contains("max_completion_tokens"));
  EXPECT_FALSE(first.contains("messages") || first.contains("tools") ||
               first.contains("chat_template_kwargs"));
  for (const char* key : {"temperature", "logit_bias", "allowed_token_ids", "bad_words",
                          "cache_salt", "priority", "stream"})
    EXPECT_EQ(first[key], chat[key]) << key;
  EXPECT_EQ(first["return_token_ids"], true);
  const json second =
      proxy::next_round_request(chat, first, true, {10, 11}, {12, 13, 14, 15, 16, 17, 18}, 20);
  EXPECT_EQ(second["max_tokens"], 13);
  EXPECT_EQ(second["min_tokens"], 0);

  const json completion = {{"prompt", "hi"}, {"max_tokens", 8}, {"min_tokens", 4}, {"seed", 3}};
  json current = completion;
  current["return_token_ids"] = true;
  const json next = proxy::next_round_request(completion, current, false, {5}, {6, 7}, 8);
  EXPECT_EQ(next["prompt"], json({5, 6, 7}));
  EXPECT_EQ(next["max_tokens"], 6);
  EXPECT_EQ(next["min_tokens"], 2);
  EXPECT_EQ(next["seed"], 3);
  const json again = proxy::next_round_request(completion, next, false, {5}, {6, 7, 8}, 8);
  EXPECT_EQ(again["min_tokens"], 1) << "from the client's min_tokens, not the last round's";
}

}  // namespace
