// --dtype parsing shared by the commands that build an engine.
#include "cli/activation_dtype.h"

#include <string>

namespace cli {

void add_dtype_option(ArgParser& p) {
  p.add_option("dtype",
               "activation dtype: auto and float32 keep f32 activations (exact to the reference); "
               "bfloat16 rounds the activations entering BF16-weight linears to bf16",
               "auto");
}

common::Result<kernels::ActivationPrecision> parse_dtype_option(const ArgParser& p) {
  const std::string dtype = p.option("dtype").value_or("auto");
  if (dtype == "bfloat16") return kernels::ActivationPrecision::kBf16;
  if (dtype == "auto" || dtype == "float" || dtype == "float32")
    return kernels::ActivationPrecision::kF32;
  if (dtype == "half" || dtype == "float16") {
    return common::invalid_argument("--dtype " + dtype +
                                    " is not supported on CPU; use bfloat16 or float32");
  }
  return common::invalid_argument(
      "argument --dtype: invalid choice: '" + dtype +
      "' (choose from 'auto', 'half', 'float16', 'bfloat16', 'float', 'float32')");
}

const char* dtype_name(kernels::ActivationPrecision precision) {
  return precision == kernels::ActivationPrecision::kBf16 ? "bfloat16" : "float32";
}

}  // namespace cli
