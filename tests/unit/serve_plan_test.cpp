// serve's plan from the seeds' command lines as a user pastes them (CPP prefiller, MTP decoder
// rank, balance scheduling), and the errors a mistyped flag or config gets, without starting a
// process.
#include "cli/serve_plan.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct Parsed {
  common::Status status;
  cli::ServePlan plan;
};

Parsed plan_of(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"chunkpipe", "serve"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  cli::ArgParser p("chunkpipe serve", "test");
  p.add_positional("MODEL", "model directory");
  cli::add_serve_flags(p);
  Parsed out;
  out.status = p.parse(static_cast<int>(argv.size()), argv.data(), 2);
  if (out.status.ok()) out.status = cli::plan_serve(p, &out.plan);
  return out;
}

// The P node of the CPP seed: TP 8 x PP 2, the profiling chunk config, a Mooncake producer.
TEST(ServePlanTest, TheCppSeedsPrefillerPlansAsWritten) {
  const Parsed r = plan_of({"/nonexistent/DeepSeek-V3.1-w8a8",
                            "--host",
                            "0.0.0.0",
                            "--port",
                            "8003",
                            "--served-model-name",
                            "model",
                            "--tensor-parallel-size",
                            "8",
                            "--pipeline-parallel-size",
                            "2",
                            "--enable-expert-parallel",
                            "--max-num-seqs",
                            "32",
                            "--max-model-len",
                            "131072",
                            "--max-num-batched-tokens",
                            "32768",
                            "--gpu-memory-utilization",
                            "0.9",
                            "--enable-chunked-prefill",
                            "--enable-prefix-caching",
                            "--no-async-scheduling",
                            "--trust-remote-code",
                            "--quantization",
                            "ascend",
                            "--additional-config",
                            R"({
    "scheduler_config": {
      "profiling_chunk_config": {"enabled":true, "smooth_factor":1.0, "min_chunk":4096}
    }
  })",
                            "--kv-transfer-config",
                            R"({
    "kv_connector": "MooncakeConnectorV1",
    "kv_role": "kv_producer",
    "kv_port": "36000",
    "engine_id": "0",
    "kv_connector_extra_config": {
      "prefill": {"pp_size": 2, "dp_size": 1, "tp_size": 8},
      "decode": {"dp_size": 32, "tp_size": 1}
    }
  })"});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  const cli::ServePlan& plan = r.plan;
  EXPECT_EQ(plan.model_dir, "/nonexistent/DeepSeek-V3.1-w8a8");
  EXPECT_EQ(plan.server.port, 8003);
  EXPECT_EQ(plan.pipeline_parallel_size, 2);
  EXPECT_EQ(plan.tensor_parallel_size, 8);
  EXPECT_TRUE(plan.expert_parallel);
  EXPECT_EQ(plan.engine.scheduler.max_num_seqs, 32);
  EXPECT_DOUBLE_EQ(plan.memory_utilization, 0.9);
  EXPECT_TRUE(plan.engine.enable_prefix_caching);
  ASSERT_TRUE(plan.engine.profiling_chunk.has_value());
  EXPECT_TRUE(plan.engine.profiling_chunk->enabled);
  EXPECT_EQ(plan.engine.profiling_chunk->min_chunk, 4096);
  EXPECT_EQ(plan.kv_transfer.kv_connector, "MooncakeConnectorV1");
  EXPECT_EQ(plan.kv_transfer.kv_role, "kv_producer");
  EXPECT_EQ(plan.kv_transfer.kv_port, "36000");
  EXPECT_TRUE(plan.server.kv_producer);
  const transfer::ConnectorPlacement at = cli::connector_placement(plan);
  EXPECT_EQ(at.pp_size, 2);
  EXPECT_EQ(at.tp_size, 8);
}

