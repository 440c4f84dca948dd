// The proxy's routes and the two-leg PD flow with retries and recompute.
#include "proxy/pd_proxy.h"

#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <system_error>
#include <thread>

#include "api/json_fields.h"
#include "common/logging.h"
#include "httpclient/http_call.h"
#include "proxy/pd_messages.h"
#include "proxy/sse_splitter.h"

namespace proxy {
namespace {

using nlohmann::json;
using server::HttpExchange;
using server::HttpResponse;

std::string uuid4() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          (uint64_t(std::random_device{}()) << 32));
  const uint64_t a = rng(), b = rng();
  char s[37];
  std::snprintf(s, sizeof(s), "%08x-%04x-4%03x-%04x-%012llx", unsigned(a >> 32),
                unsigned((a >> 16) & 0xffff), unsigned(a & 0xfff),
                unsigned(0x8000 | ((b >> 48) & 0x3fff)),
                static_cast<unsigned long long>(b & 0xffffffffffffULL));
  return s;
}

HttpResponse json_reply(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  // Messages may quote what a backend or an exception said: bytes that are not UTF-8 are
  // replaced, where a plain dump() would throw.
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

HttpResponse error_reply(int status, const std::string& message) {
  const char* type = status == 400   ? "BadRequestError"
                     : status == 404 ? "NotFoundError"
                     : status == 500 ? "InternalServerError"
                     : status == 502 ? "BadGatewayError"
                                     : "ServiceUnavailableError";
  return json_reply(
      status,
      {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}}}});
}

// An event of the proxy's own; `chunk` may quote a backend's bytes, which need not be UTF-8.
std::string sse(const json& chunk) {
  return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// A backend attempt worth repeating: no answer, or a server-side error (never a 4xx).
bool retryable(const httpclient::HttpCallResult& r) {
  return !r.cancelled && (!r.error.empty() || r.status == 0 || r.status >= 500);
}

// Upstream's backoff: attempt n waits base * 2^(n-1).
void backoff(double base, int attempt) {
  std::this_thread::sleep_for(
      std::chrono::duration<double>(base * static_cast<double>(1 << (attempt - 1))));
}

// A leg that failed: the backend's own error as it answered it (status and body), or 502 for
// no answer; inside a started stream, an error event and [DONE].
void relay_failure(HttpExchange& ex, bool streaming, const httpclient::HttpCallResult& r,
                   const std::string& body, const std::string& backend) {
  const int status = r.error.empty() ? r.status : 502;
  const std::string why = r.error.empty() ? body : backend + ": " + r.error;
  if (streaming) {
    ex.send(sse({{"error", {{"message", why}, {"code", status}}}}) + "data: [DONE]\n\n");
    return ex.end_stream();
  }
  if (!r.error.empty()) return ex.respond(error_reply(502, why));
  HttpResponse out;
  out.status = status;
  out.body = body;
  ex.respond(std::move(out));
}

constexpr const char* kShuttingDown = "The proxy is shutting down";

// Ends a request with an error, as serve ends its own (the proxy's shutdown: 503): a client still
// waiting for a whole answer gets it as the reply, a started stream as an event before [DONE].
void end_with_error(HttpExchange& ex, int status, const std::string& message) {
  if (ex.closed()) return;
  const HttpResponse reply = error_reply(status, message);
  ex.respond(reply);  // ignored once the client's stream has started
  if (ex.send("data: " + reply.body + "\n\ndata: [DONE]\n\n")) ex.end_stream();
}

}  // namespace

PdProxy::PdProxy(ProxyOptions options) : o_(std::move(options)) {
  for (const InstanceInfo& p : o_.prefillers) registry_.add(Role::kPrefill, p);
  for (const InstanceInfo& d : o_.decoders) registry_.add(Role::kDecode, d);
  server::HttpServerOptions h;
  h.host = o_.host == "localhost" ? "127.0.0.1" : o_.host;
  h.port = o_.port;
  h.error_response = [](int status, const std::string& message) {
    return error_reply(status, message);
  };
  http_ = std::make_unique<server::HttpServer>(
      h, [this](std::shared_ptr<HttpExchange> ex) { handle(ex); });
}

PdProxy::~PdProxy() {
  stop();
}

common::Status PdProxy::bind() {
  return http_->bind();
}

int PdProxy::port() const {
  return o_.port;
}

