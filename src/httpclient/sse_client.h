// SseClient: drives many concurrent streaming HTTP POSTs on one thread with libcurl's multi
// interface (no thread per stream), parsing `data:` events as they arrive. Requests start when
// the caller's schedule says so and at most max_concurrency are in flight. Not thread-safe.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "httpclient/stream_result.h"

namespace httpclient {

struct HttpRequestSpec {
  std::string url;
  std::string body;
  std::vector<std::string> headers;  // "Name: value"
  double send_at = 0;                // seconds since run() started
};

class SseClient {
 public:
  SseClient();
  ~SseClient();
  SseClient(const SseClient&) = delete;
  SseClient& operator=(const SseClient&) = delete;

  // Runs all requests; results[i] belongs to requests[i]. `on_done` (may be empty) is called
  // after each request finishes, for progress display.
  std::vector<StreamResult> run(const std::vector<HttpRequestSpec>& requests, int max_concurrency,
                                const std::function<void(size_t done)>& on_done);

 private:
  void* multi_;
};

// Applies one SSE `data:` payload (a JSON chunk of a completions or chat stream) to `r`.
// `now` is seconds since the request started.
void apply_sse_event(const std::string& payload, double now, StreamResult* r, bool* saw_done);

}  // namespace httpclient
