// vLLM `serve` flags that mean nothing to chunkpipe's CPU engine, or only at some of their
// values. A pasted vLLM command line is accepted: each such flag given gets one log line saying
// why it changes nothing here, and a value whose feature is not built is refused with an error
// that names the flag and the feature. One table (vllm_compat_flags.cpp); no state.
#pragma once

#include "cli/arg_parser.h"
#include "common/status.h"

namespace cli {

// Declares the table's flags on `p`.
void add_vllm_compat_flags(ArgParser& p);

// Logs what each given flag of the table maps to; kUnimplemented for a value (or a flag) whose
// feature chunkpipe does not build.
common::Status check_vllm_compat_flags(const ArgParser& p);

}  // namespace cli