void PdProxy::run() {
  http_->run();
  bool all_ended = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    all_ended = cv_.wait_for(lock, std::chrono::seconds(30), [&] { return active_ == 0; });
  }
  join_ended_threads();
  if (!all_ended) {  // stuck in a backend call: they cannot be joined, and must not block exit
    std::lock_guard<std::mutex> lock(mu_);
    LOG(WARNING) << "Leaving " << threads_.size() << " request threads behind";
    for (std::thread& t : threads_)  // their list nodes stay: each still names its own
      if (t.joinable()) t.detach();
  }
}

void PdProxy::join_ended_threads() {
  std::vector<std::thread> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it : ended_) {
      ended.push_back(std::move(*it));
      threads_.erase(it);
    }
    ended_.clear();
  }
  for (std::thread& t : ended)   // each is past its last use of this object
    if (t.joinable()) t.join();  // (one left behind by run() was detached)
}

void PdProxy::stop() {
  if (draining_.exchange(true)) return;
  http_->stop_accepting();
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (active_ > 0)
      LOG(INFO) << "Waiting up to " << o_.shutdown_drain_timeout << " s for " << active_
                << " requests to finish";
    cv_.wait_for(lock, std::chrono::duration<double>(o_.shutdown_drain_timeout),
                 [&] { return active_ == 0; });
    if (active_ > 0) LOG(INFO) << "Ending " << active_ << " requests still running";
  }
  stopping_ = true;
  {  // the cancelled requests tell their clients and release P's blocks
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return active_ == 0; });
  }
  // Give their last bytes a moment to reach the clients, then close everything.
  const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (http_->open_exchanges() > 0 && std::chrono::steady_clock::now() < flush_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http_->stop();
}

bool PdProxy::spawn(std::function<void()> fn, std::shared_ptr<HttpExchange> ex) {
  join_ended_threads();
  std::unique_lock<std::mutex> lock(mu_);  // held until threads_ holds the new thread
  const auto slot = threads_.emplace(threads_.end());
  ++active_;
  try {
    *slot = std::thread([this, fn = std::move(fn), ex, slot]() mutable {
      try {
        fn();
      } catch (const std::exception& e) {  // a bug: this request fails, the others go on
        LOG(ERROR) << "proxy request failed: " << e.what();
        if (ex) end_with_error(*ex, 500, std::string("the proxy failed: ") + e.what());
      }
      fn = nullptr;  // what the request holds goes before it is counted out
      ex.reset();
      std::lock_guard<std::mutex> done(mu_);
      --active_;
      ended_.push_back(slot);
      cv_.notify_all();
    });
    return true;
  } catch (const std::system_error& e) {  // out of threads: refuse this one, keep serving
    threads_.erase(slot);
    --active_;
    cv_.notify_all();
    lock.unlock();
    LOG(WARNING) << "cannot start a thread for a request: " << e.what();
    if (ex) end_with_error(*ex, 503, std::string("the proxy is overloaded: ") + e.what());
    return false;
  }
}

std::vector<std::string> PdProxy::backend_headers(const std::string& request_id) const {
  return {"Authorization: Bearer " + (o_.api_key.empty() ? std::string("None") : o_.api_key),
          "X-Request-Id: " + request_id};
}

void PdProxy::handle(const std::shared_ptr<HttpExchange>& ex) {
  const server::HttpRequest& req = ex->request();
  const std::string& path = req.path;
  if (req.method == "POST" && (path == "/v1/completions" || path == "/v1/chat/completions")) {
    if (draining_) return ex->respond(error_reply(503, kShuttingDown));
    const bool chat = path == "/v1/chat/completions";
    spawn([this, ex, chat] { generate(ex, chat); }, ex);
  } else if (req.method == "GET" && path == "/v1/models") {
    spawn([this, ex] { models(ex); }, ex);
  } else if (req.method == "POST" && path == "/reset_prefix_cache") {
    spawn([this, ex] { reset_prefix_cache(ex); }, ex);
  } else if (req.method == "GET" && path == "/healthcheck") {
    ex->respond(json_reply(200, {{"status", "ok"},
                                 {"prefill_instances", registry_.num_ready(Role::kPrefill)},
                                 {"decode_instances", registry_.num_ready(Role::kDecode)},
                                 {"request_num", registry_.requests_in_flight()},
                                 {"instances", registry_.snapshot()}}));
  } else if (req.method == "POST" && (path == "/instances/add" || path == "/instances/remove")) {
    instances(ex, path == "/instances/add");
  } else {
    ex->respond(error_reply(404, "Not Found: " + req.method + " " + path));
  }
}

