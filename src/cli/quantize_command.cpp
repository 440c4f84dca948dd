// `chunkpipe quantize SRC DST --w8a8 [--static-attention]`: writes msmodelslim's W8A8 layout
// (quant_model_description.json + quant_model_weights*.safetensors) from a BF16, F32 or FP8
// checkpoint, for `serve --quantization ascend` and the W8A8 tests.
#include <cstdio>
#include <thread>

#include "cli/arg_parser.h"
#include "cli/commands.h"
#include "cli/flag_limits.h"
#include "common/timer.h"
#include "model/w8a8_quantizer.h"

namespace cli {

int run_quantize_command(int argc, char** argv) {
  ArgParser p("chunkpipe quantize",
              "Writes a W8A8 checkpoint in msmodelslim's layout (--quantization ascend).");
  p.add_positional("SRC", "BF16, F32 or FP8 model directory");
  p.add_positional("DST", "output directory");
  p.add_flag("w8a8", "int8 weights and activations (the only scheme written)");
  p.add_flag("static-attention",
             "attention projections as static W8A8, calibrated on a forward pass (default: "
             "W8A8_DYNAMIC everywhere)");
  p.add_option("calibration-tokens", "tokens of the calibration forward", "256");
  p.add_option("shards", "safetensors files to write", "1");
  p.add_option("threads", "worker threads",
               std::to_string(std::max(1u, std::thread::hardware_concurrency())));
  if (auto code = p.parse_or_exit(argc, argv, 2)) return *code;
  if (!p.flag("w8a8"))
    return p.fail(common::invalid_argument("argument --w8a8 is required (the scheme to write)"), 2);
  auto tokens = p.int_option("calibration-tokens", 2, kMaxIntFlag);
  auto shards = p.int_option("shards", 1, 9999);
  auto threads = p.int_option("threads", 1, kMaxThreads);
  for (auto* r : {&tokens, &shards, &threads})
    if (!r->ok()) return p.fail(r->status(), 2);
  model::W8A8QuantizeOptions options;
  options.static_attention = p.flag("static-attention");
  options.calibration_tokens = *tokens;
  options.num_shards = static_cast<int>(*shards);
  common::ThreadPool pool(static_cast<int>(*threads));
  const double t0 = common::now_seconds();
  const common::Status st =
      model::write_w8a8_checkpoint(p.positional("SRC"), p.positional("DST"), options, pool);
  if (!st.ok()) return p.fail(st, 1);
  std::printf("wrote %s (W8A8, attention %s) in %.1f s\n", p.positional("DST").c_str(),
              options.static_attention ? "static" : "dynamic", common::now_seconds() - t0);
  return 0;
}

}  // namespace cli
