// chunkpipe's commands as a user runs them: `logits` (JSON keys of the reference, chunked feeding),
// `tokenize`, `quantize`, `bench serve`'s flags, limits on numbers, and usage errors that name
// the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include "command.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using e2e::CommandResult;

CommandResult run(const std::string& args) {
  return e2e::run_shell(std::string(CHUNKPIPE_BINARY) + " " + args);
}

const std::string kModel = std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16";

TEST(LogitsCommandTest, WritesReferenceKeys) {
  CommandResult r = run("logits " + kModel +
                        " --ids 0,5,17,42 --all --mtp --chunk 3 --threads 2 --dtype float32");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["n_tokens"], 4);
  EXPECT_EQ(j["last_logits"].size(), 512u);
  EXPECT_EQ(j["all_logits"].size(), 4u);
  EXPECT_EQ(j["mtp"]["draft_logits"].size(), 4u);
  EXPECT_EQ(j["mtp"]["draft_logits_last"].size(), 512u);
  EXPECT_EQ(j["last_top5"].size(), 5u);
  // The golden short sequence is [0, 5, 17, 42]; its argmax and MTP next token are fixed.
  auto golden = nlohmann::json::parse(
      std::ifstream(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/golden/tiny-bf16.short.json"));
  EXPECT_EQ(j["last_argmax"], golden["last_argmax"]);
  EXPECT_EQ(j["mtp"]["next_token"], golden["mtp"]["next_token"]);
  EXPECT_EQ(j["mtp"]["draft_argmax"], golden["mtp"]["draft_argmax"]);
}

TEST(LogitsCommandTest, UsageErrorsNameTheProblem) {
  CommandResult r = run("logits " + kModel + " --ids 1,2 --bogus");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("unrecognized argument: --bogus"), std::string::npos) << r.out;
  r = run("logits " + kModel + " --ids 1,x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("'x' is not a token id"), std::string::npos) << r.out;
  r = run("logits " + kModel + " --ids 1,99999");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("token id 99999 is outside the vocabulary [0, 512)"), std::string::npos);
  r = run("logits /nonexistent --ids 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("/nonexistent/config.json: cannot open config.json"), std::string::npos);
  r = run("serve-nothing");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("unknown command 'serve-nothing'"), std::string::npos);
}

// The largest |difference| between two logits commands' last_logits.
double max_logit_change(const nlohmann::json& a, const nlohmann::json& b) {
  double moved = 0;
  for (size_t i = 0; i < a["last_logits"].size(); ++i) {
    moved = std::max(
        moved, std::abs(a["last_logits"][i].get<double>() - b["last_logits"][i].get<double>()));
  }
  return moved;
}

// Each command that builds an engine (logits, bench latency, bench throughput) must refuse
// `flags` as a flag error (exit 2) whose message holds `says`.
void expect_refused_everywhere(const std::string& flags, const std::string& says) {
  for (const std::string& cmd :
       {"logits " + kModel + " --ids 1", "bench latency " + kModel, "bench throughput " + kModel}) {
    const CommandResult r = run(cmd + " " + flags);
    EXPECT_EQ(r.exit_code, 2) << cmd << " " << flags << ": " << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << cmd << " " << flags << ": " << r.out;
  }
}

