// http_call: one blocking HTTP request (libcurl easy) whose response body is handed to the
// caller piece by piece as it arrives, for relaying a stream; the caller can stop it at any
// moment (its client left). Thread-compatible: one call per thread at a time.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace httpclient {

struct HttpCall {
  std::string method = "POST";  // or "GET"
  std::string url;
  std::string body;
  std::vector<std::string> headers;  // "Name: value"
  double timeout_s = 0;              // whole request; 0: none (a long generation)
  double connect_timeout_s = 10;
};

struct HttpCallResult {
  int status = 0;          // 0 when no response arrived
  bool cancelled = false;  // `cancelled` said stop
  std::string error;       // transport failure (refused, reset, timed out), else empty
};

// on_body returns false to stop reading; cancelled() is polled while waiting.
HttpCallResult http_call(const HttpCall& call, const std::function<bool(std::string_view)>& on_body,
                         const std::function<bool()>& cancelled);

// The whole body in memory.
HttpCallResult http_call(const HttpCall& call, std::string* body,
                         const std::function<bool()>& cancelled);

}  // namespace httpclient
