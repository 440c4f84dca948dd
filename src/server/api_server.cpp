// Route handlers. A generate request becomes one engine request per (prompt, n) choice; the
// engine's outputs reach the HTTP thread through a Session (mutex + condition variable), which
// streams them as SSE or gathers them into one response.
#include "server/api_server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>

#include "api/protocol.h"
#include "common/logging.h"
#include "server/metrics_text.h"
#include "tokenizer/reasoning_parser.h"

namespace server {
namespace {

using nlohmann::json;

std::string random_id() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (counter.fetch_add(1) << 32));
  static const char* kHex = "0123456789abcdef";
  std::string s(32, '0');
  for (char& c : s) c = kHex[rng() & 15];
  return s;
}

void send_error(httplib::Response& res, const api::ApiError& e) {
  res.status = e.status;
  res.set_content(e.body().dump(), "application/json");
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json stop_reason_json(const std::variant<std::monostate, std::string, int32_t>& v) {
  if (std::holds_alternative<std::string>(v)) return std::get<std::string>(v);
  if (std::holds_alternative<int32_t>(v)) return std::get<int32_t>(v);
  return nullptr;
}

}  // namespace

// One HTTP request's choices and the engine outputs not yet consumed.
struct ApiServer::Session {
  struct Choice {
    std::string engine_id;
    int64_t prompt_tokens = 0;
    std::string echo;
    std::string text;
    std::vector<engine::TokenLogprob> logprobs;
    int64_t completion_tokens = 0;
    bool finished = false;
    sched::FinishReason finish_reason = sched::FinishReason::kNone;
    json stop_reason = nullptr;
    std::string error;  // the engine failed (e.g. a pipeline stage died) before finishing
    std::unique_ptr<tokenizer::ReasoningParser> reasoning;
    std::string reasoning_text;
    bool role_sent = false;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<size_t, engine::RequestOutput>> events;
  std::vector<Choice> choices;
  size_t unfinished = 0;
};

ApiServer::ApiServer(ServerConfig config, engine::EngineCore& engine,
                     const tokenizer::Tokenizer& tokenizer,
                     const tokenizer::ChatTemplate& chat_template)
    : config_(std::move(config)),
      engine_(engine),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      http_(std::make_unique<httplib::Server>()),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()) {
  const int threads = config_.http_threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(config_.max_body_bytes);
  http_->set_keep_alive_max_count(1000);
  http_->set_tcp_nodelay(
      true);  // SSE chunks are small: Nagle + delayed ACKs would add ~40 ms per token
  http_->set_read_timeout(60, 0);
  http_->set_write_timeout(60, 0);
  register_routes();
}

ApiServer::~ApiServer() = default;

bool ApiServer::listen() {
  // cpp-httplib listens with a backlog of 5, so bursts of connections overflow the accept
  // queue (clients then see resets and retransmit delays). Capture the socket and widen it.
  int listen_fd = -1;
  http_->set_socket_options([&listen_fd](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = sock;
  });
  if (!http_->bind_to_port(config_.host, config_.port)) return false;
  if (listen_fd >= 0 && ::listen(listen_fd, SOMAXCONN) != 0)
    LOG(WARNING) << "could not widen the listen backlog";
  LOG(INFO) << "Starting vLLM API server 0 on http://" << config_.host << ":" << config_.port;
  for (const char* route : {"/health", "/version", "/v1/models", "/tokenize", "/detokenize",
                            "/v1/completions", "/v1/chat/completions", "/metrics"}) {
    LOG(INFO) << "Route: " << route;
  }
  LOG(INFO) << "Application startup complete.";
  return http_->listen_after_bind();
}

void ApiServer::stop() {
  http_->stop();
}

bool ApiServer::check_api_key(const httplib::Request& req, httplib::Response& res) const {
  if (!config_.api_key) return true;
  if (req.get_header_value("Authorization") == "Bearer " + *config_.api_key) return true;
  res.status = 401;
  res.set_content(R"({"error":"Unauthorized"})", "application/json");
  return false;
}