// --dtype means the same on every command that builds an engine: auto follows the checkpoint's
// torch_dtype (bfloat16 for tiny-bf16, float32 for tiny-noq-f32), bfloat16 rounds what enters the
// BF16 checkpoint's linears (the logits move, a little), float16 is refused by name.
TEST(LogitsCommandTest, DtypeIsSharedWithServe) {
  const std::string ids = " --ids 0,5,17,42 --threads 1";
  CommandResult f32 = run("logits " + kModel + ids + " --dtype float32");
  CommandResult bf16 = run("logits " + kModel + ids + " --dtype bfloat16");
  CommandResult automatic = run("logits " + kModel + ids);
  CommandResult f32_checkpoint =
      run("logits " + std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-noq-f32" + ids);
  for (const CommandResult* r : {&f32, &bf16, &automatic, &f32_checkpoint})
    ASSERT_EQ(r->exit_code, 0) << r->out;
  const auto a = nlohmann::json::parse(f32.out), b = nlohmann::json::parse(bf16.out);
  const auto c = nlohmann::json::parse(automatic.out);
  EXPECT_EQ(a["dtype"], "float32");
  EXPECT_EQ(b["dtype"], "bfloat16");
  EXPECT_EQ(c["dtype"], "bfloat16") << "auto must follow tiny-bf16's torch_dtype";
  EXPECT_EQ(c["last_logits"], b["last_logits"]);
  EXPECT_EQ(nlohmann::json::parse(f32_checkpoint.out)["dtype"], "float32")
      << "auto must follow tiny-noq-f32's torch_dtype";
  const double moved = max_logit_change(a, b);
  EXPECT_GT(moved, 1e-5) << "--dtype bfloat16 did not reach the kernels";
  EXPECT_LT(moved, 0.1) << "bf16 rounding moves logits by far less than this";
  expect_refused_everywhere("--dtype float16",
                            "--dtype float16 is not supported on CPU; use bfloat16 or float32");
  expect_refused_everywhere("--dtype fp64", "argument --dtype: invalid choice: 'fp64'");
}

// --kv-cache-dtype as serve reads it: auto keeps the latent cache f32 whatever --dtype says,
// bfloat16 rounds it (the logits move, a little), fp8 is refused as not built and anything else
// by argparse's words, on every command that builds an engine.
TEST(LogitsCommandTest, KvCacheDtypeIsSharedWithServe) {
  const std::string ids = " --ids 0,5,17,42,99,3,250 --threads 1";
  CommandResult f32 = run("logits " + kModel + ids);
  CommandResult bf16 = run("logits " + kModel + ids + " --kv-cache-dtype bfloat16");
  ASSERT_EQ(f32.exit_code, 0) << f32.out;
  ASSERT_EQ(bf16.exit_code, 0) << bf16.out;
  const auto a = nlohmann::json::parse(f32.out), b = nlohmann::json::parse(bf16.out);
  EXPECT_EQ(a["kv_cache_dtype"], "float32");
  EXPECT_EQ(b["kv_cache_dtype"], "bfloat16");
  const double moved = max_logit_change(a, b);
  EXPECT_GT(moved, 1e-6) << "--kv-cache-dtype bfloat16 did not reach the cache";
  EXPECT_LT(moved, 0.1) << "bf16 rounding of the latent moves logits by far less than this";
  expect_refused_everywhere("--kv-cache-dtype fp8_e4m3",
                            "--kv-cache-dtype fp8_e4m3: a quantized KV cache is not built");
  expect_refused_everywhere("--kv-cache-dtype half",
                            "argument --kv-cache-dtype: invalid choice: 'half'");
}

// bf16 attention is opt-in through CHUNKPIPE_ATTENTION: unset, "f32" and a bad value (logged)
// give the same logits; "bf16" moves them by its rounding where the CPU runs it (AVX512_BF16
// without AMX) and changes nothing elsewhere. 48 prompt tokens take the expanded form.
TEST(LogitsCommandTest, Bf16AttentionIsOptIn) {
  std::string ids = " --ids 0";
  for (int i = 1; i < 48; ++i) ids += "," + std::to_string(i * 7);
  const std::string cmd =
      std::string(CHUNKPIPE_BINARY) + " logits " + kModel + ids + " --threads 1";
  const auto logits = [&](const std::string& env) {
    CommandResult r = e2e::run_shell("(" + env + " " + cmd + " 2>/dev/null)");
    EXPECT_EQ(r.exit_code, 0) << env << ": " << r.out;
    return nlohmann::json::parse(r.out, nullptr, false)["last_logits"];
  };
  const auto unset = logits("env -u CHUNKPIPE_ATTENTION"), f32 = logits("CHUNKPIPE_ATTENTION=f32");
  const auto bad = logits("CHUNKPIPE_ATTENTION=fp16"), bf16 = logits("CHUNKPIPE_ATTENTION=bf16");
  ASSERT_TRUE(unset.is_array() && unset.size() > 0);
  EXPECT_EQ(f32, unset);
  EXPECT_EQ(bad, unset);
  const CommandResult warned = e2e::run_shell("CHUNKPIPE_ATTENTION=fp16 " + cmd);
  EXPECT_NE(warned.out.find("CHUNKPIPE_ATTENTION=fp16 is not one of f32, bf16"), std::string::npos)
      << warned.out;
  if (!(kernels::cpu_features().avx512_bf16 && !kernels::amx_bf16_active())) {
    EXPECT_EQ(bf16, unset) << "no AVX512_BF16 attention here: the flag changes nothing";
    return;
  }
  ASSERT_TRUE(bf16.is_array() && bf16.size() == unset.size());
  double moved = 0;
  for (size_t i = 0; i < bf16.size(); ++i)
    moved = std::max(moved, std::abs(bf16[i].get<double>() - unset[i].get<double>()));
  EXPECT_GT(moved, 1e-5) << "CHUNKPIPE_ATTENTION=bf16 did not reach the attention";
  EXPECT_LT(moved, 0.1) << "bf16 rounding moves logits by far less than this";
}

// `input` is piped to the command's stdin (printf %s keeps it byte-exact).
CommandResult run_with_input(const std::string& input, const std::string& args) {
  std::string quoted = "'";
  for (char c : input) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  return e2e::run_shell("printf %s " + quoted + " | " + CHUNKPIPE_BINARY + " " + args);
}

// Numbers inside list flags are read whole: a bad one is a usage error that names the flag
// (`--goodput ttft:abc` used to end the client with an uncaught exception).
TEST(BenchServeCommandTest, BadNumbersInListFlagsAreUsageErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--goodput ttft:abc", "argument --goodput: expected ttft:MS, tpot:MS or e2el:MS"},
      {"--goodput tpot:-5", "got 'tpot:-5'"},
      {"--goodput ttft", "got 'ttft'"},
      {"--goodput ttft:200 itl:5", "got 'itl:5'"},
      {"--metric-percentiles 99,9x", "argument --metric-percentiles: invalid value '9x'"},
      {"--metric-percentiles 150", "invalid value '150' (percentiles are numbers in [0, 100])"},
  };
  for (const auto& [flags, says] : cases) {
    // Port 1: nothing listens, and the flags are checked before any request.
    const CommandResult r = run("bench serve --model m --port 1 " + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << flags << "\n" << r.out;
  }
}

// Values that would wrap an int, start more threads than a process can, allocate more than the
// machine has, or plan for minutes are refused by name (each used to abort or hang).
TEST(CommandLimitsTest, HugeNumbersAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"logits " + kModel + " --ids 1 --threads 99999999",
       "argument --threads: must be at most 1024, got 99999999"},
      {"cpp-sim --stages 99999999999", "argument --stages: must be at most 1024"},
      {"cpp-sim --prompt 1000000 --chunk 1",
       "--prompt 1000000 in chunks of --min-chunk 1 makes more than 4096 chunks"},
      {"make-model /tmp/chunkpipe_never --no-tokenizer --hidden 99999999999",
       "argument --hidden: must be at most 2147483647"},
      {"make-model /tmp/chunkpipe_never --no-tokenizer --hidden 999999 --vocab 999999",
       "the weights of this model do not fit in memory"},
  };
  for (const auto& [args, says] : cases) {
    const CommandResult r = run(args);
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.out;
    EXPECT_LT(r.exit_code, 128) << args << ": ended by a signal\n" << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << args << "\n" << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists("/tmp/chunkpipe_never/model.safetensors"));
}

