// What a client records of one streamed request: timings as the client sees them (vLLM's
// benchmark definitions) and token counts from the server's usage chunk. Plain data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace httpclient {

struct StreamResult {
  bool success = false;
  std::string error;
  double start_time = 0;            // seconds since the benchmark started
  double ttft = 0;                  // to the first SSE message with non-empty choices
  double latency = 0;               // to the last chunk
  std::vector<double> itl;          // gaps between successive choice messages
  std::vector<double> chunk_times;  // arrival of each choice message (since start_time)
  int64_t prompt_len = 0;           // usage.prompt_tokens (or the dataset's count)
  int64_t output_tokens = 0;        // usage.completion_tokens
  std::string generated_text;
};

}  // namespace httpclient