void ApiServer::register_routes() {
  http_->set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.status == 413) {
      send_error(res, {413, "Request body too large", "BadRequestError"});
    } else if (res.body.empty()) {
      send_error(res, {res.status, res.status == 404 ? "Not Found" : "Error",
                       res.status == 404 ? "NotFoundError" : "BadRequestError"});
    }
  });
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.status = engine_.alive() ? 200 : 503;
  });
  http_->Get("/version", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"version":"0.10.1.1"})", "application/json");
  });
  http_->Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!check_api_key(req, res)) return;
    json data = json::array();
    for (const std::string& name : config_.served_model_names) {
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", created_},
                      {"owned_by", "vllm"},
                      {"root", config_.model_path},
                      {"parent", nullptr},
                      {"max_model_len", config_.max_model_len},
                      {"permission", json::array({{{"id", "modelperm-" + random_id()},
                                                   {"object", "model_permission"},
                                                   {"created", created_},
                                                   {"allow_create_engine", false},
                                                   {"allow_sampling", true},
                                                   {"allow_logprobs", true},
                                                   {"allow_search_indices", false},
                                                   {"allow_view", true},
                                                   {"allow_fine_tuning", false},
                                                   {"organization", "*"},
                                                   {"group", nullptr},
                                                   {"is_blocking", false}}})}});
    }
    res.set_content(dump({{"object", "list"}, {"data", data}}), "application/json");
  });
  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (check_api_key(req, res)) handle_generate(req, res, false);
  });
  http_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (check_api_key(req, res)) handle_generate(req, res, true);
  });
  http_->Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    handle_tokenize(req, res);
  });
  http_->Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    handle_detokenize(req, res);
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_metrics(engine_.metrics(), config_.served_model_names.front()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
}

void ApiServer::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object())
    return send_error(res, api::bad_request("Invalid JSON body"));
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    tokenizer::ChatRenderOptions o;
    o.add_generation_prompt = body.value("add_generation_prompt", true);
    if (body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object())
      o.chat_template_kwargs = body["chat_template_kwargs"];
    auto text = chat_template_.render(body["messages"], o);
    if (!text.ok()) return send_error(res, api::bad_request(text.status().message()));
    ids = tokenizer_.encode(*text, body.value("add_special_tokens", false));
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    ids = tokenizer_.encode(body["prompt"].get<std::string>(),
                            body.value("add_special_tokens", true) && tokenizer_.add_bos_token());
  } else {
    return send_error(res, api::bad_request("'prompt' (a string) or 'messages' is required"));
  }
  json out = {{"count", ids.size()},
              {"max_model_len", config_.max_model_len},
              {"tokens", ids},
              {"token_strs", nullptr}};
  res.set_content(dump(out), "application/json");
}

void ApiServer::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object() || !body.contains("tokens") ||
      !body["tokens"].is_array()) {
    return send_error(res, api::bad_request("'tokens' (a list of token ids) is required"));
  }
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= tokenizer_.vocab_size()) {
      return send_error(res, api::bad_request("token id " + t.dump() + " is out of vocabulary"));
    }
    ids.push_back(t.get<int32_t>());
  }
  res.set_content(dump({{"prompt", tokenizer::sanitize_utf8(tokenizer_.decode(ids))}}),
                  "application/json");
}

