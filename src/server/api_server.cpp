// Routing (vLLM's contract: 401 on any /v1 path without the key, 405 for a known path with
// another method, 404 otherwise), the cheap routes, /tokenize and /detokenize, and turning a
// generate request into a validated GeneratePlan. Nothing here blocks an I/O thread: request
// bodies are parsed on the worker pool.
#include "server/api_server.h"

#include <algorithm>
#include <cctype>
#include <random>
#include <thread>

#include "api/json_fields.h"
#include "api/prompt_input.h"
#include "api/protocol.h"
#include "api/tool_request.h"
#include "common/logging.h"
#include "server/generate_session.h"
#include "server/metrics_text.h"
#include "server/worker_pool.h"

namespace server {
namespace {

using nlohmann::json;

std::string random_hex() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (counter.fetch_add(1) << 32));
  static const char* kHex = "0123456789abcdef";
  std::string s(32, '0');
  for (char& c : s) c = kHex[rng() & 15];
  return s;
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = dump(body);
  return r;
}

HttpResponse error_response(const api::ApiError& e) {
  return json_response(e.status, e.body());
}

// FastAPI's bodies for routing errors.
HttpResponse detail_response(int status, const char* detail) {
  return json_response(status, {{"detail", detail}});
}

struct Route {
  const char* path;
  const char* method;
  bool needs_key;
  bool json_body = false;  // vLLM's validate_json_request: the body must be application/json
};
constexpr Route kRoutes[] = {
    {"/health", "GET", false},
    {"/ping", "GET", false},
    {"/ping", "POST", false},  // SageMaker's health check
    {"/load", "GET", false},
    {"/version", "GET", false},
    {"/metrics", "GET", false},
    {"/tokenize", "POST", false, true},
    {"/detokenize", "POST", false, true},
    {"/v1/models", "GET", true},
    {"/v1/completions", "POST", true, true},
    {"/v1/chat/completions", "POST", true, true},
    // chunkpipe's: a PD proxy whose client left between the legs hands P's kv_transfer_params
    // to a decoder, which tells P to free the blocks.
    {"/v1/kv_transfer/release", "POST", true, true},
};

// True when the request's media type (Content-Type without its parameters, any case) is
// application/json, the one vLLM's JSON endpoints accept.
bool is_json_media_type(const HttpRequest& request) {
  std::string type = request.header("Content-Type");
  type = type.substr(0, type.find(';'));
  std::transform(type.begin(), type.end(), type.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return type == "application/json";
}

// An optional boolean field, or an error naming it.
std::optional<api::ApiError> read_bool(const json& body, const char* key, bool fallback,
                                       bool* out) {
  *out = fallback;
  return api::read_field(body, key, out, nullptr, api::Nullable::kNo);
}

// How a chat prompt ends: add_generation_prompt (default true) opens an assistant turn;
// continue_final_message (default false) leaves the final message open instead, so it turns
// the generation prompt off unless the request also sets it true, which vLLM refuses.
std::optional<api::ApiError> read_prompt_ending(const json& body,
                                                tokenizer::ChatRenderOptions* options) {
  if (auto e = read_bool(body, "add_generation_prompt", true, &options->add_generation_prompt))
    return e;
  if (auto e = read_bool(body, "continue_final_message", false, &options->continue_final_message))
    return e;
  if (!options->continue_final_message) return std::nullopt;
  if (body.contains("add_generation_prompt") && body["add_generation_prompt"] == true)
    return api::bad_request(
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  options->add_generation_prompt = false;
  return std::nullopt;
}

// chat_template_kwargs: absent, null or an object.
std::optional<api::ApiError> read_template_kwargs(const json& body, json* out) {
  if (!body.contains("chat_template_kwargs") || body["chat_template_kwargs"].is_null())
    return std::nullopt;
  if (!body["chat_template_kwargs"].is_object())
    return api::bad_request("'chat_template_kwargs' must be an object");
  *out = body["chat_template_kwargs"];
  return std::nullopt;
}

// vLLM's bad words as token sequences: each word without its leading whitespace, plus the
// form after a space when that tokenizes to as many ids with a different first id.
std::vector<std::vector<int32_t>> bad_words_token_ids(const tokenizer::Tokenizer& tokenizer,
                                                      const std::vector<std::string>& words) {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& word : words) {
    const size_t start = word.find_first_not_of(" \t\n\r\f\v");
    const std::string bare = start == std::string::npos ? "" : word.substr(start);
    std::vector<int32_t> plain = tokenizer.encode(bare, false);
    if (plain.empty()) continue;  // nothing to ban
    std::vector<int32_t> spaced = tokenizer.encode(" " + bare, false);
    const bool add_spaced = spaced.size() == plain.size() && spaced.front() != plain.front();
    out.push_back(std::move(plain));
    if (add_spaced) out.push_back(std::move(spaced));
  }
  return out;
}

}  // namespace

