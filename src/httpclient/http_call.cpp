// libcurl easy transfer with a streaming write callback and a cancellation poll.
#include "httpclient/http_call.h"

#include <curl/curl.h>

namespace httpclient {
namespace {

struct Callbacks {
  const std::function<bool(std::string_view)>* on_body;
  const std::function<bool()>* cancelled;
  bool stopped = false;  // by on_body or cancelled
  bool was_cancelled = false;
};

size_t write_piece(char* ptr, size_t size, size_t nmemb, void* userdata) {
  auto* c = static_cast<Callbacks*>(userdata);
  if (!(*c->on_body)(std::string_view(ptr, size * nmemb))) {
    c->stopped = true;
    return 0;  // libcurl aborts the transfer
  }
  return size * nmemb;
}

int progress(void* userdata, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* c = static_cast<Callbacks*>(userdata);
  if (*c->cancelled && (*c->cancelled)()) {
    c->stopped = c->was_cancelled = true;
    return 1;
  }
  return 0;
}

}  // namespace

HttpCallResult http_call(const HttpCall& call, const std::function<bool(std::string_view)>& on_body,
                         const std::function<bool()>& cancelled) {
  HttpCallResult result;
  CURL* easy = curl_easy_init();
  if (easy == nullptr) {
    result.error = "curl_easy_init failed";
    return result;
  }
  curl_slist* list = curl_slist_append(nullptr, "Content-Type: application/json");
  for (const std::string& h : call.headers) list = curl_slist_append(list, h.c_str());
  Callbacks cb{&on_body, &cancelled};
  curl_easy_setopt(easy, CURLOPT_URL, call.url.c_str());
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, write_piece);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &cb);
  curl_easy_setopt(easy, CURLOPT_XFERINFOFUNCTION, progress);
  curl_easy_setopt(easy, CURLOPT_XFERINFODATA, &cb);
  curl_easy_setopt(easy, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(call.connect_timeout_s * 1000));
  if (call.timeout_s > 0)
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(call.timeout_s * 1000));
  if (call.method == "POST") {
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, call.body.c_str());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(call.body.size()));
  }
  const CURLcode rc = curl_easy_perform(easy);
  long status = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(list);
  curl_easy_cleanup(easy);
  result.status = static_cast<int>(status);
  result.cancelled = cb.was_cancelled;
  if (rc != CURLE_OK && !cb.stopped) result.error = curl_easy_strerror(rc);
  return result;
}

HttpCallResult http_call(const HttpCall& call, std::string* body,
                         const std::function<bool()>& cancelled) {
  body->clear();
  return http_call(
      call,
      [body](std::string_view piece) {
        body->append(piece);
        return true;
      },
      cancelled);
}

}  // namespace httpclient
