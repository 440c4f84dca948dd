// CORS headers and preflight answers, with Starlette's rules (the middleware vLLM installs).
#include "server/cors.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

namespace server {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

bool all_origins(const CorsPolicy& p) {
  return contains(p.allowed_origins, "*");
}

std::vector<std::string> methods(const CorsPolicy& p) {
  if (contains(p.allowed_methods, "*"))
    return {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"};
  return p.allowed_methods;
}

// The CORS-safelisted request headers, always allowed (lower case).
const std::vector<std::string>& safelisted() {
  static const std::vector<std::string> kHeaders = {"accept", "accept-language", "content-language",
                                                    "content-type"};
  return kHeaders;
}

}  // namespace

common::Result<std::vector<std::string>> parse_cors_list(const std::string& flag,
                                                         const std::string& value) {
  const nlohmann::json j = nlohmann::json::parse(value, nullptr, false);
  if (!j.is_array() ||
      !std::all_of(j.begin(), j.end(), [](const nlohmann::json& x) { return x.is_string(); })) {
    return common::invalid_argument("argument --" + flag + ": invalid loads value: '" + value +
                                    "' (a JSON list of strings, e.g. '[\"*\"]')");
  }
  return j.get<std::vector<std::string>>();
}

bool is_cors_preflight(const HttpRequest& request) {
  return request.method == "OPTIONS" && !request.header("Origin").empty() &&
         !request.header("Access-Control-Request-Method").empty();
}

HttpResponse cors_preflight_response(const CorsPolicy& policy, const HttpRequest& request) {
  const std::string origin = request.header("Origin");
  const std::string method = request.header("Access-Control-Request-Method");
  const std::string requested_headers = request.header("Access-Control-Request-Headers");
  const bool all_headers = contains(policy.allowed_headers, "*");
  const bool explicit_origin = !all_origins(policy) || policy.allow_credentials;
  HttpResponse r;
  r.content_type = "text/plain; charset=utf-8";
  if (explicit_origin) {
    r.headers.emplace_back("Vary", "Origin");
  } else {
    r.headers.emplace_back("Access-Control-Allow-Origin", "*");
  }
  const std::vector<std::string> allowed_methods = methods(policy);
  r.headers.emplace_back("Access-Control-Allow-Methods", join(allowed_methods));
  r.headers.emplace_back("Access-Control-Max-Age", "600");
  std::vector<std::string> allowed_headers = safelisted();
  for (const std::string& h : policy.allowed_headers) {
    if (!contains(allowed_headers, lower(h))) allowed_headers.push_back(lower(h));
  }
  std::sort(allowed_headers.begin(), allowed_headers.end());
  if (!all_headers) r.headers.emplace_back("Access-Control-Allow-Headers", join(allowed_headers));
  if (policy.allow_credentials) r.headers.emplace_back("Access-Control-Allow-Credentials", "true");

  std::vector<std::string> failures;
  if (all_origins(policy) || contains(policy.allowed_origins, origin)) {
    if (explicit_origin) r.headers.emplace_back("Access-Control-Allow-Origin", origin);
  } else {
    failures.push_back("origin");
  }
  if (!contains(allowed_methods, method)) failures.push_back("method");
  if (all_headers && !requested_headers.empty()) {
    r.headers.emplace_back("Access-Control-Allow-Headers", requested_headers);
  } else if (!requested_headers.empty()) {
    size_t start = 0;
    while (start <= requested_headers.size()) {
      const size_t comma = std::min(requested_headers.find(',', start), requested_headers.size());
      const std::string h = trim(lower(requested_headers.substr(start, comma - start)));
      if (!contains(allowed_headers, h)) {
        failures.push_back("headers");
        break;
      }
      start = comma + 1;
    }
  }
  if (!failures.empty()) {
    r.status = 400;
    r.body = "Disallowed CORS " + join(failures);
  } else {
    r.body = "OK";
  }
  return r;
}

HttpHeaders cors_response_headers(const CorsPolicy& policy, const HttpRequest& request) {
  HttpHeaders h;
  const std::string origin = request.header("Origin");
  if (origin.empty() || is_cors_preflight(request)) return h;  // a preflight's answer has its own
  const bool with_cookie = !request.header("Cookie").empty();
  if (all_origins(policy) && !with_cookie) {
    h.emplace_back("Access-Control-Allow-Origin", "*");
  } else if (all_origins(policy) || contains(policy.allowed_origins, origin)) {
    // A credentialed request (cookies) or a listed origin: the origin itself, never "*".
    h.emplace_back("Access-Control-Allow-Origin", origin);
    h.emplace_back("Vary", "Origin");
  }
  if (policy.allow_credentials) h.emplace_back("Access-Control-Allow-Credentials", "true");
  return h;
}

}  // namespace server