TEST(TokenizeCommandTest, EncodesAndDecodesLines) {
  const std::string dir = CHUNKPIPE_TOKENIZER_DIR;
  CommandResult r = run_with_input("Hello world\n你好<｜User｜>\n", "tokenize " + dir + " --bos");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "[0,19923,2058]\n[0,30594,128803]\n");
  r = run_with_input("\"a\\nb\"\n", "tokenize " + dir + " --json-lines");
  EXPECT_EQ(r.out, "[67,201,68]\n");
  r = run_with_input("[0, 19923, 2058]\n", "tokenize " + dir + " --decode --skip-special-tokens");
  EXPECT_EQ(r.out, "\"Hello world\"\n");
  r = run_with_input("[1, \"x\"]\n", "tokenize " + dir + " --decode");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("line 1 is not a JSON array of token ids"), std::string::npos) << r.out;
  r = run("tokenize /nonexistent");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("/nonexistent/tokenizer.json: cannot open"), std::string::npos) << r.out;
}

// `chunkpipe quantize` writes msmodelslim's layout that `logits` (and `serve`) load back; its
// usage errors name the problem.
TEST(QuantizeCommandTest, WritesALoadableW8A8Checkpoint) {
  char tmpl[] = "/tmp/chunkpipe_quantize_XXXXXX";
  const std::string dir = std::string(mkdtemp(tmpl)) + "/w8a8";
  CommandResult r = run("quantize " + kModel + " " + dir + " --w8a8 --static-attention");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("attention static"), std::string::npos) << r.out;
  auto description = nlohmann::json::parse(std::ifstream(dir + "/quant_model_description.json"));
  EXPECT_EQ(description["model.layers.1.self_attn.o_proj.weight"], "W8A8");
  EXPECT_EQ(description["model.layers.1.mlp.experts.0.down_proj.weight"], "W8A8_DYNAMIC");
  EXPECT_EQ(description["model.layers.1.self_attn.kv_b_proj.weight"], "FLOAT");
  EXPECT_EQ(description["lm_head.weight"], "FLOAT");
  CommandResult logits = run("logits " + dir + " --ids 0,5,17,42 2>/dev/null");
  ASSERT_EQ(logits.exit_code, 0) << logits.out;
  EXPECT_EQ(nlohmann::json::parse(logits.out)["last_logits"].size(), 512u);
  CommandResult again = run("quantize " + dir + " " + dir + "-2 --w8a8");
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.out.find("already holds a W8A8 checkpoint"), std::string::npos) << again.out;
  CommandResult no_scheme = run("quantize " + kModel + " " + dir + "-3");
  EXPECT_EQ(no_scheme.exit_code, 2);
  EXPECT_NE(no_scheme.out.find("argument --w8a8 is required"), std::string::npos);
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