void PdProxy::generate(const std::shared_ptr<HttpExchange>& ex, bool chat) {
  const std::string api = chat ? "/v1/chat/completions" : "/v1/completions";
  json original;
  if (auto e = api::parse_json_body(ex->request().body, &original))
    return ex->respond(error_reply(400, e->message));
  if (!original.is_object())
    return ex->respond(error_reply(400, "the request body is not a JSON object"));
  const bool stream = flag(original, "stream");
  const bool wants_ids = flag(original, "return_token_ids");
  int64_t max_tokens = -1;
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    if (const auto n = integer(original, key)) max_tokens = *n;
  }
  auto gone = [&] { return ex->closed() || stopping_; };

  json request = original;
  request["return_token_ids"] = true;  // exact token ids for a recompute retry
  EarlierRounds earlier;               // what rounds before a decoder handed the request back made
  std::vector<int32_t> prompt_ids;
  bool streaming = false;  // the client's stream has started
  for (int round = 0;; ++round) {
    const std::string request_id = uuid4();
    const std::vector<std::string> headers = backend_headers(request_id);
    // Leg 1: prefill.
    const std::string p_body = prefill_body(request).dump();
    Lease p = registry_.acquire(Role::kPrefill, p_body.size());
    if (!p) return end_with_error(*ex, 503, "no prefill instance is available");
    std::string answer;
    httpclient::HttpCallResult pr;
    for (int attempt = 1; attempt <= std::max(1, o_.max_retries); ++attempt) {
      // Not cancelled when the client leaves: P may finish (and hold the blocks for a decoder)
      // at any moment, so the answer is awaited and the blocks released below.
      pr = httpclient::http_call({"POST", p.instance().url() + api, p_body, headers, 0, 10},
                                 &answer, [&] { return stopping_.load(); });
      if (!retryable(pr)) break;
      LOG(WARNING) << "Prefill " << p.instance().key() << " attempt " << attempt << " failed: "
                   << (pr.error.empty() ? "HTTP " + std::to_string(pr.status) : pr.error);
      if (attempt < o_.max_retries) backoff(o_.retry_delay, attempt);
    }
    if (pr.cancelled) return end_with_error(*ex, 503, kShuttingDown);
    if (!pr.error.empty() || pr.status != 200)
      return relay_failure(*ex, streaming, pr, answer, "prefill instance " + p.instance().key());
    json p_json = parse_bounded(answer);
    json kv_params = nullptr;
    if (p_json.is_object() && p_json.contains("kv_transfer_params") &&
        p_json["kv_transfer_params"].is_object() && !p_json["kv_transfer_params"].empty())
      kv_params = p_json["kv_transfer_params"];
    if (earlier.prompt_tokens < 0 && p_json.is_object() && p_json.contains("usage"))
      earlier.prompt_tokens = integer(p_json["usage"], "prompt_tokens", /*lax=*/false).value_or(-1);

    // Leg 2: decode.
    json d_request = request;
    if (!kv_params.is_null()) d_request["kv_transfer_params"] = kv_params;
    const std::string d_body = d_request.dump();
    Lease d = registry_.acquire(Role::kDecode, d_body.size());
    auto release_prefill = [&](const InstanceInfo& via) {
      // P keeps the blocks until a decoder says DONE: ask one to say it for a request that
      // will never reach it.
      if (kv_params.is_null()) return;
      std::string ignored;
      httpclient::http_call({"POST", via.url() + "/v1/kv_transfer/release",
                             json{{"kv_transfer_params", kv_params}}.dump(), headers, 5, 5},
                            &ignored, nullptr);
    };
    if (!d) {
      const auto any = registry_.instances(Role::kDecode);
      if (!any.empty()) release_prefill(any.front());
      return end_with_error(*ex, 503, "no decode instance is available");
    }
    if (gone()) {
      release_prefill(d.instance());
      return end_with_error(*ex, 503, kShuttingDown);
    }
    bool recomputed = false;
    ChoiceDelta leg;  // this round's text and ids
    std::string d_answer;
    httpclient::HttpCallResult dr;
    for (int attempt = 1; attempt <= std::max(1, o_.max_retries); ++attempt) {
      bool forwarded = false;
      d_answer.clear();
      if (!stream) {
        dr = httpclient::http_call({"POST", d.instance().url() + api, d_body, headers, 0, 10},
                                   &d_answer, gone);
      } else {
        SseSplitter splitter;
        dr = httpclient::http_call(
            {"POST", d.instance().url() + api, d_body, headers, 0, 10},
            [&](std::string_view piece) {
              for (std::string& event : splitter.push(piece)) {
                RelayedEvent e = relay_stream_event(event, chat, wants_ids, earlier);
                if (e.kind == RelayedEvent::Kind::kDone) continue;  // sent after the last round
                if (e.kind != RelayedEvent::Kind::kAsIs) {
                  if (!e.choice.prompt_token_ids.empty() && prompt_ids.empty())
                    prompt_ids = e.choice.prompt_token_ids;
                  leg.text += e.choice.text;
                  leg.token_ids.insert(leg.token_ids.end(), e.choice.token_ids.begin(),
                                       e.choice.token_ids.end());
                  if (e.kind == RelayedEvent::Kind::kRecomputed) {
                    recomputed = true;
                    continue;  // hidden: the request goes on elsewhere
                  }
                  if (p) p.release();  // D has pulled the KV (upstream's rule)
                  if (e.kind == RelayedEvent::Kind::kEmpty) continue;
                }
                forwarded = true;
                if (!streaming) ex->start_stream(200, "text/event-stream", {});
                streaming = true;
                if (!ex->send(e.kind == RelayedEvent::Kind::kAsIs ? event : e.data)) return false;
              }
              return true;
            },
            gone);
        if (dr.status != 200 && dr.status != 0 && !forwarded) d_answer = splitter.rest();
      }
      if (forwarded || !retryable(dr)) break;  // only before the first byte
      LOG(WARNING) << "Decoder " << d.instance().key() << " attempt " << attempt << " failed: "
                   << (dr.error.empty() ? "HTTP " + std::to_string(dr.status) : dr.error);
      if (attempt < o_.max_retries) backoff(o_.retry_delay, attempt);
    }
    if (dr.cancelled) {
      // The client left, or the proxy's shutdown cancelled the request. If the decoder has the
      // request, closing the stream aborts it and it says DONE itself (it ignores this release);
      // if it never got it, nobody would: release P now.
      release_prefill(d.instance());
      return end_with_error(*ex, 503, kShuttingDown);
    }
    if (!dr.error.empty() || dr.status != 200) {
      if (dr.status == 0) release_prefill(d.instance());  // it never saw the request
      return relay_failure(*ex, streaming, dr, d_answer, "decode instance " + d.instance().key());
    }
    if (!stream) {
      json d_json = parse_bounded(d_answer);
      if (!d_json.is_object())
        return ex->respond(error_reply(502, "the decoder's answer is not JSON"));
      ChoiceDelta cd = read_choice(d_json, chat, false);
      if (!cd.prompt_token_ids.empty() && prompt_ids.empty()) prompt_ids = cd.prompt_token_ids;
      leg = cd;
      recomputed = cd.recomputed;
      if (!recomputed) {
        finish_whole_answer(&d_json, chat, wants_ids, earlier);
        HttpResponse r;
        r.body = d_json.dump(-1, ' ', false, json::error_handler_t::replace);
        r.headers.emplace_back("X-Request-Id", request_id);
        return ex->respond(std::move(r));
      }
    }
    if (!recomputed) {  // a stream (a whole answer was relayed above)
      if (!streaming) ex->start_stream(200, "text/event-stream", {});  // D sent no event
      ex->send("data: [DONE]\n\n");
      return ex->end_stream();
    }
    // The decoder ran out of KV slots and handed the request back: prefill it again, from the
    // exact ids it has so far, on the least-loaded pair.
    earlier.text += leg.text;
    earlier.token_ids.insert(earlier.token_ids.end(), leg.token_ids.begin(), leg.token_ids.end());
    LOG(INFO) << "Request recomputed by " << d.instance().key() << " after "
              << earlier.token_ids.size() << " tokens; retrying (round " << round + 1 << ")";
    if (prompt_ids.empty())
      return end_with_error(*ex, 502,
                            "the decoder handed the request back without its prompt's token "
                            "ids; it cannot be retried exactly");
    request =
        next_round_request(original, request, chat, prompt_ids, earlier.token_ids, max_tokens);
    if (round >= 16) return end_with_error(*ex, 503, "the request was handed back 16 times");
  }
}

