// `--dtype` as vLLM spells it, read for a CPU engine: the activation precision of BF16-weight
// linear layers. One definition for `serve`, `bench latency|throughput` and `logits`, so every
// command accepts, resolves and refuses the same values with the same words. Thread-safe; reads
// only the checkpoint's config.json.
#pragma once

#include <string>

#include "cli/arg_parser.h"
#include "common/status.h"
#include "kernels/gemm.h"
#include "model/kv_cache.h"

namespace cli {

// Adds --dtype (default "auto").
void add_dtype_option(ArgParser& p);

// auto follows the checkpoint's config.json `torch_dtype`, as vLLM's does: "bfloat16" -> kBf16,
// anything else (or a config that cannot be read; the model load then names the problem) -> kF32.
// float / float32 -> kF32 (exact to the reference); bfloat16 -> kBf16; half / float16 are refused
// as unsupported on CPU; anything else gets argparse's invalid-choice message.
common::Result<kernels::ActivationPrecision> parse_dtype_option(const ArgParser& p,
                                                                const std::string& model_dir);

// Adds --kv-cache-dtype (default "auto").
void add_kv_cache_dtype_option(ArgParser& p);

// The latent cache's dtype. auto keeps it f32, where vLLM's auto takes the model's dtype: a bf16
// cache rounds each latent, so the expanded and absorbed forms (which differ by f32 rounding
// before it) can round a value to neighbouring bf16 numbers, and greedy outputs then depend on
// how prompts were chunked and batched. bfloat16 asks for that trade: half the KV memory and
// transfer bytes, and the history's expansion on vdpbf16ps. fp8 variants are refused as not
// built; anything else gets argparse's invalid-choice message.
common::Result<model::KvCacheDtype> parse_kv_cache_dtype_option(const ArgParser& p);

// "float32" or "bfloat16", for logs and result JSON.
const char* dtype_name(kernels::ActivationPrecision precision);

}  // namespace cli
