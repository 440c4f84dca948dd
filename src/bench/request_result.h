// What the benchmark records for one request: timings as the client sees them (vLLM's
// definitions) and token counts from the server's usage chunk. Plain data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bench {

struct SampleRequest {
  std::string prompt;      // text sent (completions `prompt`, or the chat user message)
  int64_t prompt_len = 0;  // tokens, as the dataset built it
  int64_t expected_output_len = 0;
};

struct RequestResult {
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

}  // namespace bench