void PdProxy::models(const std::shared_ptr<HttpExchange>& ex) {
  json failed = json::array();
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    for (const InstanceInfo& i : registry_.instances(role)) {
      std::string body;
      auto r = httpclient::http_call(
          {"GET", i.url() + "/v1/models", "", backend_headers(uuid4()), 3, 3}, &body, nullptr);
      if (r.error.empty() && r.status == 200) {
        HttpResponse out;
        out.body = body;
        return ex->respond(std::move(out));
      }
      failed.push_back(i.key());
    }
  }
  ex->respond(json_reply(503, {{"error", "no backend answered /v1/models"}, {"failed", failed}}));
}

void PdProxy::reset_prefix_cache(const std::shared_ptr<HttpExchange>& ex) {
  json failed = json::array();
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    for (const InstanceInfo& i : registry_.instances(role)) {
      std::string body;
      auto r = httpclient::http_call(
          {"POST", i.url() + "/reset_prefix_cache", "", backend_headers(uuid4()), 10, 3}, &body,
          nullptr);
      if (!r.error.empty() || r.status != 200) failed.push_back(i.key());
    }
  }
  if (!failed.empty())
    return ex->respond(json_reply(500, {{"error", "reset failed"}, {"failed", failed}}));
  ex->respond(json_reply(200, {{"status", "ok"}}));
}

