// `--dtype` as vLLM spells it, read for a CPU engine: the activation precision of BF16-weight
// linear layers. One definition for `serve`, `bench latency|throughput` and `logits`, so every
// command accepts, resolves and refuses the same values with the same words. Thread-safe; reads
// only the checkpoint's config.json.
#pragma once

#include <string>

#include "cli/arg_parser.h"
#include "common/status.h"
#include "kernels/gemm.h"

namespace cli {

// Adds --dtype (default "auto").
void add_dtype_option(ArgParser& p);

// auto follows the checkpoint's config.json `torch_dtype`, as vLLM's does: "bfloat16" -> kBf16,
// anything else (or a config that cannot be read; the model load then names the problem) -> kF32.
// float / float32 -> kF32 (exact to the reference); bfloat16 -> kBf16; half / float16 are refused
// as unsupported on CPU; anything else gets argparse's invalid-choice message.
common::Result<kernels::ActivationPrecision> parse_dtype_option(const ArgParser& p,
                                                                const std::string& model_dir);

// "float32" or "bfloat16", for logs and result JSON.
const char* dtype_name(kernels::ActivationPrecision precision);

}  // namespace cli
