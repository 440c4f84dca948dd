// CORS: preflight answers and response headers under the default policy (every origin, method
// and header, as vLLM's defaults) and under a restricted one, with Starlette's rules.
#include "server/cors.h"

#include <gtest/gtest.h>

#include <string>

namespace {

std::string header(const server::HttpHeaders& h, const std::string& name) {
  std::string out;
  int count = 0;
  for (const auto& [k, v] : h) {
    if (k == name) out = v, ++count;
  }
  EXPECT_LE(count, 1) << name << " appears " << count << " times";
  return out;
}

server::HttpRequest preflight(const std::string& origin, const std::string& method,
                              const std::string& headers = "") {
  server::HttpRequest r;
  r.method = "OPTIONS";
  r.path = "/v1/chat/completions";
  r.headers = {{"Origin", origin}, {"Access-Control-Request-Method", method}};
  if (!headers.empty()) r.headers.emplace_back("Access-Control-Request-Headers", headers);
  return r;
}

TEST(CorsTest, DefaultPolicyAllowsEveryOrigin) {
  const server::CorsPolicy open;
  const server::HttpRequest p = preflight("http://ui.example", "POST", "Authorization, X-Custom");
  ASSERT_TRUE(server::is_cors_preflight(p));
  const server::HttpResponse r = server::cors_preflight_response(open, p);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "OK");
  EXPECT_EQ(header(r.headers, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(header(r.headers, "Access-Control-Allow-Methods"),
            "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
  EXPECT_EQ(header(r.headers, "Access-Control-Allow-Headers"), "Authorization, X-Custom");
  EXPECT_EQ(header(r.headers, "Access-Control-Max-Age"), "600");
  EXPECT_TRUE(server::cors_response_headers(open, p).empty()) << "the preflight has its own";

  server::HttpRequest simple;
  simple.method = "POST";
  simple.headers = {{"Origin", "http://ui.example"}};
  EXPECT_EQ(header(server::cors_response_headers(open, simple), "Access-Control-Allow-Origin"),
            "*");
  simple.headers.emplace_back("Cookie", "a=b");
  const auto with_cookie = server::cors_response_headers(open, simple);
  EXPECT_EQ(header(with_cookie, "Access-Control-Allow-Origin"), "http://ui.example");
  EXPECT_EQ(header(with_cookie, "Vary"), "Origin");
  server::HttpRequest same_origin;
  same_origin.method = "GET";
  EXPECT_TRUE(server::cors_response_headers(open, same_origin).empty());
  server::HttpRequest plain_options;
  plain_options.method = "OPTIONS";
  plain_options.headers = {{"Origin", "http://ui.example"}};
  EXPECT_FALSE(server::is_cors_preflight(plain_options));
}

TEST(CorsTest, RestrictedPolicyNamesWhatItRefuses) {
  server::CorsPolicy p;
  p.allowed_origins = {"http://ui.example"};
  p.allowed_methods = {"GET", "POST"};
  p.allowed_headers = {"Authorization"};
  p.allow_credentials = true;
  server::HttpResponse ok = server::cors_preflight_response(
      p, preflight("http://ui.example", "POST", "authorization, content-type"));
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(header(ok.headers, "Access-Control-Allow-Origin"), "http://ui.example");
  EXPECT_EQ(header(ok.headers, "Access-Control-Allow-Credentials"), "true");
  EXPECT_EQ(header(ok.headers, "Access-Control-Allow-Methods"), "GET, POST");
  EXPECT_EQ(header(ok.headers, "Access-Control-Allow-Headers"),
            "accept, accept-language, authorization, content-language, content-type");
  EXPECT_EQ(header(ok.headers, "Vary"), "Origin");
  server::HttpResponse bad =
      server::cors_preflight_response(p, preflight("http://evil.example", "DELETE", "x-other"));
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body, "Disallowed CORS origin, method, headers");
  EXPECT_EQ(header(bad.headers, "Access-Control-Allow-Origin"), "");

  server::HttpRequest listed;
  listed.method = "POST";
  listed.headers = {{"Origin", "http://ui.example"}};
  EXPECT_EQ(header(server::cors_response_headers(p, listed), "Access-Control-Allow-Origin"),
            "http://ui.example");
  server::HttpRequest other = listed;
  other.headers = {{"Origin", "http://evil.example"}};
  EXPECT_EQ(header(server::cors_response_headers(p, other), "Access-Control-Allow-Origin"), "");
}

TEST(CorsTest, FlagValuesAreJsonLists) {
  auto ok = server::parse_cors_list("allowed-origins", R"(["http://a", "http://b"])");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->size(), 2u);
  for (const char* bad : {"*", "[1]", "{\"a\": 1}", ""}) {
    auto r = server::parse_cors_list("allowed-origins", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("argument --allowed-origins"), std::string::npos);
  }
}

}  // namespace
