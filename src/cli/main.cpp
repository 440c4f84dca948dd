// chunkpipe: one binary, several roles; dispatches on the first argument.
#include <cstdio>
#include <cstring>

#include "cli/commands.h"

namespace {

void print_usage() {
  std::printf(
      "usage: chunkpipe COMMAND [args]\n\n"
      "commands:\n"
      "  serve MODEL [vLLM serve flags]\n"
      "      OpenAI-compatible server (chat, completions, streaming, metrics)\n"
      "  bench serve|latency|throughput [flags of vllm bench]\n"
      "      load generator with vLLM's figures; in-process latency / throughput\n"
      "  proxy [flags of load_balance_proxy_server_example.py]\n"
      "      PD load-balancing proxy: prefill on one instance, decode on another\n"
      "  launch-dp --dp-size N --dp-address IP [flags of launch_online_dp.py]\n"
      "      start this node's data-parallel ranks through ./run_dp_template.sh\n"
      "  logits MODEL --ids 1,2,3 [--all] [--mtp] [--chunk N] [--out FILE]\n"
      "      print a checkpoint's logits as JSON (parity with shared/reference/dsv3_ref.py)\n"
      "  tokenize DIR [--json-lines] [--bos] [--decode]\n"
      "      token ids of stdin lines with DIR/tokenizer.json (or text of id arrays)\n"
      "  make-model DIR [--hidden N --layers N --vocab N ... --dtype bf16|f32 --fp8]\n"
      "      write a random-weight DeepSeek-V3 checkpoint in Hugging Face layout\n"
      "  quantize SRC DST --w8a8 [--static-attention]\n"
      "      write a W8A8 checkpoint in msmodelslim's layout (serve --quantization ascend)\n"
      "  cpp-sim [--prompt N --chunk B --stages S --tp T --linear-tflops R | --fit-log LOG]\n"
      "      predict fixed / upstream / planned CPP TTFT and print the chunk plans\n\n"
      "Run 'chunkpipe COMMAND --help' for a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "logits") == 0) return cli::run_logits_command(argc, argv);
  if (std::strcmp(argv[1], "tokenize") == 0) return cli::run_tokenize_command(argc, argv);
  if (std::strcmp(argv[1], "make-model") == 0) return cli::run_make_model_command(argc, argv);
  if (std::strcmp(argv[1], "serve") == 0) return cli::run_serve_command(argc, argv);
  if (std::strcmp(argv[1], "bench") == 0) return cli::run_bench_command(argc, argv);
  if (std::strcmp(argv[1], "proxy") == 0) return cli::run_proxy_command(argc, argv);
  if (std::strcmp(argv[1], "launch-dp") == 0) return cli::run_launch_dp_command(argc, argv);
  if (std::strcmp(argv[1], "cpp-sim") == 0) return cli::run_cpp_sim_command(argc, argv);
  if (std::strcmp(argv[1], "quantize") == 0) return cli::run_quantize_command(argc, argv);
  // Internal: a pipeline-stage process started by `serve`.
  if (std::strcmp(argv[1], "pp-stage") == 0) return cli::run_pp_stage_command(argc, argv);
  std::fprintf(stderr, "chunkpipe: error: unknown command '%s'\n", argv[1]);
  print_usage();
  return 2;
}
