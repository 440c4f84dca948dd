// `--dtype` as vLLM spells it, read for a CPU engine: the activation precision of BF16-weight
// linear layers. One definition for `serve`, `bench latency|throughput` and `logits`, so every
// command accepts and refuses the same values with the same words. Pure; thread-safe.
#pragma once

#include "cli/arg_parser.h"
#include "common/status.h"
#include "kernels/gemm.h"

namespace cli {

// Adds --dtype (default "auto").
void add_dtype_option(ArgParser& p);

// auto / float / float32 -> kF32 (exact to the reference); bfloat16 -> kBf16; half / float16
// are refused as unsupported on CPU; anything else gets argparse's invalid-choice message.
common::Result<kernels::ActivationPrecision> parse_dtype_option(const ArgParser& p);

// "float32" or "bfloat16", for logs and result JSON.
const char* dtype_name(kernels::ActivationPrecision precision);

}  // namespace cli