void ApiServer::handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) {
    return send_error(res, api::bad_request("Invalid JSON in request body: could not parse " +
                                            std::to_string(req.body.size()) + " bytes"));
  }
  api::CommonRequestFields f;
  const auto endpoint = chat ? api::Endpoint::kChat : api::Endpoint::kCompletions;
  if (auto e = api::parse_common_fields(body, endpoint, config_.max_logprobs, &f))
    return send_error(res, *e);
  const std::string& served = config_.served_model_names.front();
  if (!f.model.empty() &&
      std::find(config_.served_model_names.begin(), config_.served_model_names.end(), f.model) ==
          config_.served_model_names.end()) {
    return send_error(res, api::not_found_error("The model `" + f.model + "` does not exist."));
  }

  // Prompts as token ids.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;
  bool thinking = false;
  if (chat) {
    if (!body.contains("messages"))
      return send_error(res, api::bad_request("'messages' is required"));
    tokenizer::ChatRenderOptions o;
    o.add_generation_prompt = body.value("add_generation_prompt", true);
    if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
      if (!body["chat_template_kwargs"].is_object())
        return send_error(res, api::bad_request("'chat_template_kwargs' must be an object"));
      o.chat_template_kwargs = body["chat_template_kwargs"];
    }
    const json& kw = o.chat_template_kwargs;
    thinking = (kw.contains("thinking") && kw["thinking"] == true) ||
               (kw.contains("enable_thinking") && kw["enable_thinking"] == true);
    auto text = chat_template_.render(body["messages"], o);
    if (!text.ok()) return send_error(res, api::bad_request(text.status().message()));
    prompts.push_back(tokenizer_.encode(*text, f.add_special_tokens && tokenizer_.add_bos_token()));
    prompt_texts.push_back(*text);
  } else {
    if (!body.contains("prompt")) return send_error(res, api::bad_request("'prompt' is required"));
    const json& p = body["prompt"];
    auto add_text = [&](const std::string& s) {
      prompts.push_back(tokenizer_.encode(s, f.add_special_tokens && tokenizer_.add_bos_token()));
      prompt_texts.push_back(s);
    };
    auto valid_ids = [&](const json& a) {
      return a.is_array() && !a.empty() && std::all_of(a.begin(), a.end(), [&](const json& x) {
               return x.is_number_integer() && x.get<int64_t>() >= 0 &&
                      x.get<int64_t>() < tokenizer_.vocab_size();
             });
    };
    if (p.is_string()) {
      add_text(p.get<std::string>());
    } else if (p.is_array() && !p.empty() && p[0].is_string()) {
      for (const json& s : p) {
        if (!s.is_string())
          return send_error(res, api::bad_request("'prompt' list must hold only strings"));
        add_text(s.get<std::string>());
      }
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      if (!valid_ids(p))
        return send_error(
            res, api::bad_request("'prompt' token ids must be integers in [0, vocab size)"));
      prompts.push_back(p.get<std::vector<int32_t>>());
      prompt_texts.push_back(tokenizer::sanitize_utf8(tokenizer_.decode(prompts.back())));
    } else if (p.is_array() && !p.empty() && p[0].is_array()) {
      for (const json& ids : p) {
        if (!valid_ids(ids))
          return send_error(
              res, api::bad_request("'prompt' token ids must be integers in [0, vocab size)"));
        prompts.push_back(ids.get<std::vector<int32_t>>());
        prompt_texts.push_back(tokenizer::sanitize_utf8(tokenizer_.decode(prompts.back())));
      }
    } else {
      return send_error(res, api::bad_request("'prompt' must be a string, a list of strings, a "
                                              "list of token ids, or a list of token id lists"));
    }
  }
  // Validate every prompt before queueing anything.
  std::vector<int32_t> max_tokens_per_prompt;
  for (const auto& ids : prompts) {
    if (ids.empty()) return send_error(res, api::bad_request("The prompt is empty."));
    for (int32_t id : ids) {
      if (id < 0 || id >= config_.model_vocab_size) {
        return send_error(res,
                          api::bad_request("Token id " + std::to_string(id) +
                                           " is out of vocabulary (the model has " +
                                           std::to_string(config_.model_vocab_size) + " rows)"));
      }
    }
    api::CommonRequestFields copy = f;
    if (auto e = api::resolve_max_tokens(static_cast<int64_t>(ids.size()), config_.max_model_len,
                                         endpoint, &copy)) {
      return send_error(res, *e);
    }
    max_tokens_per_prompt.push_back(copy.sampling.max_tokens);
  }

  const std::string header_id = req.get_header_value("X-Request-Id");
  const std::string base_id = header_id.empty() ? random_id() : header_id;
  const std::string response_id = (chat ? "chatcmpl-" : "cmpl-") + base_id;
  if (!header_id.empty()) res.set_header("X-Request-Id", header_id);
  auto session = std::make_shared<Session>();
  const bool use_reasoning = chat && (config_.reasoning_parser == "deepseek_r1" ||
                                      (config_.reasoning_parser == "deepseek_v3" && thinking));
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int k = 0; k < f.n; ++k) {
      Session::Choice c;
      c.engine_id = response_id + "-" + std::to_string(session->choices.size());
      c.prompt_tokens = static_cast<int64_t>(prompts[p].size());
      if (f.echo) c.echo = prompt_texts[p];
      if (use_reasoning) c.reasoning = std::make_unique<tokenizer::ReasoningParser>(thinking);
      session->choices.push_back(std::move(c));
    }
  }
  session->unfinished = session->choices.size();
  for (size_t i = 0; i < session->choices.size(); ++i) {
    auto r = std::make_unique<sched::Request>();
    r->request_id = session->choices[i].engine_id;
    r->prompt_token_ids = prompts[i / f.n];
    r->sampling = f.sampling;
    r->sampling.max_tokens = max_tokens_per_prompt[i / f.n];
    if (r->sampling.seed && f.n > 1) *r->sampling.seed += i % f.n;  // distinct samples per choice
    std::weak_ptr<Session> weak = session;
    engine_.add_request(std::move(r), [weak, i](const engine::RequestOutput& out) {
      if (auto s = weak.lock()) {
        std::lock_guard<std::mutex> lock(s->mu);
        s->events.emplace_back(i, out);
        s->cv.notify_all();
      }
    });
  }

  const std::string model_name = served;
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  const bool want_logprobs = f.want_logprobs;
  // Applies one engine event to its choice; returns (reasoning delta, content delta).
  auto apply = [this, want_logprobs](Session::Choice& c, const engine::RequestOutput& o) {
    tokenizer::ReasoningDelta d;
    std::string text = o.new_text;
    if (c.reasoning) {
      d = c.reasoning->push(text);
      if (o.finished) {
        auto tail = c.reasoning->flush();
        d.reasoning += tail.reasoning;
        d.content += tail.content;
      }
    } else {
      d.content = text;
    }
    c.text += d.content;
    c.reasoning_text += d.reasoning;
    c.completion_tokens = o.finished
                              ? o.num_output_tokens
                              : c.completion_tokens + static_cast<int64_t>(o.new_token_ids.size());
    if (want_logprobs)
      c.logprobs.insert(c.logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
    if (o.finished) {
      c.finished = true;
      c.finish_reason = o.finish_reason;
      c.stop_reason = stop_reason_json(o.stop_reason);
      c.error = o.error;
    }
    (void)this;
    return d;
  };
  auto token_str = [this](int32_t id) {
    return tokenizer::sanitize_utf8(tokenizer_.token_bytes(id));
  };
  auto logprobs_json = [&, chat](const std::vector<engine::TokenLogprob>& lps) -> json {
    if (lps.empty() && !want_logprobs) return nullptr;
    if (chat) {
      json content = json::array();
      for (const auto& lp : lps) {
        json top = json::array();
        for (const auto& [id, v] : lp.top)
          top.push_back({{"token", token_str(id)}, {"logprob", v}, {"bytes", nullptr}});
        content.push_back({{"token", token_str(lp.token)},
                           {"logprob", lp.logprob},
                           {"bytes", nullptr},
                           {"top_logprobs", top}});
      }
      return {{"content", content}};
    }
    json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
         offsets = json::array();
    size_t offset = 0;  // bytes into the generated text
    for (const auto& lp : lps) {
      tokens.push_back(token_str(lp.token));
      token_logprobs.push_back(lp.logprob);
      json t = json::object();
      for (const auto& [id, v] : lp.top) t[token_str(id)] = v;
      top.push_back(t);
      offsets.push_back(offset);
      offset += tokens.back().get_ref<const std::string&>().size();
    }
    return {{"text_offset", offsets},
            {"token_logprobs", token_logprobs},
            {"tokens", tokens},
            {"top_logprobs", top}};
  };

  if (!f.stream) {
    std::unique_lock<std::mutex> lock(session->mu);
    while (session->unfinished > 0) {
      session->cv.wait(lock, [&] { return !session->events.empty(); });
      while (!session->events.empty()) {
        auto [i, o] = std::move(session->events.front());
        session->events.pop_front();
        apply(session->choices[i], o);
        if (o.finished) --session->unfinished;
      }
    }
    for (const auto& c : session->choices) {
      if (!c.error.empty()) return send_error(res, {500, c.error, "EngineDeadError"});
    }
    json choices = json::array();
    int64_t prompt_total = 0, completion_total = 0;
    for (size_t i = 0; i < session->choices.size(); ++i) {
      const auto& c = session->choices[i];
      if (i % f.n == 0) prompt_total += c.prompt_tokens;
      completion_total += c.completion_tokens;
      const char* fr = sched::finish_reason_name(c.finish_reason);
      if (chat) {
        json message = {{"role", "assistant"},        {"content", c.text},
                        {"refusal", nullptr},         {"annotations", nullptr},
                        {"audio", nullptr},           {"function_call", nullptr},
                        {"tool_calls", json::array()}};
        message["reasoning_content"] = c.reasoning ? json(c.reasoning_text) : json(nullptr);
        choices.push_back({{"index", i},
                           {"message", message},
                           {"logprobs", logprobs_json(c.logprobs)},
                           {"finish_reason", fr ? json(fr) : json("stop")},
                           {"stop_reason", c.stop_reason}});
      } else {
        choices.push_back({{"index", i},
                           {"text", c.echo + c.text},
                           {"logprobs", logprobs_json(c.logprobs)},
                           {"finish_reason", fr ? json(fr) : json(nullptr)},
                           {"stop_reason", c.stop_reason},
                           {"prompt_logprobs", nullptr}});
      }
    }
    json out = {{"id", response_id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", model_name},
                {"choices", choices},
                {"service_tier", nullptr},
                {"system_fingerprint", nullptr},
                {"usage", api::usage_json(prompt_total, completion_total)},
                {"prompt_logprobs", nullptr},
                {"kv_transfer_params", nullptr}};
    res.set_content(dump(out), "application/json");
    return;
  }

  // Streaming: Server-Sent Events, one `data:` line per chunk, then [DONE].
  const bool include_usage = f.include_usage;
  const int n = f.n;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, session, chat, response_id, model_name, created, include_usage, n, apply,
       logprobs_json](size_t, httplib::DataSink& sink) mutable {
        auto write = [&](const json& chunk) {
          const std::string line = "data: " + dump(chunk) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        auto abort_all = [&] {
          for (const auto& c : session->choices) {
            if (!c.finished) engine_.abort_request(c.engine_id);
          }
        };
        std::unique_lock<std::mutex> lock(session->mu);
        if (chat) {
          for (size_t i = 0; i < session->choices.size(); ++i) {
            auto& c = session->choices[i];
            if (c.role_sent) continue;
            c.role_sent = true;
            json chunk = {{"id", response_id},
                          {"object", "chat.completion.chunk"},
                          {"created", created},
                          {"model", model_name},
                          {"choices",
                           {{{"index", i},
                             {"delta", {{"role", "assistant"}, {"content", ""}}},
                             {"logprobs", nullptr},
                             {"finish_reason", nullptr}}}}};
            if (!write(chunk)) {
              abort_all();
              return false;
            }
          }
        }
        if (session->unfinished == 0 && session->events.empty()) {
          if (include_usage) {
            int64_t prompt_total = 0, completion_total = 0;
            for (size_t i = 0; i < session->choices.size(); ++i) {
              if (i % n == 0) prompt_total += session->choices[i].prompt_tokens;
              completion_total += session->choices[i].completion_tokens;
            }
            json usage = api::usage_json(prompt_total, completion_total);
            usage.erase("prompt_tokens_details");
            write({{"id", response_id},
                   {"object", chat ? "chat.completion.chunk" : "text_completion"},
                   {"created", created},
                   {"model", model_name},
                   {"choices", json::array()},
                   {"usage", usage}});
          }
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        }
        if (!session->cv.wait_for(lock, std::chrono::milliseconds(200),
                                  [&] { return !session->events.empty(); })) {
          // Nothing new: probe the connection with an SSE comment so a vanished client is noticed.
          if (!sink.write(": \n\n", 4)) {
            abort_all();
            return false;
          }
          return true;
        }
        while (!session->events.empty()) {
          auto [i, o] = std::move(session->events.front());
          session->events.pop_front();
          auto& c = session->choices[i];
          const size_t lp_before = c.logprobs.size();
          auto d = apply(c, o);
          if (o.finished) --session->unfinished;
          if (!c.error.empty()) {  // vLLM streams the error as a data event, then [DONE]
            write({{"error",
                    {{"message", c.error},
                     {"type", "EngineDeadError"},
                     {"param", nullptr},
                     {"code", 500}}}});
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            sink.done();
            abort_all();
            return true;
          }
          std::vector<engine::TokenLogprob> new_lps(c.logprobs.begin() + lp_before,
                                                    c.logprobs.end());
          const char* fr = o.finished ? sched::finish_reason_name(c.finish_reason) : nullptr;
          json chunk;
          if (chat) {
            json delta = json::object();
            if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
            if (!d.content.empty()) delta["content"] = d.content;
            if (delta.empty() && !o.finished) continue;  // no empty deltas
            if (delta.empty()) delta["content"] = "";
            json choice = {{"index", i},
                           {"delta", delta},
                           {"logprobs", new_lps.empty() ? json(nullptr) : logprobs_json(new_lps)},
                           {"finish_reason", fr ? json(fr) : json(nullptr)}};
            if (o.finished) choice["stop_reason"] = c.stop_reason;
            chunk = {{"id", response_id},
                     {"object", "chat.completion.chunk"},
                     {"created", created},
                     {"model", model_name},
                     {"choices", {choice}}};
          } else {
            std::string text = d.content;
            if (!c.echo.empty()) {
              text = c.echo + text;
              c.echo.clear();
            }
            if (text.empty() && !o.finished) continue;
            chunk = {{"id", response_id},
                     {"object", "text_completion"},
                     {"created", created},
                     {"model", model_name},
                     {"choices",
                      {{{"index", i},
                        {"text", text},
                        {"logprobs", new_lps.empty() ? json(nullptr) : logprobs_json(new_lps)},
                        {"finish_reason", fr ? json(fr) : json(nullptr)},
                        {"stop_reason", o.finished ? c.stop_reason : json(nullptr)}}}},
                     {"usage", nullptr}};
          }
          if (!write(chunk)) {
            abort_all();
            return false;
          }
        }
        return true;
      },
      [this, session](bool success) {
        if (success) return;
        std::lock_guard<std::mutex> lock(session->mu);
        for (const auto& c : session->choices) {
          if (!c.finished) engine_.abort_request(c.engine_id);
        }
      });
}

}  // namespace server
