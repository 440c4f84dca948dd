// libcurl easy request with the response body collected in memory.
#include "httpclient/http_json.h"

#include <curl/curl.h>

namespace httpclient {
namespace {

size_t collect(char* ptr, size_t size, size_t nmemb, void* userdata) {
  static_cast<std::string*>(userdata)->append(ptr, size * nmemb);
  return size * nmemb;
}

}  // namespace

common::Result<nlohmann::json> http_json(const std::string& url, const std::string& body,
                                         const std::vector<std::string>& headers) {
  CURL* easy = curl_easy_init();
  if (easy == nullptr)
    return common::Status(common::StatusCode::kInternal, "curl_easy_init failed");
  curl_slist* list = curl_slist_append(nullptr, "Content-Type: application/json");
  for (const std::string& h : headers) list = curl_slist_append(list, h.c_str());
  std::string response;
  curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &response);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_TIMEOUT, 120L);
  if (!body.empty()) {
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  const CURLcode rc = curl_easy_perform(easy);
  long status = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(list);
  curl_easy_cleanup(easy);
  if (rc != CURLE_OK) return common::not_found(url + ": " + curl_easy_strerror(rc));
  if (status != 200) {
    return common::invalid_argument(url + ": HTTP " + std::to_string(status) + ": " +
                                    response.substr(0, 300));
  }
  auto j = nlohmann::json::parse(response, nullptr, false);
  if (j.is_discarded()) return common::invalid_argument(url + ": response is not JSON");
  return j;
}

}  // namespace httpclient