// One external DP rank of the seeds' decoders: MTP, the recompute scheduler on a consumer, no
// prefix caching.
TEST(ServePlanTest, TheSeedsDecoderRankPlansAsWritten) {
  const Parsed r =
      plan_of({"/nonexistent/DeepSeek-V3.1-w8a8",
               "--port",
               "7100",
               "--data-parallel-size",
               "4",
               "--data-parallel-rank",
               "1",
               "--data-parallel-address",
               "127.0.0.1",
               "--data-parallel-rpc-port",
               "12321",
               "--tensor-parallel-size",
               "1",
               "--seed",
               "1024",
               "--max-num-batched-tokens",
               "256",
               "--max-num-seqs",
               "28",
               "--no-enable-prefix-caching",
               "--speculative-config",
               R"({"num_speculative_tokens": 1, "method": "mtp"})",
               "--compilation-config",
               R"({"cudagraph_mode": "FULL_DECODE_ONLY"})",
               "--additional-config",
               R"({"recompute_scheduler_enable":true,"multistream_overlap_shared_expert": true})",
               "--kv-transfer-config",
               R"({"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer",
                                "kv_port": "30200", "kv_connector_extra_config": {
                                "prefill": {"dp_size": 2, "tp_size": 8},
                                "decode": {"dp_size": 4, "tp_size": 1}}})"});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  const cli::ServePlan& plan = r.plan;
  EXPECT_EQ(plan.dp.size, 4);
  EXPECT_EQ(plan.dp.rank, 1);
  EXPECT_TRUE(plan.dp.external);
  EXPECT_EQ(plan.data_parallel_rank, 1);
  EXPECT_EQ(plan.engine.seed, 1024u);
  EXPECT_FALSE(plan.engine.enable_prefix_caching);
  ASSERT_TRUE(plan.speculative.has_value());
  EXPECT_EQ(plan.speculative->num_speculative_tokens, 1);
  EXPECT_TRUE(plan.engine.scheduler.recompute_scheduler_enable);
  EXPECT_EQ(plan.kv_transfer.kv_role, "kv_consumer");
  EXPECT_EQ(cli::connector_placement(plan).dp_rank, 1);
}