common::Result<std::string> ApiServer::render_chat(
    const json& body, const tokenizer::ChatRenderOptions& options) const {
  const json* source = nullptr;
  if (body.contains("chat_template") && !body["chat_template"].is_null()) {
    source = &body["chat_template"];
  } else if (options.chat_template_kwargs.contains("chat_template") &&
             !options.chat_template_kwargs["chat_template"].is_null()) {
    source = &options.chat_template_kwargs["chat_template"];
  }
  if (source == nullptr) return chat_template_.render(body["messages"], options);
  if (!config_.trust_request_chat_template) {
    return common::invalid_argument(
        "Chat template is passed with request, but --trust-request-chat-template is not set. "
        "Refused request with untrusted chat template.");
  }
  if (!source->is_string() || source->get_ref<const std::string&>().empty())
    return common::invalid_argument("'chat_template' must be a non-empty string");
  auto own = tokenizer::ChatTemplate::create(source->get<std::string>());
  if (!own.ok())
    return common::invalid_argument("the request's chat_template: " + own.status().message());
  return (*own)->render(body["messages"], options);
}

ApiServer::ApiServer(ServerConfig config, engine::EngineClient& engine,
                     const tokenizer::Tokenizer& tokenizer,
                     const tokenizer::ChatTemplate& chat_template)
    : config_(std::move(config)),
      engine_(engine),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()),
      workers_(std::make_unique<WorkerPool>(config_.worker_threads)),
      parent_metrics_(std::make_shared<ParentRequestMetrics>(config_.max_model_len)) {
  HttpServerOptions o;
  o.host = config_.host;
  o.port = config_.port;
  o.io_threads = config_.http_threads;
  o.max_body_bytes = config_.max_body_bytes;
  o.max_header_bytes = config_.max_header_bytes;
  o.max_stream_buffer_bytes = config_.max_stream_buffer_bytes;
  o.keep_alive_timeout = config_.keep_alive_timeout;
  o.error_response = [](int status, const std::string& message) {
    return error_response(api::ApiError{status, message, "BadRequestError"});
  };
  o.response_headers = [this](const HttpRequest& request) {
    HttpHeaders headers = cors_response_headers(config_.cors, request);
    // The client's X-Request-Id comes back; --enable-request-id-headers makes one up otherwise.
    std::string id = request.header("X-Request-Id");
    if (id.empty() && config_.enable_request_id_headers) id = random_hex();
    if (!id.empty()) headers.emplace_back("X-Request-Id", std::move(id));
    return headers;
  };
  http_ = std::make_unique<HttpServer>(std::move(o),
                                       [this](std::shared_ptr<HttpExchange> ex) { handle(ex); });
}

ApiServer::~ApiServer() {
  http_->stop();
  workers_.reset();  // joins: no task touches the transport after this
  http_.reset();
}

bool ApiServer::listen(BoundSocket socket) {
  const int port = socket.port();  // the kernel's pick under --port 0
  if (auto st = http_->listen(std::move(socket)); !st.ok()) {
    LOG(ERROR) << st.message();
    return false;
  }
  LOG(INFO) << "Starting vLLM API server 0 on http://" << config_.host << ":" << port;
  for (const Route& r : kRoutes) LOG(INFO) << "Route: " << r.path << ", Methods: " << r.method;
  LOG(INFO) << "Application startup complete.";
  http_->run();
  return true;
}