// make-model --preset deepseek-v3 streams V3's layout (here with small dimension overrides, so
// that it runs in a test): FP8 linears with weight_scale_inv, BF16 embeddings, head, norms and
// router, the same bytes from the same seed; it loads, serves logits, and `quantize --w8a8`
// reads it.
TEST(MakeModelCommandTest, PresetStreamsALoadableFp8Checkpoint) {
  char tmpl[] = "/tmp/chunkpipe_preset_XXXXXX";
  const std::string root = mkdtemp(tmpl);
  const std::string dims =
      " --preset deepseek-v3 --layers 2 --dense-layers 1 --experts 8 --n-group 4 --topk-group 2 "
      "--top-k 2 --hidden 256 --inter 512 --moe-inter 128 --heads 4 --q-lora-rank 64 "
      "--kv-lora-rank 64 --qk-nope 32 --qk-rope 16 --v-head 32 --vocab 2048 --no-tokenizer "
      "--shards 2 --seed 5";
  CommandResult a = run("make-model " + root + "/a" + dims);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  const nlohmann::json summary = nlohmann::json::parse(a.out);
  EXPECT_EQ(summary["shards"], 2);
  EXPECT_GT(summary["bytes"].get<double>(), 1e6);
  CommandResult b = run("make-model " + root + "/b" + dims);
  ASSERT_EQ(b.exit_code, 0) << b.out;
  for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                        "config.json", "model.safetensors.index.json"}) {
    std::ifstream fa(root + "/a/" + f, std::ios::binary), fb(root + "/b/" + f, std::ios::binary);
    const std::string ca((std::istreambuf_iterator<char>(fa)), {});
    const std::string cb((std::istreambuf_iterator<char>(fb)), {});
    EXPECT_FALSE(ca.empty()) << f;
    EXPECT_TRUE(ca == cb) << f << " differs between two runs with the same seed";
  }
  const auto config = nlohmann::json::parse(std::ifstream(root + "/a/config.json"));
  EXPECT_EQ(config["quantization_config"]["quant_method"], "fp8");
  EXPECT_EQ(config["first_k_dense_replace"], 1);
  EXPECT_EQ(config["num_nextn_predict_layers"], 1);  // the preset's, not overridden
  const auto index = nlohmann::json::parse(std::ifstream(root + "/a/model.safetensors.index.json"));
  EXPECT_TRUE(
      index["weight_map"].contains("model.layers.1.mlp.experts.7.down_proj.weight_scale_inv"));
  EXPECT_TRUE(index["weight_map"].contains("model.layers.2.eh_proj.weight"));
  CommandResult logits = run("logits " + root + "/a --ids 0,5,17,42 --mtp 2>/dev/null");
  ASSERT_EQ(logits.exit_code, 0) << logits.out;
  const nlohmann::json out = nlohmann::json::parse(logits.out);
  EXPECT_EQ(out["last_logits"].size(), 2048u);
  for (float v : out["last_logits"]) ASSERT_TRUE(std::isfinite(v));
  CommandResult q = run("quantize " + root + "/a " + root + "/w8a8 --w8a8");
  EXPECT_EQ(q.exit_code, 0) << q.out;
  CommandResult bad = run("make-model " + root + "/c --preset deepseek-v2");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("--preset: invalid choice: 'deepseek-v2'"), std::string::npos) << bad.out;
  std::filesystem::remove_all(root);
}

}  // namespace