// vllm-ascend's balance scheduling: the seeds export VLLM_ASCEND_BALANCE_SCHEDULING=1; the key
// enable_balance_scheduling also turns it on. It applies to DP ranks in lock step only, and it
// cannot be combined with CPP's profiling_chunk_config.
TEST(ServePlanTest, BalanceSchedulingGatesRanksInLockStepOnly) {
  const std::vector<std::string> dp_ep = {
      "m", "--data-parallel-size",    "2",         "--data-parallel-rank",
      "0", "--data-parallel-address", "127.0.0.1", "--enable-expert-parallel"};
  auto with = [](std::vector<std::string> args, const std::vector<std::string>& more) {
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  const Parsed plain = plan_of(dp_ep);
  ASSERT_TRUE(plain.status.ok()) << plain.status.message();
  EXPECT_FALSE(plain.plan.engine.balance_scheduling);
  for (const char* config : {R"({"enable_balance_scheduling": true})",
                             R"({"scheduler_config": {"enable_balance_scheduling": true}})"}) {
    const Parsed r = plan_of(with(dp_ep, {"--additional-config", config}));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_TRUE(r.plan.engine.balance_scheduling) << config;
    const Parsed alone = plan_of({"m", "--additional-config", config});
    ASSERT_TRUE(alone.status.ok()) << alone.status.message();
    EXPECT_FALSE(alone.plan.engine.balance_scheduling) << "no DP group: no effect";
  }
  setenv("VLLM_ASCEND_BALANCE_SCHEDULING", "1", 1);
  const Parsed from_env = plan_of(dp_ep);
  const Parsed with_cpp =
      plan_of({"m", "-pp", "2", "--additional-config",
               R"({"scheduler_config": {"profiling_chunk_config": {"enabled": true}}})"});
  unsetenv("VLLM_ASCEND_BALANCE_SCHEDULING");
  ASSERT_TRUE(from_env.status.ok()) << from_env.status.message();
  EXPECT_TRUE(from_env.plan.engine.balance_scheduling);
  ASSERT_FALSE(with_cpp.status.ok());
  EXPECT_NE(with_cpp.status.message().find("profiling_chunk_config cannot be enabled together "
                                           "with balance scheduling"),
            std::string::npos)
      << with_cpp.status.message();
  const Parsed typed =
      plan_of(with(dp_ep, {"--additional-config", R"({"enable_balance_scheduling": "yes"})"}));
  EXPECT_EQ(typed.status.message(),
            "additional_config.enable_balance_scheduling must be a boolean");
}

// Each mistake gets an error that names the flag or field; features not built say so.
TEST(ServePlanTest, MistakesAreNamed) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"m", "--gpu-memory-utilization", "1.5"}, "--gpu-memory-utilization must be in (0, 1]"},
      {{"m", "--gpu-memory-utilization", "lots"}, "invalid float value: 'lots'"},
      {{"m", "--gpu-memory-utilization", "0.9x"}, "invalid float value: '0.9x'"},
      {{"m", "--pp-layer-partition", "3,5x"},
       "argument --pp-layer-partition: invalid layer count '5x'"},
      {{"m", "--threads", "99999999"}, "argument --threads: must be at most 1024, got 99999999"},
      {{"m", "--additional-config", R"({"scheduler_config": 5})"},
       "additional_config.scheduler_config must be a JSON object"},
      {{"m", "--additional-config",
        R"({"finegrained_tp_config": {"lmhead_tensor_parallel_size": 99999999999}})"},
       "lmhead_tensor_parallel_size must be in [0, 1024], got 99999999999"},
      {{"m", "--pipeline-parallel-size", "99999999999"},
       "argument --pipeline-parallel-size: must be at most 1024"},
      {{"m", "--max-num-seqs", "99999999999"},
       "argument --max-num-seqs: must be at most 2147483647"},
      {{"m", "--data-parallel-size", "5000"},
       "argument --data-parallel-size: must be at most 1024"},
      {{"m", "--pp-layer-partition", "9,-1"},
       "argument --pp-layer-partition: invalid layer count '-1'"},
      {{"m", "--kv-transfer-config", "{not json"}, "--kv-transfer-config"},
      {{"m", "--kv-transfer-config", R"({"kv_connector": "MooncakeConnectorV1"})"}, "kv_role"},
      {{"m", "--additional-config", "[1]"}, "argument --additional-config: invalid JSON object"},
      {{"m", "--quantization", "gptq"}, "Unknown quantization method: gptq"},
      {{"m", "--dtype", "float16"}, "float16 is not supported on CPU"},
      {{}, "the following arguments are required: MODEL"},
      {{"m", "--kv-cache-dtype", "fp8"}, "--kv-cache-dtype fp8: a quantized KV cache is not built"},
      {{"m", "--kv-cache-dtype", "float16"},
       "argument --kv-cache-dtype: invalid choice: 'float16' (choose from 'auto', 'bfloat16'"},
      {{"m", "--enable-sleep-mode"}, "--enable-sleep-mode: sleep mode is not built"},
      {{"m", "--api-server-count", "4"}, "more than one API server is not built"},
      {{"m", "--ssl-keyfile", "k.pem"}, "TLS (put a TLS proxy in front) is not built"},
      {{"m", "--override-generation-config", R"({"temperature": "hot"})"},
       "'temperature' must be a number"},
      {{"m", "--override-generation-config", "1"}, "--override-generation-config: invalid JSON"},
      {{"m", "--h11-max-incomplete-event-size", "0"}, "--h11-max-incomplete-event-size"},
      {{"m", "--uvicorn-log-level", "loud"},
       "argument --uvicorn-log-level: invalid choice: 'loud' (choose from 'critical', 'debug', "
       "'error', 'info', 'trace', 'warning')"},
      {{"m", "--scheduling-policy", "sjf"},
       "argument --scheduling-policy: invalid choice: 'sjf' (choose from 'fcfs', 'priority')"},
      {{"m", "--logprobs-mode", "logits"}, "argument --logprobs-mode: invalid choice: 'logits'"},
      {{"m", "--long-prefill-token-threshold", "-1"},
       "argument --long-prefill-token-threshold: must be at least 0"},
  };
  for (const Case& c : cases) {
    const Parsed r = plan_of(c.args);
    ASSERT_FALSE(r.status.ok()) << c.says;
    EXPECT_NE(r.status.message().find(c.says), std::string::npos)
        << "wanted \"" << c.says << "\" in: " << r.status.message();
  }
}

}  // namespace