void ApiServer::stop() {
  if (stopping_.exchange(true)) return;
  http_->stop_accepting();
  const auto deadline = std::chrono::steady_clock::now() + config_.drain_timeout;
  if (live_sessions() > 0) {
    LOG(INFO) << "Waiting up to " << config_.drain_timeout.count() << " ms for " << live_sessions()
              << " requests to finish";
  }
  while (live_sessions() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::vector<std::shared_ptr<GenerateSession>> cut;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (const auto& [p, w] : sessions_) {
      if (auto s = w.lock()) cut.push_back(std::move(s));
    }
  }
  if (!cut.empty()) LOG(INFO) << "Ending " << cut.size() << " requests still running";
  for (const auto& s : cut) s->cut("The server is shutting down");
  // Give the error events a moment to reach their clients, then close everything.
  const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while ((live_sessions() > 0 || http_->open_exchanges() > 0) &&
         std::chrono::steady_clock::now() < flush_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  http_->stop();
}

void ApiServer::track(const std::shared_ptr<GenerateSession>& session) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_.emplace(session.get(), session);
}

void ApiServer::untrack(const GenerateSession* session) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_.erase(session);
}

size_t ApiServer::live_sessions() const {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  return sessions_.size();
}

bool ApiServer::authorized(const HttpRequest& request) const {
  return !config_.api_key || request.header("Authorization") == "Bearer " + *config_.api_key;
}

void ApiServer::handle(std::shared_ptr<HttpExchange> ex) {
  const HttpRequest& req = ex->request();
  // CORS preflights are answered before the key check, as vLLM's key middleware lets OPTIONS
  // through to its CORS middleware.
  if (is_cors_preflight(req)) return ex->respond(cors_preflight_response(config_.cors, req));
  const Route* route = nullptr;
  bool path_known = false;
  for (const Route& r : kRoutes) {
    if (req.path != r.path) continue;
    path_known = true;
    // HEAD is served by GET routes (the transport drops the body), as Starlette's routes do.
    const std::string_view method =
        req.method == "HEAD" ? std::string_view("GET") : std::string_view(req.method);
    if (method == r.method) route = &r;
  }
  // vLLM's middleware checks the key on every /v1 path before routing (OPTIONS excepted).
  if (req.path.rfind("/v1", 0) == 0 && req.method != "OPTIONS" && !authorized(req)) {
    return ex->respond(json_response(401, {{"error", "Unauthorized"}}));
  }
  if (!route) {
    return ex->respond(path_known ? detail_response(405, "Method Not Allowed")
                                  : detail_response(404, "Not Found"));
  }
  if (route->json_body && !is_json_media_type(req)) {
    // vLLM raises a validation error with this one entry, so its handler's 400 carries the
    // list's Python form as the message.
    return ex->respond(error_response(
        api::bad_request("[\"Unsupported Media Type: Only 'application/json' is allowed\"]")));
  }
  const std::string path = req.path;
  if (path == "/health" || path == "/ping") {
    HttpResponse r;
    r.status = engine_.is_healthy() ? 200 : 503;
    return ex->respond(std::move(r));
  }
  if (path == "/load")
    return ex->respond(json_response(200, {{"server_load", server_load_->load()}}));
  if (path == "/version") return ex->respond(json_response(200, {{"version", "0.10.1.1"}}));
  if (path == "/metrics") {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = render_metrics(engine_.engine_metrics(), config_.served_model_names.front(),
                            parent_metrics_.get());
    return ex->respond(std::move(r));
  }
  if (path == "/v1/models") return ex->respond(models_response());
  if (path == "/v1/kv_transfer/release") {
    json body;
    if (auto e = api::parse_json_body(req.body, &body)) return ex->respond(error_response(*e));
    if (!body.is_object() || !body.contains("kv_transfer_params") ||
        !body["kv_transfer_params"].is_object())
      return ex->respond(
          error_response(api::bad_request("'kv_transfer_params' (an object) is required")));
    engine_.release_kv_transfer(body["kv_transfer_params"].dump());
    return ex->respond(json_response(200, {{"status", "ok"}}));
  }
  if (stopping_) {
    return ex->respond(
        error_response({503, "The server is shutting down", "ServiceUnavailableError"}));
  }
  if (config_.enable_server_load_tracking &&
      (path == "/v1/completions" || path == "/v1/chat/completions")) {
    // Counted until every holder of the exchange (the task, the session) lets it go: vLLM
    // counts a request until its response, streamed or whole, has been handed over.
    server_load_->fetch_add(1);
    std::shared_ptr<HttpExchange> inner = std::move(ex);
    ex = std::shared_ptr<HttpExchange>(
        inner.get(), [inner, load = server_load_](HttpExchange*) { load->fetch_sub(1); });
  }
  // The rest parse and tokenize: off the I/O thread. No exception may escape a task.
  workers_->post([this, ex, path] {
    try {
      if (path == "/tokenize") return ex->respond(handle_tokenize(ex->request()));
      if (path == "/detokenize") return ex->respond(handle_detokenize(ex->request()));
      handle_generate(ex, path == "/v1/chat/completions");
    } catch (const json::exception& e) {
      // A field of an unexpected type that a reader missed: still the client's error.
      ex->respond(error_response(api::bad_request(std::string("Invalid request: ") + e.what())));
    } catch (const std::exception& e) {
      LOG(ERROR) << "request to " << path << " failed: " << e.what();
      ex->respond(error_response({500, "Internal server error", "InternalServerError"}));
    }
  });
}