namespace {

// A model whose weights, scratch and KV cache exceed the host is refused before anything loads,
// with the numbers and the flags to change.
TEST(ServeMemoryPlanTest, AModelThatWillNotFitIsRefusedBeforeLoading) {
  const std::string serve =
      "serve " + kModel + " --tokenizer " CHUNKPIPE_TOKENIZER_DIR " --host 127.0.0.1 --port 0 ";
  // Twice this host's memory, as --kv-cache-memory.
  const long long host = static_cast<long long>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  const CommandResult kv = run(serve + "--kv-cache-memory " + std::to_string(2 * host));
  EXPECT_EQ(kv.exit_code, 1) << kv.out;
  for (const char* part :
       {"Memory plan: weights", "does not fit in memory", "--kv-cache-memory", "GiB"})
    EXPECT_NE(kv.out.find(part), std::string::npos) << part << " in:\n" << kv.out;
  EXPECT_EQ(kv.out.find("Loaded the weights"), std::string::npos) << kv.out;
  // A token budget whose scratch alone is past the host.
  const CommandResult scratch =
      run(serve + "--gpu-memory-utilization 0.000001 --max-num-batched-tokens 4096");
  EXPECT_EQ(scratch.exit_code, 1) << scratch.out;
  for (const char* part :
       {"scratch", "max_num_batched_tokens=4096", "--gpu-memory-utilization", "--max-model-len"})
    EXPECT_NE(scratch.out.find(part), std::string::npos) << part << " in:\n" << scratch.out;
  EXPECT_EQ(scratch.out.find("Loaded the weights"), std::string::npos) << scratch.out;
}

}  // namespace

namespace {

// cpp-sim --fit-layers scales a fitted slice's per-layer costs to the model's layers per stage:
// one layer per stage fitted, DeepSeek-V3's 61 layers over 2 stages (31 on the slowest) cost
// about 31 times as much; a config of 2 layers over 2 stages predicts the fit unchanged.
TEST(CppSimCommandTest, FitLayersScalesASlicesCostsToTheWholeModel) {
  char tmpl[] = "/tmp/chunkpipe_cppsim_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/serve.log")
      << "INFO [ProfilingChunk] Cost model: expanded: c=2.0 ms, token=500.0 us, history=1.0 us, "
         "pair=20.0 ns; absorbed: not fitted\n";
  auto config = nlohmann::json::parse(
      std::ifstream(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/tiny-bf16/config.json"));
  config["num_hidden_layers"] = 2;
  std::ofstream(dir + "/config.json") << config.dump();
  const std::string sim = "cpp-sim --fit-log " + dir + "/serve.log --prompt 4096 --chunk 1024 ";
  auto ttft = [](const std::string& out) {
    const size_t at = out.find("fixed ");
    const size_t t = out.find("TTFT", at);
    return t == std::string::npos ? -1.0 : std::stod(out.substr(t + 4));
  };
  const CommandResult plain = run(sim);
  const CommandResult same = run(sim + "--fit-layers 1 --model-config " + dir + "/config.json");
  const CommandResult whole = run(sim + "--fit-layers 1");
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  ASSERT_EQ(same.exit_code, 0) << same.out;
  ASSERT_EQ(whole.exit_code, 0) << whole.out;
  EXPECT_NE(whole.out.find("scaled to 31 (61 layers over 2 stages)"), std::string::npos)
      << whole.out;
  EXPECT_DOUBLE_EQ(ttft(same.out), ttft(plain.out));
  const double ratio = ttft(whole.out) / ttft(plain.out);
  EXPECT_GT(ratio, 29.0) << whole.out;  // c (2 ms per chunk) does not scale
  EXPECT_LT(ratio, 31.0) << whole.out;
  const CommandResult bad = run("cpp-sim --fit-layers 2");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("--fit-layers scales a --fit-log"), std::string::npos) << bad.out;
  std::filesystem::remove_all(dir);
}

}  // namespace