namespace {

// vLLM flags that change nothing on this engine are accepted at their harmless values (a
// pasted command line starts), and the server-side flags land in the server's config.
TEST(ServePlanTest, VllmFlagsWithoutEffectAreAcceptedAndServerFlagsApply) {
  const Parsed r = plan_of({"m",
                            "--kv-cache-dtype",
                            "auto",
                            "--load-format",
                            "safetensors",
                            "--distributed-executor-backend",
                            "mp",
                            "--disable-custom-all-reduce",
                            "--disable-uvicorn-access-log",
                            "--uvicorn-log-level",
                            "warning",
                            "--api-server-count",
                            "1",
                            "--max-seq-len-to-capture",
                            "8192",
                            "--enable-server-load-tracking",
                            "--enable-request-id-headers",
                            "--response-role",
                            "bot",
                            "--h11-max-incomplete-event-size",
                            "4194304",
                            "--override-generation-config",
                            R"({"top_k": 50, "other": true})"});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_TRUE(r.plan.server.enable_server_load_tracking);
  EXPECT_TRUE(r.plan.server.enable_request_id_headers);
  EXPECT_EQ(r.plan.server.response_role, "bot");
  EXPECT_EQ(r.plan.server.max_header_bytes, 4194304u);
  EXPECT_EQ(r.plan.generation_overrides["top_k"], 50);
  const Parsed plain = plan_of({"m"});
  ASSERT_TRUE(plain.status.ok());
  EXPECT_FALSE(plain.plan.server.enable_server_load_tracking);
  EXPECT_EQ(plain.plan.server.response_role, "assistant");
  EXPECT_FALSE(plain.plan.server.priority_scheduling);
  EXPECT_EQ(plain.plan.engine.scheduler.policy, sched::SchedulingPolicy::kFcfs);
  EXPECT_EQ(plain.plan.engine.logprobs_mode, sched::LogprobsMode::kRawLogprobs);
  EXPECT_EQ(plain.plan.engine.scheduler.long_prefill_token_threshold, 0);
  EXPECT_FALSE(r.plan.engine.bf16_kv_cache) << "--kv-cache-dtype auto keeps f32";
  const Parsed bf16 = plan_of({"m", "--kv-cache-dtype", "bfloat16"});
  ASSERT_TRUE(bf16.status.ok()) << bf16.status.message();
  EXPECT_TRUE(bf16.plan.engine.bf16_kv_cache);
}

// Scheduling and sampling flags vLLM has, with their values.
TEST(ServePlanTest, SchedulingPolicyLogprobsModeAndPrefillThreshold) {
  const Parsed r = plan_of({"m", "--scheduling-policy", "priority", "--logprobs-mode",
                            "processed_logits", "--long-prefill-token-threshold", "256"});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_TRUE(r.plan.server.priority_scheduling);
  EXPECT_EQ(r.plan.engine.scheduler.policy, sched::SchedulingPolicy::kPriority);
  EXPECT_EQ(r.plan.engine.logprobs_mode, sched::LogprobsMode::kProcessedLogits);
  EXPECT_EQ(r.plan.engine.scheduler.long_prefill_token_threshold, 256);
  const std::pair<const char*, sched::LogprobsMode> modes[] = {
      {"raw_logprobs", sched::LogprobsMode::kRawLogprobs},
      {"raw_logits", sched::LogprobsMode::kRawLogits},
      {"processed_logprobs", sched::LogprobsMode::kProcessedLogprobs}};
  for (const auto& [name, mode] : modes) {
    const Parsed m = plan_of({"m", "--logprobs-mode", name});
    ASSERT_TRUE(m.status.ok()) << name;
    EXPECT_EQ(m.plan.engine.logprobs_mode, mode) << name;
  }
}

}  // namespace

namespace {

// --max-model-len takes vLLM's human-readable forms; a count that would not fit is refused.
TEST(ServePlanTest, MaxModelLenReadsSuffixesAndRefusesOverflow) {
  auto value = [](const std::string& text) {
    std::vector<std::string> all = {"chunkpipe", "serve", "m", "--max-model-len", text};
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    cli::ArgParser p("chunkpipe serve", "test");
    p.add_positional("MODEL", "model directory");
    cli::add_serve_flags(p);
    EXPECT_TRUE(p.parse(static_cast<int>(argv.size()), argv.data(), 2).ok());
    return cli::max_model_len_value(p);
  };
  EXPECT_EQ(*value("32k"), 32000);
  EXPECT_EQ(*value("32K"), 32768);
  EXPECT_EQ(*value("1m"), 1000000);
  EXPECT_EQ(*value("4096"), 4096);
  for (const char* bad : {"0", "-1", "99999999999999M", "9223372036854775807", "2048M"}) {
    const auto r = value(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("argument --max-model-len: must be in [1, 2147483647]"),
              std::string::npos)
        << r.status().message();
  }
  EXPECT_NE(value("12x").status().message().find("invalid int value: '12x'"), std::string::npos);
}

}  // namespace
