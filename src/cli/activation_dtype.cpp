// --dtype parsing shared by the commands that build an engine.
#include "cli/activation_dtype.h"

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace cli {
namespace {

// The checkpoint's torch_dtype, or "" when config.json is missing, malformed or silent. Only
// this one key is read: a config the model loader would refuse is refused there, by name.
std::string checkpoint_torch_dtype(const std::string& model_dir) {
  std::ifstream in(model_dir + "/config.json");
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config =
      nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return "";
  const auto it = config.find("torch_dtype");
  return it != config.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

void add_dtype_option(ArgParser& p) {
  p.add_option("dtype",
               "activation dtype: auto follows the checkpoint's torch_dtype (a bfloat16 checkpoint "
               "runs bfloat16); bfloat16 rounds the activations entering BF16-weight linears to "
               "bf16; float32 keeps f32 activations, exact to the reference",
               "auto");
}

common::Result<kernels::ActivationPrecision> parse_dtype_option(const ArgParser& p,
                                                                const std::string& model_dir) {
  const std::string dtype = p.option("dtype").value_or("auto");
  if (dtype == "bfloat16") return kernels::ActivationPrecision::kBf16;
  if (dtype == "float" || dtype == "float32") return kernels::ActivationPrecision::kF32;
  if (dtype == "auto") {
    return checkpoint_torch_dtype(model_dir) == "bfloat16" ? kernels::ActivationPrecision::kBf16
                                                           : kernels::ActivationPrecision::kF32;
  }
  if (dtype == "half" || dtype == "float16") {
    return common::invalid_argument("--dtype " + dtype +
                                    " is not supported on CPU; use bfloat16 or float32");
  }
  return common::invalid_argument(
      "argument --dtype: invalid choice: '" + dtype +
      "' (choose from 'auto', 'half', 'float16', 'bfloat16', 'float', 'float32')");
}

void add_kv_cache_dtype_option(ArgParser& p) {
  p.add_option("kv-cache-dtype",
               "latent KV cache dtype: auto keeps float32, so outputs do not depend on chunking "
               "or batching; bfloat16 halves the cache and its transfers",
               "auto");
}

common::Result<model::KvCacheDtype> parse_kv_cache_dtype_option(const ArgParser& p) {
  const std::string v = p.option("kv-cache-dtype").value_or("auto");
  if (v == "auto") return model::KvCacheDtype::kF32;
  if (v == "bfloat16") return model::KvCacheDtype::kBf16;
  if (v.rfind("fp8", 0) == 0) {
    return common::unimplemented("--kv-cache-dtype " + v +
                                 ": a quantized KV cache is not built yet in chunkpipe");
  }
  return common::invalid_argument(
      "argument --kv-cache-dtype: invalid choice: '" + v +
      "' (choose from 'auto', 'bfloat16', 'fp8', 'fp8_e4m3', 'fp8_e5m2', 'fp8_inc', 'fp8_ds_mla')");
}

const char* dtype_name(kernels::ActivationPrecision precision) {
  return precision == kernels::ActivationPrecision::kBf16 ? "bfloat16" : "float32";
}

}  // namespace cli
