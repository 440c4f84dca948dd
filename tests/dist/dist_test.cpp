// Shared-memory pipes, the TCP link, the pipeline message codec and the stage launcher's
// command line and topology rules.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <numeric>
#include <random>
#include <thread>

#include "dist/communicator.h"
#include "dist/shm_pipe.h"
#include "worker/stage_launcher.h"
#include "worker/stage_protocol.h"

namespace {

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(ShmPipeTest, MessagesLargerThanTheRingArriveIntactAcrossWrapArounds) {
  auto pipe = dist::ShmPipe::create(4096);  // one page: every message below wraps many times
  ASSERT_TRUE(pipe.ok()) << pipe.status().message();
  const std::vector<size_t> sizes = {1, 4095, 4096, 4097, 70000, 3, 123457};
  std::thread writer([&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto data = pattern(sizes[i], static_cast<uint32_t>(i));
      ASSERT_TRUE(pipe->write(data.data(), data.size()).ok());
    }
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t> got(sizes[i]);
    ASSERT_TRUE(pipe->read(got.data(), got.size()).ok());
    EXPECT_EQ(got, pattern(sizes[i], static_cast<uint32_t>(i))) << "message " << i;
  }
  writer.join();
}

TEST(ShmPipeTest, WorksBetweenProcesses) {
  auto pipe = dist::ShmPipe::create(1 << 16);
  ASSERT_TRUE(pipe.ok());
  const pid_t pid = fork();
  if (pid == 0) {  // the child maps the ring again from the fd, as a stage process does
    auto mine = dist::ShmPipe::attach(dup(pipe->fd()));
    auto data = pattern(300000, 9);
    _exit(mine.ok() && mine->write(data.data(), data.size()).ok() ? 0 : 1);
  }
  std::vector<uint8_t> got(300000);
  ASSERT_TRUE(pipe->read(got.data(), got.size()).ok());
  EXPECT_EQ(got, pattern(300000, 9));
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(ShmPipeTest, CloseWakesABlockedReaderAndWriter) {
  auto pipe = dist::ShmPipe::create(4096);
  ASSERT_TRUE(pipe.ok());
  common::Status read_status, write_status;
  std::thread reader([&] {
    uint8_t b;
    read_status = pipe->read(&b, 1);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  pipe->close();
  reader.join();
  EXPECT_FALSE(read_status.ok());
  EXPECT_EQ(read_status.message(), "the peer closed the pipe");
  std::vector<uint8_t> big(10000);
  EXPECT_FALSE(pipe->write(big.data(), big.size()).ok());
}

TEST(ShmLinkTest, FramesMetaAndPayload) {
  auto pipe = dist::ShmPipe::create(4096);
  ASSERT_TRUE(pipe.ok());
  auto reader_side = dist::ShmPipe::attach(dup(pipe->fd()));
  ASSERT_TRUE(reader_side.ok());
  auto tx = dist::make_shm_link(std::move(pipe).value());
  auto rx = dist::make_shm_link(std::move(reader_side).value());
  dist::Message m{{1, 2, 3}, std::vector<float>(5000)};
  std::iota(m.data.begin(), m.data.end(), 0.5f);
  std::thread writer([&] { EXPECT_TRUE(tx->send(m).ok()); });
  dist::Message got;
  ASSERT_TRUE(rx->recv(&got).ok());
  writer.join();
  EXPECT_EQ(got.meta, m.meta);
  EXPECT_EQ(got.data, m.data);
}

// A port the kernel just handed out on 127.0.0.1 (bound to port 0, then closed).
int free_tcp_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(TcpLinkTest, DeliversInOrderAndReportsALostPeer) {
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
  auto rx = dist::make_tcp_link(endpoint, /*bind=*/true, /*sending=*/false, "test input");
  ASSERT_TRUE(rx.ok()) << rx.status().message();
  {
    auto tx = dist::make_tcp_link(endpoint, /*bind=*/false, /*sending=*/true, "test output");
    ASSERT_TRUE(tx.ok()) << tx.status().message();
    for (int i = 0; i < 3; ++i) {
      dist::Message m{{static_cast<uint8_t>(i)}, std::vector<float>(1000 * (i + 1), float(i))};
      ASSERT_TRUE((*tx)->send(m).ok());
    }
    for (int i = 0; i < 3; ++i) {
      dist::Message got;
      ASSERT_TRUE((*rx)->recv(&got).ok());
      EXPECT_EQ(got.meta, std::vector<uint8_t>{static_cast<uint8_t>(i)});
      EXPECT_EQ(got.data, std::vector<float>(1000 * (i + 1), float(i)));
    }
  }  // the sender goes away
  dist::Message got;
  const common::Status st = (*rx)->recv(&got);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("test input: lost the connection to the peer at " + endpoint),
            std::string::npos)
      << st.message();
}

TEST(TcpLinkTest, BindErrorsNameTheEndpoint) {
  auto link = dist::make_tcp_link("tcp://256.1.1.1:1", true, false, "pipeline link 1");
  ASSERT_FALSE(link.ok());
  EXPECT_NE(link.status().message().find("pipeline link 1: cannot bind tcp://256.1.1.1:1"),
            std::string::npos)
      << link.status().message();
}

TEST(StageProtocolTest, StepRoundTripsAndTruncationIsRejected) {
  worker::StepEnvelope step;
  step.step_id = 42;
  step.predicted_ms = 12.5;
  sched::ScheduledRequest fresh;
  fresh.req_id = "a";
  fresh.new_request.emplace();
  fresh.new_request->prompt_token_ids = {1, 2, 3};
  auto& p = fresh.new_request->sampling;
  p.temperature = 0.7;
  p.top_k = 40;
  p.logprobs = 3;
  p.seed = 0xfeedbeefcafeULL;
  p.all_stop_token_ids = {2};
  p.logit_bias = {{7, -1.5f}};
  p.allowed_token_ids = {2, 7, 9};
  p.bad_words_token_ids = {{1, 2}, {3}};
  fresh.new_block_ids = {4, 5};
  fresh.num_scheduled_tokens = 3;
  fresh.samples = true;
  sched::ScheduledRequest cached;
  cached.req_id = "b";
  cached.resumed_from_preemption = true;
  cached.new_token_ids = {9};
  cached.new_block_ids = {6};
  cached.num_computed_tokens = 7;
  cached.num_scheduled_tokens = 1;
  step.output.scheduled = {fresh, cached};
  step.output.finished_req_ids = {"gone"};
  step.output.total_num_scheduled_tokens = 4;
  step.output.num_recomputed = 2;
  step.timings.push_back({0, 1.5, 0.25});
  step.output.scheduled[0].spec_token_ids = {11, 12};
  step.sampled = {
      {sched::SampledToken{5, -0.5f, {{5, -0.5f}, {7, -1.5f}}}, sched::SampledToken{6, -0.25f, {}}},
      {}};
  step.draft_token_ids = {{13, 14}, {}};
  step.prompt_logprobs = {{sched::SampledToken{2, -4.0f, {{8, -0.75f}}, 17}}, {}};
  step.rejected = {{"held", "'stop_token_ids' holds token id 600"}};
  dist::Message m = worker::encode_step(step, {1.0f, 2.0f});
  ASSERT_EQ(worker::message_kind(m).value(), worker::StageMessageKind::kStep);
  worker::StepEnvelope back;
  ASSERT_TRUE(worker::decode_step(m, &back).ok());
  EXPECT_EQ(back.step_id, 42);
  ASSERT_EQ(back.rejected.size(), 1u);
  EXPECT_EQ(back.rejected[0].req_id, "held");
  EXPECT_EQ(back.rejected[0].why, step.rejected[0].why);
  ASSERT_EQ(back.prompt_logprobs.size(), 2u);
  ASSERT_EQ(back.prompt_logprobs[0].size(), 1u);
  EXPECT_EQ(back.prompt_logprobs[0][0].rank, 17);
  EXPECT_EQ(back.prompt_logprobs[0][0].top_logprobs, step.prompt_logprobs[0][0].top_logprobs);
  EXPECT_TRUE(back.prompt_logprobs[1].empty());
  EXPECT_EQ(back.predicted_ms, 12.5);
  ASSERT_EQ(back.output.scheduled.size(), 2u);
  const sched::ScheduledRequest& a = back.output.scheduled[0];
  EXPECT_EQ(a.req_id, "a");
  ASSERT_TRUE(a.new_request.has_value());
  EXPECT_EQ(a.new_request->prompt_token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(a.new_request->sampling.temperature, 0.7);
  EXPECT_EQ(a.new_request->sampling.top_k, 40);
  EXPECT_EQ(a.new_request->sampling.logprobs, std::optional<int32_t>(3));
  EXPECT_EQ(a.new_request->sampling.seed, std::optional<uint64_t>(0xfeedbeefcafeULL));
  EXPECT_EQ(a.new_request->sampling.all_stop_token_ids, (std::vector<int32_t>{2}));
  ASSERT_EQ(a.new_request->sampling.logit_bias.size(), 1u);
  EXPECT_EQ(a.new_request->sampling.allowed_token_ids, p.allowed_token_ids);
  EXPECT_EQ(a.new_request->sampling.bad_words_token_ids, p.bad_words_token_ids);
  EXPECT_EQ(a.new_block_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(a.samples);
  EXPECT_FALSE(a.resumed_from_preemption);
  const sched::ScheduledRequest& b = back.output.scheduled[1];
  EXPECT_FALSE(b.new_request.has_value());
  EXPECT_TRUE(b.resumed_from_preemption);
  EXPECT_FALSE(b.samples);
  EXPECT_EQ(b.new_token_ids, (std::vector<int32_t>{9}));
  EXPECT_EQ(b.num_computed_tokens, 7);
  EXPECT_EQ(b.num_scheduled_tokens, 1);
  EXPECT_EQ(back.output.finished_req_ids, (std::vector<std::string>{"gone"}));
  EXPECT_EQ(back.output.total_num_scheduled_tokens, 4);
  EXPECT_EQ(back.output.num_recomputed, 2);
  ASSERT_EQ(back.sampled.size(), 2u);
  ASSERT_EQ(back.sampled[0].size(), 2u);
  EXPECT_EQ(back.sampled[0][0].token, 5);
  EXPECT_EQ(back.sampled[0][0].top_logprobs.size(), 2u);
  EXPECT_EQ(back.sampled[0][1].token, 6);
  EXPECT_EQ(back.sampled[0][1].logprob, -0.25f);
  EXPECT_TRUE(back.sampled[1].empty());
  EXPECT_EQ(a.spec_token_ids, (std::vector<int32_t>{11, 12}));
  EXPECT_TRUE(b.spec_token_ids.empty());
  EXPECT_EQ(back.draft_token_ids, (std::vector<std::vector<int32_t>>{{13, 14}, {}}));
  ASSERT_EQ(back.timings.size(), 1u);
  EXPECT_EQ(back.timings[0].duration_s, 0.25);
  for (size_t cut : {size_t{1}, m.meta.size() / 2, m.meta.size() - 1}) {
    dist::Message broken = m;
    broken.meta.resize(cut);
    worker::StepEnvelope x;
    EXPECT_FALSE(worker::decode_step(broken, &x).ok()) << "cut at " << cut;
  }
  dist::Message unknown{{9}, {}};
  EXPECT_FALSE(worker::message_kind(unknown).ok());
}

TEST(StageLauncherTest, StageCommandLineRoundTrips) {
  worker::StageSpec spec;
  spec.model_dir = "/models/dsv3";
  spec.stage = 1;
  spec.num_stages = 2;
  spec.layer_begin = 3;
  spec.layer_end = 8;
  spec.threads = 4;
  spec.cpus = {4, 5, 6, 7};
  spec.num_blocks = 1000;
  spec.block_size = 128;
  spec.expanded_kv_cache = true;
  spec.bf16_activations = true;
  spec.bf16_kv_cache = true;
  spec.numa_node = 1;
  auto args = worker::stage_worker_args(spec, "shm:7", "tcp-connect:tcp://10.0.0.1:29502");
  ASSERT_EQ(args.front(), "pp-stage");
  args.erase(args.begin());
  auto parsed = worker::parse_stage_worker_args(args);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->spec.model_dir, spec.model_dir);
  EXPECT_EQ(parsed->spec.layer_begin, 3);
  EXPECT_EQ(parsed->spec.layer_end, 8);
  EXPECT_EQ(parsed->spec.cpus, spec.cpus);
  EXPECT_EQ(parsed->spec.num_blocks, 1000);
  EXPECT_TRUE(parsed->spec.expanded_kv_cache);
  EXPECT_TRUE(parsed->spec.bf16_activations);
  EXPECT_TRUE(parsed->spec.bf16_kv_cache);
  EXPECT_EQ(parsed->spec.numa_node, 1);
  EXPECT_EQ(parsed->recv_link, "shm:7");
  EXPECT_EQ(parsed->send_link, "tcp-connect:tcp://10.0.0.1:29502");
  EXPECT_EQ(worker::parse_stage_worker_args({"--model", "m", "--stage", "x"}).status().message(),
            "pp-stage: --stage expects an integer, got 'x'");

  // A TP rank of DP rank 3 of 4 with the experts over DP x TP.
  spec.tp_rank = 1;
  spec.tp_size = 2;
  spec.store = "127.0.0.1:4000";
  spec.expert_parallel = true;
  spec.experts_dp_rank = 3;
  spec.experts_dp_size = 4;
  spec.experts_store = "10.0.0.1:13389";
  spec.bf16_kv_cache = false;
  spec.numa_node = -1;
  args = worker::stage_worker_args(spec, "none", "none");
  args.erase(args.begin());
  parsed = worker::parse_stage_worker_args(args);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_FALSE(parsed->spec.bf16_kv_cache);
  EXPECT_EQ(parsed->spec.numa_node, -1);
  EXPECT_EQ(parsed->spec.experts_dp_rank, 3);
  EXPECT_EQ(parsed->spec.experts_dp_size, 4);
  EXPECT_EQ(parsed->spec.experts_store, "10.0.0.1:13389");
  const model::DataParallelExperts ep = worker::expert_group_rank(parsed->spec);
  EXPECT_EQ(ep.rank, 7);  // DP-major: 3 * 2 + 1
  EXPECT_EQ(ep.size, 8);
  spec.expert_parallel = false;
  args = worker::stage_worker_args(spec, "none", "none");
  args.erase(args.begin());
  EXPECT_FALSE(worker::parse_stage_worker_args(args).ok()) << "experts over DP need whole experts";
}

TEST(StageLauncherTest, TopologyRules) {
  worker::PipelineTopology t;
  t.num_stages = 4;
  t.nnodes = 2;
  EXPECT_TRUE(worker::validate_topology(t).ok());
  EXPECT_EQ(worker::node_of_stage(t, 1), 0);
  EXPECT_EQ(worker::node_of_stage(t, 2), 1);
  t.num_stages = 3;
  EXPECT_EQ(worker::validate_topology(t).message(),
            "--pipeline-parallel-size 3 is not a multiple of --nnodes 2");
  t.num_stages = 2;
  t.node_rank = 2;
  EXPECT_EQ(worker::validate_topology(t).message(), "--node-rank 2 is outside [0, --nnodes 2)");
  t.node_rank = 0;
  t.nnodes = 3;
  t.num_stages = 3;
  EXPECT_EQ(worker::validate_topology(t).code(), common::StatusCode::kUnimplemented);
  // Tensor parallelism: ranks s * tp + r in contiguous blocks per node; a stage lives where
  // its rank 0 is.
  t.nnodes = 2;
  t.num_stages = 1;
  t.tp_size = 2;
  EXPECT_TRUE(worker::validate_topology(t).ok());
  EXPECT_EQ(worker::node_of_rank(t, 0, 0), 0);
  EXPECT_EQ(worker::node_of_rank(t, 0, 1), 1);
  EXPECT_EQ(worker::node_of_stage(t, 0), 0);
  t.num_stages = 2;
  EXPECT_EQ(worker::node_of_rank(t, 0, 1), 0);
  EXPECT_EQ(worker::node_of_rank(t, 1, 0), 1);
  t.master_port = 29500;
  EXPECT_EQ(worker::store_port(t), 29503) << "after the ring's three links";
  t.num_stages = 3;
  t.tp_size = 3;
  EXPECT_EQ(
      worker::validate_topology(t).message(),
      "--pipeline-parallel-size 3 x --tensor-parallel-size 3 is not a multiple of --nnodes 2");
}

}  // namespace
