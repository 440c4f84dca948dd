// libcurl multi event loop. libcurl rather than a hand-written HTTP client: it is the Debian
// library built for exactly this (thousands of transfers per thread, chunked decoding, keep-alive).
#include "httpclient/sse_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>

#include <nlohmann/json.hpp>

namespace httpclient {
namespace {

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

struct Transfer {
  size_t index = 0;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  std::string buffer;  // unparsed bytes
  std::string raw_error_body;
  double started = 0;
  bool saw_done = false;
  StreamResult* result = nullptr;
};

size_t on_data(char* ptr, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t n = size * nmemb;
  t->buffer.append(ptr, n);
  const double now = now_s() - t->started;
  size_t pos;
  while ((pos = t->buffer.find("\n\n")) != std::string::npos) {
    std::string event = t->buffer.substr(0, pos);
    t->buffer.erase(0, pos + 2);
    // An event may hold several lines; only `data:` lines matter (comments start with ':').
    size_t line_start = 0;
    while (line_start <= event.size()) {
      size_t line_end = event.find('\n', line_start);
      if (line_end == std::string::npos) line_end = event.size();
      const std::string line = event.substr(line_start, line_end - line_start);
      if (line.rfind("data:", 0) == 0) {
        std::string payload = line.substr(5);
        if (!payload.empty() && payload[0] == ' ') payload.erase(0, 1);
        apply_sse_event(payload, now, t->result, &t->saw_done);
      } else if (!line.empty() && line[0] != ':') {
        t->raw_error_body += line;
      }
      line_start = line_end + 1;
    }
  }
  if (t->buffer.size() > (1 << 20)) t->buffer.clear();  // a non-SSE body: keep only its head
  return n;
}

}  // namespace

void apply_sse_event(const std::string& payload, double now, StreamResult* r, bool* saw_done) {
  if (payload == "[DONE]") {
    *saw_done = true;
    return;
  }
  nlohmann::json j = nlohmann::json::parse(payload, nullptr, false);
  if (j.is_discarded()) return;
  if (j.contains("error")) {
    const nlohmann::json& e = j["error"];
    const bool has_message = e.is_object() && e.contains("message") && e["message"].is_string();
    r->error = has_message ? e["message"].get<std::string>() : e.dump();
    return;
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    if (r->chunk_times.empty()) {
      r->ttft = now;
    } else {
      r->itl.push_back(now - r->chunk_times.back());
    }
    r->chunk_times.push_back(now);
    r->latency = now;
    const nlohmann::json& c = j["choices"][0];
    if (c.contains("text") && c["text"].is_string())
      r->generated_text += c["text"].get<std::string>();
    if (c.contains("delta") && c["delta"].is_object()) {
      const auto& d = c["delta"];
      for (const char* k : {"content", "reasoning_content", "reasoning"}) {
        if (d.contains(k) && d[k].is_string()) r->generated_text += d[k].get<std::string>();
      }
    }
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const auto& u = j["usage"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer()) {
      r->output_tokens = u["completion_tokens"].get<int64_t>();
    }
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer()) {
      r->prompt_len = u["prompt_tokens"].get<int64_t>();
    }
  }
}

SseClient::SseClient() {
  static const bool initialized = [] {
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  }();
  (void)initialized;
  multi_ = curl_multi_init();
  curl_multi_setopt(multi_, CURLMOPT_MAX_TOTAL_CONNECTIONS, 0L);
  curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, 4096L);
}

SseClient::~SseClient() {
  curl_multi_cleanup(multi_);
}

std::vector<StreamResult> SseClient::run(const std::vector<HttpRequestSpec>& requests,
                                         int max_concurrency,
                                         const std::function<void(size_t)>& on_done) {
  std::vector<StreamResult> results(requests.size());
  std::vector<std::unique_ptr<Transfer>> transfers(requests.size());
  const double t0 = now_s();
  size_t next = 0, done = 0;
  int in_flight = 0;
  const int limit = max_concurrency > 0 ? max_concurrency : INT32_MAX;
  while (done < requests.size()) {
    // Start every request whose time has come, within the concurrency limit.
    const double elapsed = now_s() - t0;
    while (next < requests.size() && in_flight < limit && requests[next].send_at <= elapsed) {
      auto t = std::make_unique<Transfer>();
      t->index = next;
      t->result = &results[next];
      t->easy = curl_easy_init();
      const HttpRequestSpec& spec = requests[next];
      for (const std::string& h : spec.headers)
        t->headers = curl_slist_append(t->headers, h.c_str());
      t->headers = curl_slist_append(t->headers, "Content-Type: application/json");
      curl_easy_setopt(t->easy, CURLOPT_URL, spec.url.c_str());
      curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, spec.body.c_str());
      curl_easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE_LARGE,
                       static_cast<curl_off_t>(spec.body.size()));
      curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, t->headers);
      curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, on_data);
      curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t.get());
      curl_easy_setopt(t->easy, CURLOPT_PRIVATE, t.get());
      curl_easy_setopt(t->easy, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(t->easy, CURLOPT_TCP_NODELAY, 1L);
      curl_easy_setopt(t->easy, CURLOPT_CONNECTTIMEOUT, 30L);
      t->started = now_s();
      results[next].start_time = t->started - t0;
      curl_multi_add_handle(multi_, t->easy);
      transfers[next] = std::move(t);
      ++next;
      ++in_flight;
    }
    int running = 0;
    curl_multi_perform(multi_, &running);
    int queued = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_, &queued)) {
      if (msg->msg != CURLMSG_DONE) continue;
      Transfer* t = nullptr;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
      long status = 0;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
      StreamResult& r = *t->result;
      if (msg->data.result != CURLE_OK) {
        r.error = std::string("transport error: ") + curl_easy_strerror(msg->data.result);
      } else if (status != 200) {
        r.error = "HTTP " + std::to_string(status) + ": " +
                  (t->raw_error_body.empty() ? t->buffer : t->raw_error_body);
      } else if (r.chunk_times.empty() && r.error.empty()) {
        r.error = "Never received a valid chunk to calculate TTFT.";
      }
      r.success = r.error.empty();
      curl_multi_remove_handle(multi_, t->easy);
      curl_easy_cleanup(t->easy);
      curl_slist_free_all(t->headers);
      transfers[t->index].reset();
      --in_flight;
      ++done;
      if (on_done) on_done(done);
    }
    // Sleep until data arrives or the next request is due.
    int timeout_ms = 100;
    if (next < requests.size() && in_flight < limit) {
      timeout_ms =
          std::clamp(static_cast<int>((requests[next].send_at - (now_s() - t0)) * 1000), 0, 100);
    }
    if (done < requests.size()) curl_multi_poll(multi_, nullptr, 0, timeout_ms, nullptr);
  }
  return results;
}

}  // namespace httpclient