void PdProxy::instances(const std::shared_ptr<HttpExchange>& ex, bool add) {
  const json body = parse_bounded(ex->request().body);
  if (!body.is_object() || !body.contains("type") ||
      (body["type"] != "prefill" && body["type"] != "decode"))
    return ex->respond(error_reply(400, "'type' must be \"prefill\" or \"decode\""));
  const Role role = body["type"] == "prefill" ? Role::kPrefill : Role::kDecode;
  std::vector<InstanceInfo> list;
  json given = body.value("instances", json(nullptr));
  if (given.is_string()) given = json::array({given});
  if (!given.is_array() || given.empty())
    return ex->respond(error_reply(400, "'instances' must be \"host:port\" or a list of them"));
  for (const json& g : given) {
    const std::string s = g.is_string() ? g.get<std::string>() : "";
    const size_t colon = s.rfind(':');
    int port = 0;
    if (colon != std::string::npos && colon > 0) {  // the whole rest is the port
      const char* end = s.data() + s.size();
      if (std::from_chars(s.data() + colon + 1, end, port).ptr != end) port = 0;
    }
    if (port < 1 || port > 65535)
      return ex->respond(error_reply(400, "instance " + g.dump() + " is not \"host:port\""));
    list.push_back({s.substr(0, colon), port});
  }
  json done = json::array();
  for (const InstanceInfo& i : list) {
    if (add) {
      registry_.add(role, i, /*ready=*/false);
      // Ready once it answers GET /v1/models; dropped after max_waiting_retries probes.
      const bool probing = spawn([this, role, i] {
        for (int t = 0; t < std::max(1, o_.max_waiting_retries) && !stopping_; ++t) {
          std::string ignored;
          auto r = httpclient::http_call(
              {"GET", i.url() + "/v1/models", "", backend_headers(uuid4()), 5, 5}, &ignored,
              nullptr);
          if (r.error.empty() && r.status == 200) {
            registry_.set_ready(role, i.key());
            LOG(INFO) << "Instance " << i.key() << " is ready";
            return;
          }
          for (double w = 0; w < o_.waiting_retry_interval && !stopping_; w += 0.1)
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        LOG(WARNING) << "Instance " << i.key() << " never answered; dropping it";
        registry_.remove(role, i.key());
      });
      if (!probing) {
        registry_.remove(role, i.key());
        return ex->respond(error_reply(503, "the proxy is overloaded: cannot probe " + i.key()));
      }
    } else if (!registry_.remove(role, i.key())) {
      return ex->respond(error_reply(404, "instance " + i.key() + " is not registered"));
    }
    done.push_back(i.key());
  }
  ex->respond(json_reply(200, {{"status", "ok"}, {add ? "added" : "removed", done}}));
}

}  // namespace proxy
