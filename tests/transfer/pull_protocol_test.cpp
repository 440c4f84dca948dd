// The pull connector's data on the wire and in kv_transfer_params: parsing names the bad field,
// every decoder rejects truncated or corrupt bytes (they come off the network), and round
// trips keep every field. Plus one real transfer: a PullSender and a PullReceiver in this
// process move blocks over UCX and the side channel, and a DONE after expiry fails the load.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <thread>

#include "model/kv_cache.h"
#include "transfer/pull_protocol.h"
#include "transfer/pull_receiver.h"
#include "transfer/pull_sender.h"

namespace {

using nlohmann::json;
using transfer::parse_pull_params;

TEST(PullParamsTest, ReadsWhatPAnswersAndNamesBadFields) {
  const json p = {
      {"do_remote_prefill", true}, {"remote_engine_id", "0"}, {"remote_request_id", "cmpl-x-0"},
      {"remote_host", "10.0.0.1"}, {"remote_port", 36000},    {"remote_block_ids", {{4, 5, 6}}},
      {"num_prompt_blocks", 3},    {"remote_block_size", 16}, {"remote_ptp_size", 1},
      {"remote_pp_size", 2}};
  auto r = parse_pull_params(p);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->do_remote_prefill);
  EXPECT_EQ(r->remote_block_ids, (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(r->remote_pp_size, 2);
  json flat = p;  // vLLM 0.11's flat list
  flat["remote_block_ids"] = {7, 8};
  EXPECT_EQ(parse_pull_params(flat)->remote_block_ids, (std::vector<int32_t>{7, 8}));
  // The proxy's P-leg params, nulls included.
  const json leg = {{"do_remote_decode", true},    {"do_remote_prefill", false},
                    {"remote_engine_id", nullptr}, {"remote_block_ids", nullptr},
                    {"remote_host", nullptr},      {"remote_port", nullptr}};
  EXPECT_TRUE(parse_pull_params(leg)->do_remote_decode);
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, json>>{{"remote_port", 70000},
                                                 {"remote_port", "x"},
                                                 {"remote_block_ids", {-1}},
                                                 {"do_remote_prefill", "yes"},
                                                 {"remote_host", 5}}) {
    json bad = p;
    bad[field] = value;
    auto e = parse_pull_params(bad);
    ASSERT_FALSE(e.ok()) << field;
    EXPECT_NE(e.status().message().find(field), std::string::npos) << e.status().message();
  }
  json missing = p;
  missing.erase("remote_host");
  EXPECT_FALSE(parse_pull_params(missing).ok());
  EXPECT_FALSE(parse_pull_params(std::string("{")).ok());
  EXPECT_FALSE(parse_pull_params(json::array()).ok());
}

TEST(PullWireTest, RoundTripsAndRejectsEveryTruncation) {
  transfer::AgentMetadata m;
  m.engine_id = "e";
  m.incarnation = 42;
  m.ucx_address = {1, 2, 3};
  m.block_size = 16;
  m.row_dim = 576;
  m.value_bytes = 2;  // a bf16 cache
  m.num_blocks = 10;
  m.layer_begin = 3;
  m.layer_end = 5;
  m.layer_base = {100, 200};
  m.rkeys = {{9}, {8, 7}};
  const auto bytes = transfer::encode_metadata(m);
  auto back = transfer::decode_metadata(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->rkeys, m.rkeys);
  EXPECT_EQ(back->layer_base, m.layer_base);
  EXPECT_EQ(back->value_bytes, 2);
  EXPECT_EQ(back->block_bytes(), 16 * 576 * 2);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(transfer::decode_metadata({bytes.begin(), bytes.begin() + n}).ok()) << n;
  m.value_bytes = 3;  // neither f32 nor bf16
  EXPECT_FALSE(transfer::decode_metadata(transfer::encode_metadata(m)).ok());

  transfer::PullStepMeta s;
  s.new_leases = {"a", "b"};
  transfer::RecvTask t;
  t.req_id = "d1";
  t.remote.remote_request_id = "p1";
  t.remote.remote_host = "h";
  t.remote.remote_port = 36000;
  t.remote.remote_tp_size = 1;
  t.remote.remote_pp_size = 2;
  t.remote_block_ids = {1, 2};
  t.local_block_ids = {5, 6};
  s.recvs = {t};
  const auto sb = transfer::encode_step_meta(s);
  auto sback = transfer::decode_step_meta(sb);
  ASSERT_TRUE(sback.ok());
  EXPECT_EQ(sback->new_leases, s.new_leases);
  EXPECT_EQ(sback->recvs[0].local_block_ids, t.local_block_ids);
  EXPECT_EQ(sback->recvs[0].remote.remote_pp_size, 2);
  for (size_t n = 1; n < sb.size(); ++n)
    EXPECT_FALSE(transfer::decode_step_meta({sb.begin(), sb.begin() + n}).ok()) << n;

  transfer::SideRequest kind;
  std::string id;
  uint64_t token = 0;
  const transfer::Bytes done = transfer::encode_done("req-9", 0xfeedbeef12345678ULL);
  ASSERT_TRUE(transfer::decode_side_request(done, &kind, &id, &token));
  EXPECT_EQ(kind, transfer::SideRequest::kDone);
  EXPECT_EQ(id, "req-9");
  EXPECT_EQ(token, 0xfeedbeef12345678ULL);
  for (size_t n = 1; n < done.size(); ++n)
    EXPECT_FALSE(
        transfer::decode_side_request({done.begin(), done.begin() + n}, &kind, &id, &token))
        << n;
  EXPECT_FALSE(transfer::decode_side_request({2, 1}, &kind, &id, &token));
  EXPECT_FALSE(transfer::decode_side_request({9}, &kind, &id, &token));
}

// Waits for the receiver's next report.
sched::KvTransferReport next_report(transfer::PullReceiver& r) {
  sched::KvTransferReport report;
  for (int i = 0; i < 3000 && report.finished_recving.empty() && report.failed_recving.empty();
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    r.take_finished(&report);
  }
  return report;
}

TEST(PullTransferTest, BlocksMoveOverUcxAndAnExpiredLeaseFailsTheLoad) {
  const int port = 31200 + getpid() % 1500;  // below the ephemeral range, apart from pd_test's
  model::LatentKvCache p_cache(2, 0, 2, 8, 4, 6), d_cache(2, 0, 2, 8, 4, 6);
  for (int l = 0; l < 2; ++l)
    for (int64_t i = 0; i < 8 * 4 * 6; ++i) p_cache.layer_f32(l)[i] = float(l * 1000 + i);
  transfer::PullSenderOptions so;
  so.engine_id = "p";
  so.bind_host = "127.0.0.1";
  so.port = port;
  so.lease_seconds = 0.3;
  auto sender = transfer::PullSender::start(so, &p_cache, 0, 2);
  ASSERT_TRUE(sender.ok()) << sender.status().message();
  transfer::PullReceiver receiver({}, &d_cache, 0, 2);
  transfer::RecvTask t;
  t.req_id = "d";
  t.remote.remote_engine_id = "p";
  t.remote.remote_request_id = "r1";
  t.remote.remote_host = "127.0.0.1";
  t.remote.remote_port = port;
  t.remote.remote_tp_size = t.remote.remote_pp_size = 1;
  t.remote_block_ids = {5, 6, 2};  // a run and a single block
  t.local_block_ids = {0, 1, 7};
  (*sender)->add_leases({"r1"});
  receiver.enqueue({t});
  auto report = next_report(receiver);
  ASSERT_EQ(report.finished_recving, (std::vector<std::string>{"d"}));
  EXPECT_EQ(report.stats.bytes_pulled, 3 * 2 * 4 * 6 * 4);
  for (int l = 0; l < 2; ++l) {
    for (size_t k = 0; k < 3; ++k) {
      for (int64_t i = 0; i < 4 * 6; ++i) {
        ASSERT_EQ(d_cache.layer_f32(l)[t.local_block_ids[k] * 24 + i],
                  p_cache.layer_f32(l)[t.remote_block_ids[k] * 24 + i]);
      }
    }
  }
  std::vector<std::string> done;
  sched::KvTransferStats stats;
  (*sender)->take_finished(&done, &stats);
  EXPECT_EQ(done, (std::vector<std::string>{"r1"})) << "the DONE ended the lease";
  // A second read of r1 (its blocks may be reused by now) is refused at DONE.
  t.req_id = "d1-again";
  receiver.enqueue({t});
  report = next_report(receiver);
  ASSERT_EQ(report.failed_recving.size(), 1u);
  EXPECT_NE(report.failed_recving[0].second.find("freed the blocks"), std::string::npos);

  // A lease that expires before the decoder reads: P reports it freed, D's DONE is answered
  // EXPIRED, and the load fails instead of trusting reused blocks.
  (*sender)->add_leases({"r2"});
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  done.clear();
  (*sender)->take_finished(&done, &stats);
  EXPECT_EQ(done, (std::vector<std::string>{"r2"}));
  EXPECT_EQ(stats.leases_expired, 1);
  EXPECT_EQ(stats.late_releases, 1) << "d1-again's DONE came after r1's blocks were freed";
  t.req_id = "d2";
  t.remote.remote_request_id = "r2";
  receiver.enqueue({t});
  report = next_report(receiver);
  ASSERT_EQ(report.failed_recving.size(), 1u);
  EXPECT_NE(report.failed_recving[0].second.find("expired"), std::string::npos)
      << report.failed_recving[0].second;
  stats = {};
  (*sender)->take_finished(&done, &stats);
  EXPECT_EQ(stats.late_releases, 1) << "d2's DONE came after r2's lease expired";

  // A peer that is not there: the load fails, naming it.
  t.req_id = "d3";
  t.remote.remote_port = port + 1;
  receiver.enqueue({t});
  report = next_report(receiver);
  ASSERT_EQ(report.failed_recving.size(), 1u);
  EXPECT_NE(report.failed_recving[0].second.find(std::to_string(port + 1)), std::string::npos);
}

}  // namespace
