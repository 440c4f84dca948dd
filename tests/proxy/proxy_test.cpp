// The proxy's pieces alone: least-loaded selection with upstream's scores, leases that give
// load back on every path, draining removal, and SSE event splitting across reads.
#include <gtest/gtest.h>

#include "proxy/instance_registry.h"
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

}  // namespace
