// A benchmark request as a dataset makes it, and what the benchmark records of it
// (httpclient/stream_result.h). Plain data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "httpclient/stream_result.h"

namespace bench {

struct SampleRequest {
  std::string prompt;      // text sent (completions `prompt`, or the chat user message)
  int64_t prompt_len = 0;  // tokens, as the dataset built it
  int64_t expected_output_len = 0;
};

using RequestResult = httpclient::StreamResult;

}  // namespace bench
