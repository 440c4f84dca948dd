// Entry points of chunkpipe's subcommands. Each returns the process exit code
// (0 ok, 1 runtime failure, 2 usage error) and prints its own errors.
#pragma once

namespace cli {

int run_logits_command(int argc, char** argv);
int run_tokenize_command(int argc, char** argv);
int run_make_model_command(int argc, char** argv);
int run_serve_command(int argc, char** argv);
int run_bench_command(int argc, char** argv);
int run_pp_stage_command(int argc, char** argv);
int run_proxy_command(int argc, char** argv);
int run_launch_dp_command(int argc, char** argv);
int run_cpp_sim_command(int argc, char** argv);
int run_quantize_command(int argc, char** argv);

}  // namespace cli
