// CORS as vLLM's server does it (Starlette's CORSMiddleware with --allowed-origins,
// --allow-credentials, --allowed-methods, --allowed-headers; all origins, methods and headers by
// default): preflight answers, and the headers added to responses to cross-origin requests.
// Pure functions of the policy and the request; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "server/http_server.h"

namespace server {

struct CorsPolicy {
  std::vector<std::string> allowed_origins = {"*"};
  bool allow_credentials = false;
  std::vector<std::string> allowed_methods = {"*"};
  std::vector<std::string> allowed_headers = {"*"};
};

// A flag's value as vLLM reads it (json.loads): a JSON list of strings, e.g. '["*"]'.
common::Result<std::vector<std::string>> parse_cors_list(const std::string& flag,
                                                         const std::string& value);

// OPTIONS with Origin and Access-Control-Request-Method.
bool is_cors_preflight(const HttpRequest& request);

// 200 "OK" with the allow headers, or 400 "Disallowed CORS origin, method, headers" naming
// what the policy refuses.
HttpResponse cors_preflight_response(const CorsPolicy& policy, const HttpRequest& request);

// What a response to `request` carries: nothing without an Origin header, nor for a preflight.
HttpHeaders cors_response_headers(const CorsPolicy& policy, const HttpRequest& request);

}  // namespace server