HttpResponse ApiServer::models_response() const {
  json data = json::array();
  for (const std::string& name : config_.served_model_names) {
    data.push_back({{"id", name},
                    {"object", "model"},
                    {"created", created_},
                    {"owned_by", "vllm"},
                    {"root", config_.model_path},
                    {"parent", nullptr},
                    {"max_model_len", config_.max_model_len},
                    {"permission", json::array({{{"id", "modelperm-" + random_hex()},
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
  return json_response(200, {{"object", "list"}, {"data", data}});
}

HttpResponse ApiServer::handle_tokenize(const HttpRequest& req) const {
  json body;
  if (auto e = api::parse_json_body(req.body, &body)) return error_response(*e);
  if (!body.is_object())
    return error_response(api::bad_request("the request body must be a JSON object"));
  std::string model;
  if (auto e = api::read_field(body, "model", &model)) return error_response(*e);
  const auto& names = config_.served_model_names;
  if (!model.empty() && std::find(names.begin(), names.end(), model) == names.end()) {
    return error_response(api::not_found_error("The model `" + model + "` does not exist."));
  }
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    tokenizer::ChatRenderOptions o;
    if (auto e = read_prompt_ending(body, &o)) return error_response(*e);
    if (auto e = read_template_kwargs(body, &o.chat_template_kwargs)) return error_response(*e);
    if (body.contains("tools") && !body["tools"].is_null()) {
      if (auto e = api::validate_tools(body["tools"])) return error_response(*e);
      o.tools = body["tools"];
    }
    bool add_special = false;
    if (auto e = read_bool(body, "add_special_tokens", false, &add_special))
      return error_response(*e);
    auto text = render_chat(body, o);
    if (!text.ok()) return error_response(api::bad_request(text.status().message()));
    ids = tokenizer_.encode(*text, add_special);
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    bool add_special = true;
    if (auto e = read_bool(body, "add_special_tokens", true, &add_special))
      return error_response(*e);
    ids = tokenizer_.encode(body["prompt"].get<std::string>(),
                            add_special && tokenizer_.add_bos_token());
  } else {
    return error_response(api::bad_request("'prompt' (a string) or 'messages' is required"));
  }
  // return_token_strs (vLLM's field, Optional[bool]): the tokens as the vocabulary spells them.
  bool token_strs = false;
  if (auto e = api::read_field(body, "return_token_strs", &token_strs)) return error_response(*e);
  json strs = nullptr;
  if (token_strs) {
    strs = json::array();
    for (int32_t id : ids) strs.push_back(tokenizer::sanitize_utf8(tokenizer_.token_string(id)));
  }
  return json_response(200, {{"count", ids.size()},
                             {"max_model_len", config_.max_model_len},
                             {"tokens", ids},
                             {"token_strs", std::move(strs)}});
}

HttpResponse ApiServer::handle_detokenize(const HttpRequest& req) const {
  json body;
  if (auto e = api::parse_json_body(req.body, &body)) return error_response(*e);
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
    return error_response(api::bad_request("'tokens' (a list of token ids) is required"));
  }
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX) ||
        t.get<int64_t>() < 0 || t.get<int64_t>() >= tokenizer_.vocab_size()) {
      return error_response(api::bad_request("'tokens' holds token id " + api::json_preview(t) +
                                             ", outside the vocabulary [0, " +
                                             std::to_string(tokenizer_.vocab_size()) + ")"));
    }
    ids.push_back(t.get<int32_t>());
  }
  return json_response(200, {{"prompt", tokenizer::sanitize_utf8(tokenizer_.decode(ids))}});
}

// A prompt past the context by its bytes alone is refused before tokenizing, unless the request
// truncates it (the body-size limit bounds the tokenizer's work then).
std::optional<api::ApiError> ApiServer::check_prompt_bytes(
    size_t bytes, const api::CommonRequestFields& f) const {
  if (f.truncate_prompt_tokens) return std::nullopt;
  return api::check_prompt_bytes(bytes, tokenizer_.max_token_bytes(), config_.max_model_len);
}

std::optional<api::ApiError> ApiServer::read_tool_parser(const json& body,
                                                         std::string* parser) const {
  api::ToolChoice choice;
  if (auto e = api::parse_tool_request(body, &choice)) return e;
  using Mode = api::ToolChoice::Mode;
  const bool parser_on = config_.enable_auto_tool_choice && !config_.tool_call_parser.empty();
  if (choice.mode == Mode::kAuto && !parser_on) {
    return api::bad_request(
        "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be "
        "set");
  }
  if ((choice.mode == Mode::kRequired || choice.mode == Mode::kNamed) &&
      config_.tool_call_parser.empty()) {
    return api::bad_request(
        std::string("tool_choice '") + choice.text() +
        "' needs --tool-call-parser: chunkpipe reads the model's tool-call markup and has no "
        "constrained decoding yet");
  }
  if (choice.mode != Mode::kNone) *parser = config_.tool_call_parser;
  return std::nullopt;
}

std::optional<api::ApiError> ApiServer::read_chat_prompt(const json& body,
                                                         const api::CommonRequestFields& f,
                                                         GeneratePrompts* out) const {
  if (!body.contains("messages")) return api::bad_request("'messages' is required");
  tokenizer::ChatRenderOptions o;
  if (auto e = read_prompt_ending(body, &o)) return e;
  if (auto e = read_template_kwargs(body, &o.chat_template_kwargs)) return e;
  if (body.contains("tools") && body["tools"].is_array()) o.tools = body["tools"];
  const json& kw = o.chat_template_kwargs;
  out->thinking = (kw.contains("thinking") && kw["thinking"] == true) ||
                  (kw.contains("enable_thinking") && kw["enable_thinking"] == true);
  auto text = render_chat(body, o);
  if (!text.ok()) return api::bad_request(text.status().message());
  if (auto e = check_prompt_bytes(text->size(), f)) return e;
  // vLLM: without a generation prompt the answer continues the final message, in its role;
  // echo starts each answer with that message when the roles match.
  bool echo = false;
  if (auto e = read_bool(body, "echo", false, &echo)) return e;
  auto messages = echo || !o.add_generation_prompt
                      ? tokenizer::normalize_messages(body["messages"])
                      : common::Result<json>(json::array());  // the usual case needs neither
  if (messages.ok() && !messages->empty()) {
    const json& last = messages->back();
    if (!o.add_generation_prompt) out->chat_role = last["role"].get<std::string>();
    if (echo && last["role"] == out->chat_role && last["content"].is_string())
      out->chat_echo = last["content"].get<std::string>();
  }
  const bool bos = f.add_special_tokens && tokenizer_.add_bos_token();
  out->token_ids.push_back(tokenizer_.encode(*text, bos));
  if (f.truncate_prompt_tokens)
    api::truncate_prompt(*f.truncate_prompt_tokens, bos, &out->token_ids.back());
  out->texts.push_back(*text);
  return std::nullopt;
}

std::optional<api::ApiError> ApiServer::read_completion_prompts(const json& body,
                                                                const api::CommonRequestFields& f,
                                                                GeneratePrompts* out) const {
  std::vector<api::PromptInput> inputs;
  // Any id the model can produce is a valid input (a PD proxy retries from generated ids);
  // ids past the tokenizer's table decode to nothing.
  const int32_t vocab = std::max(tokenizer_.vocab_size(), int32_t(config_.model_vocab_size));
  if (auto e = api::parse_completion_prompts(body, vocab, &inputs)) return e;
  for (const api::PromptInput& in : inputs) {
    if (!in.is_text) continue;
    if (auto e = check_prompt_bytes(in.text.size(), f)) return e;
  }
  const bool bos = f.add_special_tokens && tokenizer_.add_bos_token();
  for (api::PromptInput& in : inputs) {
    if (in.is_text) {
      out->token_ids.push_back(tokenizer_.encode(in.text, bos));
    } else {
      out->token_ids.push_back(std::move(in.token_ids));
    }
    if (f.truncate_prompt_tokens) {
      api::truncate_prompt(*f.truncate_prompt_tokens, in.is_text && bos, &out->token_ids.back());
    }
    // Echo repeats a text prompt as sent, truncated or not (vLLM); ids are decoded.
    out->texts.push_back(in.is_text
                             ? std::move(in.text)
                             : tokenizer::sanitize_utf8(tokenizer_.decode(out->token_ids.back())));
  }
  return std::nullopt;
}

std::optional<api::ApiError> ApiServer::resolve_prompt_limits(
    const GeneratePrompts& prompts, const api::CommonRequestFields& f, api::Endpoint endpoint,
    std::vector<int32_t>* max_tokens) const {
  for (const auto& ids : prompts.token_ids) {
    if (ids.empty()) return api::bad_request("The prompt is empty.");
    if (auto e = api::check_prompt_token_ids(ids, config_.model_vocab_size)) return e;
    api::CommonRequestFields copy = f;
    if (auto e = api::resolve_max_tokens(static_cast<int64_t>(ids.size()), config_.max_model_len,
                                         endpoint, &copy)) {
      return e;
    }
    max_tokens->push_back(copy.sampling.max_tokens);
  }
  return std::nullopt;
}

void ApiServer::handle_generate(const std::shared_ptr<HttpExchange>& ex, bool chat) {
  const HttpRequest& req = ex->request();
  json body;
  std::string kv_transfer_params;  // a PD request's (JSON text)
  auto fail = [&](const api::ApiError& e) {
    // A decoder that refuses a request P prefilled for it must still let P free the blocks.
    if (!kv_transfer_params.empty()) engine_.release_kv_transfer(kv_transfer_params);
    ex->respond(error_response(e));
  };
  if (auto e = api::parse_json_body(req.body, &body)) return fail(*e);
  if (body.is_object() && body.contains("kv_transfer_params") &&
      !body["kv_transfer_params"].is_null()) {
    if (!body["kv_transfer_params"].is_object())
      return fail(api::bad_request("'kv_transfer_params' must be an object"));
    kv_transfer_params = body["kv_transfer_params"].dump();
  }
  // P's leg of a PD request: D samples the n choices from the KV of the prompt P's answer names
  // (the first), so P runs one choice per prompt and keeps only the first prompt's blocks.
  const json* transfer = kv_transfer_params.empty() ? nullptr : &body["kv_transfer_params"];
  const bool prefill_leg =
      config_.kv_producer && transfer != nullptr && transfer->contains("do_remote_decode") &&
      (*transfer)["do_remote_decode"].is_boolean() && (*transfer)["do_remote_decode"].get<bool>();
  api::CommonRequestFields f;
  const auto endpoint = chat ? api::Endpoint::kChat : api::Endpoint::kCompletions;
  if (auto e = api::parse_common_fields(body, endpoint, config_.max_logprobs,
                                        config_.model_vocab_size, &f, config_.sampling_defaults))
    return fail(*e);
  if (auto e = api::check_priority(f.priority, config_.priority_scheduling)) return fail(*e);
  const auto& names = config_.served_model_names;
  if (!f.model.empty() && std::find(names.begin(), names.end(), f.model) == names.end()) {
    return fail(api::not_found_error("The model `" + f.model + "` does not exist."));
  }
  if (auto e = api::resolve_truncation(config_.max_model_len, &f)) return fail(*e);
  f.sampling.bad_words_token_ids = bad_words_token_ids(tokenizer_, f.bad_words);
  // Every id field, bad words included (the tokenizer's table may outgrow a small model's), is
  // checked against the model's rows here; the engine and the workers check again.
  if (auto e = api::check_sampling_token_ids(f.sampling, config_.model_vocab_size)) return fail(*e);

  // Tool calling (chat only): which parser reads the output, if any.
  std::string tool_parser;
  if (chat) {
    if (auto e = read_tool_parser(body, &tool_parser)) return fail(*e);
  }

  // How many engine requests this asks for, before any tokenizing.
  const int64_t num_prompts = chat ? 1 : api::count_completion_prompts(body);
  if (num_prompts * f.n > config_.max_completions_per_request) {
    return fail(api::bad_request(
        "The request asks for " + std::to_string(num_prompts * f.n) + " completions (" +
        std::to_string(num_prompts) + " prompts x n=" + std::to_string(f.n) + "); at most " +
        std::to_string(config_.max_completions_per_request) + " are allowed per request"));
  }

  // Prompts as token ids, each checked, with its max_tokens.
  GeneratePrompts prompts;
  prompts.chat_role = config_.response_role;
  if (auto e =
          chat ? read_chat_prompt(body, f, &prompts) : read_completion_prompts(body, f, &prompts))
    return fail(*e);
  std::vector<int32_t> max_tokens_per_prompt;
  if (auto e = resolve_prompt_limits(prompts, f, endpoint, &max_tokens_per_prompt)) return fail(*e);

  // The client's X-Request-Id (else, as vLLM, the body's request_id) names the response; engine
  // ids are always unique, so two live requests with one id (a retry, or both legs of a PD
  // proxy) never collide.
  std::string header_id = req.header("X-Request-Id");
  if (header_id.empty()) {
    if (auto e = api::read_field(body, "request_id", &header_id)) return fail(*e);
  }
  GeneratePlan plan;
  plan.chat = chat;
  plan.chat_role = prompts.chat_role;
  plan.stream = f.stream;
  plan.include_usage = f.stream && (f.include_usage || config_.enable_force_include_usage);
  plan.continuous_usage = plan.include_usage && f.continuous_usage_stats;
  plan.prompt_tokens_details = config_.enable_prompt_tokens_details;
  plan.want_logprobs = f.want_logprobs;
  plan.want_prompt_logprobs = f.sampling.prompt_logprobs.has_value();
  plan.echo = f.echo;
  plan.echo_without_generation = f.echo_without_generation;
  if (auto e = read_bool(body, "return_token_ids", false, &plan.return_token_ids)) return fail(*e);
  if (auto e = read_bool(body, "return_tokens_as_token_ids", config_.return_tokens_as_token_ids,
                         &plan.return_tokens_as_token_ids))
    return fail(*e);
  const int choices_per_prompt = prefill_leg ? 1 : f.n;
  plan.n = choices_per_prompt;
  plan.response_id =
      (chat ? "chatcmpl-" : "cmpl-") + (header_id.empty() ? random_hex() : header_id);
  plan.model_name = names.front();
  plan.created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  const std::string engine_prefix =
      plan.response_id + "-" + std::to_string(next_engine_id_.fetch_add(1)) + "-";
  const bool use_reasoning =
      chat && (config_.reasoning_parser == "deepseek_r1" ||
               (config_.reasoning_parser == "deepseek_v3" && prompts.thinking));
  for (size_t p = 0; p < prompts.token_ids.size(); ++p) {
    for (int k = 0; k < choices_per_prompt; ++k) {
      const size_t i = plan.choices.size();
      GenerateChoice c;
      c.engine_id = engine_prefix + std::to_string(i);
      c.prompt_tokens = static_cast<int64_t>(prompts.token_ids[p].size());
      if (plan.return_token_ids || (f.echo && f.want_logprobs))
        c.prompt_token_ids = prompts.token_ids[p];
      if (f.echo) c.echo = prompts.texts[p];
      if (chat) c.echo = prompts.chat_echo;
      if (use_reasoning)
        c.reasoning = std::make_unique<tokenizer::ReasoningParser>(prompts.thinking);
      if (!tool_parser.empty()) {
        c.tools = api::ToolCallParser::create(tool_parser,
                                              "chatcmpl-tool-" + random_hex().substr(0, 24) + "-");
      }
      engine::EngineRequest r;
      r.request_id = c.engine_id;
      r.prompt_token_ids = prompts.token_ids[p];
      r.sampling = f.sampling;
      r.sampling.max_tokens = max_tokens_per_prompt[p];
      if (!prefill_leg || p == 0) r.kv_transfer_params = kv_transfer_params;
      r.cache_salt = f.cache_salt;
      r.priority = f.priority;
      r.sampling_key = plan.response_id + "-" + std::to_string(i);
      if (r.sampling.seed && f.n > 1) *r.sampling.seed += k;  // distinct samples per choice
      plan.choices.push_back(std::move(c));
      plan.requests.push_back(std::move(r));
    }
  }
  // The proxy resumes a handed-back answer only from its first choice: with several, D
  // preempts and recomputes a choice itself.
  if (plan.requests.size() > 1)
    for (engine::EngineRequest& r : plan.requests) r.recomputable = false;
  auto session = std::make_shared<GenerateSession>(
      engine_, tokenizer_, ex, std::move(plan), workers_->make_serial(),
      [this](const GenerateSession* s) { untrack(s); }, parent_metrics_);
  track(session);
  session->start();
}

}  // namespace server
