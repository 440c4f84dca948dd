// The table of vLLM serve flags that change nothing on chunkpipe's CPU engine.
#include "cli/vllm_compat_flags.h"

#include <string>
#include <vector>

#include "common/logging.h"

namespace cli {
namespace {

struct CompatFlag {
  const char* name;
  bool is_flag;                        // boolean (true when given), else takes a value
  std::vector<const char*> no_effect;  // values that change nothing; empty: every value
  const char* why;                     // what the flag or those values map to here
  const char* not_built;               // the feature other values (or the flag) need; or null
};

// vLLM 0.10's names. `why` null: every use is refused.
const std::vector<CompatFlag>& table() {
  static const std::vector<CompatFlag> flags = {
      {"disable-custom-all-reduce",
       true,
       {},
       "custom all-reduce is a GPU kernel; collectives here are shared memory or gloo",
       nullptr},
      {"max-seq-len-to-capture", false, {}, "no CUDA graphs are captured on CPU", nullptr},
      {"disable-uvicorn-access-log", true, {}, "chunkpipe writes no access log", nullptr},
      {"disable-fastapi-docs", true, {}, "chunkpipe serves no /docs or /openapi.json", nullptr},
      {"root-path",
       false,
       {},
       "routes are served from /; the prefix matters only to a proxy in front",
       nullptr},
      {"revision", false, {}, "MODEL is a local directory; hub revisions do not apply", nullptr},
      {"code-revision", false, {}, "no model code is loaded from checkpoints", nullptr},
      {"tokenizer-revision", false, {}, "the tokenizer is read from a local directory", nullptr},
      {"download-dir", false, {}, "MODEL is a local directory; nothing is downloaded", nullptr},
      {"max-parallel-loading-workers",
       false,
       {},
       "safetensors are memory-mapped, not loaded by workers",
       nullptr},
      {"prefix-caching-hash-algo",
       false,
       {},
       "prefix blocks are keyed by chunkpipe's own hash of their token ids",
       nullptr},
      {"guided-decoding-backend",
       false,
       {},
       "requests that ask for constrained decoding are refused by name",
       nullptr},
      {"load-format",
       false,
       {"auto", "safetensors"},
       "checkpoints are read as safetensors",
       "load formats other than safetensors"},
      {"tokenizer-mode",
       false,
       {"auto", "slow", "hf"},
       "the tokenizer is chunkpipe's own, from tokenizer.json",
       "mistral and custom tokenizers"},
      {"distributed-executor-backend",
       false,
       {"mp", "uni"},
       "ranks and stages are processes of this binary",
       "ray and external_launcher executors"},
      {"api-server-count", false, {"1"}, "one API server process", "more than one API server"},
      {"max-num-partial-prefills",
       false,
       {"1"},
       "one partial prefill at a time",
       "concurrent partial prefills"},
      {"max-long-partial-prefills",
       false,
       {"1"},
       "one long partial prefill at a time",
       "concurrent partial prefills"},
      {"cpu-offload-gb", false, {"0"}, "weights already live in host memory", "weight offload"},
      {"enable-sleep-mode", true, {}, nullptr, "sleep mode"},
      {"ssl-keyfile", false, {}, nullptr, "TLS (put a TLS proxy in front)"},
      {"ssl-certfile", false, {}, nullptr, "TLS (put a TLS proxy in front)"},
      {"ssl-ca-certs", false, {}, nullptr, "TLS (put a TLS proxy in front)"},
      {"hf-overrides", false, {}, nullptr, "--hf-overrides"},
      {"middleware", false, {}, nullptr, "ASGI middleware"},
      {"tool-parser-plugin",
       false,
       {},
       nullptr,
       "tool parser plugins (deepseek_v3 and deepseek_v31 are built in)"},
      {"enable-lora", true, {}, nullptr, "LoRA adapters"},
      {"lora-modules", false, {}, nullptr, "LoRA adapters"},
      {"enable-prompt-embeds", true, {}, nullptr, "prompt embeddings"},
  };
  return flags;
}

}  // namespace

void add_vllm_compat_flags(ArgParser& p) {
  for (const CompatFlag& f : table()) {
    const std::string help = f.why != nullptr
                                 ? std::string("accepted (vLLM): ") + f.why
                                 : std::string("not built in chunkpipe: ") + f.not_built;
    if (f.is_flag) {
      p.add_flag(f.name, help);
    } else {
      p.add_option(f.name, help);
    }
  }
}

common::Status check_vllm_compat_flags(const ArgParser& p) {
  for (const CompatFlag& f : table()) {
    if (!p.given(f.name) || (f.is_flag && !p.flag(f.name))) continue;
    const std::string value = f.is_flag ? "" : p.option(f.name).value_or("");
    bool no_effect = f.why != nullptr && f.no_effect.empty();
    for (const char* v : f.no_effect) no_effect = no_effect || value == v;
    if (!no_effect) {
      return common::unimplemented(std::string("--") + f.name + (f.is_flag ? "" : " " + value) +
                                   ": " + f.not_built + " is not built yet in chunkpipe");
    }
    LOG(INFO) << "--" << f.name << (f.is_flag ? "" : " " + value) << ": accepted; " << f.why;
  }
  return common::Status::ok_status();
}

}  // namespace cli
