// ApiServer: the OpenAI-compatible routes over an EngineCore, served by HttpServer:
// /v1/completions, /v1/chat/completions (SSE streaming), /v1/models, /health, /version,
// /tokenize, /detokenize, /metrics. Liveness routes answer on the I/O threads; parsing and
// tokenizing run on a small worker pool; engine outputs are formatted per request on that pool,
// so the engine thread never waits on a client. listen() blocks; stop() drains (bounded),
// then ends every open stream with an error event and [DONE]. stop() is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/generation_defaults.h"
#include "api/protocol.h"
#include "engine/engine_client.h"
#include "server/cors.h"
#include "server/http_server.h"
#include "server/parent_request_metrics.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace server {

class GenerateSession;
class WorkerPool;

struct ServerConfig {
  std::string host = "0.0.0.0";
  int port = 8000;
  std::vector<std::string> served_model_names;
  std::string model_path;
  std::optional<std::string> api_key;
  int64_t max_model_len = 0;
  int64_t model_vocab_size = 0;  // prompt ids must be below it
  int max_logprobs = 20;
  std::string reasoning_parser;  // "", "deepseek_v3" or "deepseek_r1"
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;  // "", "deepseek_v3" or "deepseek_v31"
  // --trust-request-chat-template: a request's own `chat_template` renders its messages;
  // without it such a request is refused, as vLLM refuses it.
  bool trust_request_chat_template = false;
  bool enable_force_include_usage = false;    // every stream ends with a usage chunk
  bool enable_prompt_tokens_details = false;  // usage.prompt_tokens_details.cached_tokens
  bool return_tokens_as_token_ids = false;    // the default of the request field of that name
  // A PD prefiller (kv_role kv_producer or kv_both): a request with do_remote_decode is P's leg.
  bool kv_producer = false;
  bool priority_scheduling = false;  // --scheduling-policy priority: requests may set priority
  // The model's generation_config sampling defaults (--generation-config).
  api::SamplingDefaults sampling_defaults;
  CorsPolicy cors;         // --allowed-origins, --allow-credentials, --allowed-methods/-headers
  int http_threads = 2;    // I/O threads of the event loop
  int worker_threads = 2;  // parse, tokenize, format
  size_t max_body_bytes = 32 << 20;
  size_t max_header_bytes = 64 << 10;          // --h11-max-incomplete-event-size
  std::string response_role = "assistant";     // --response-role: a chat answer's role
  bool enable_server_load_tracking = false;    // GET /load counts generate requests in progress
  bool enable_request_id_headers = false;      // every response carries an X-Request-Id
  size_t max_stream_buffer_bytes = 4 << 20;    // a stream this far behind its client is dropped
  int64_t max_completions_per_request = 1024;  // prompts x n
  std::chrono::milliseconds keep_alive_timeout{5000};
  std::chrono::milliseconds drain_timeout{3000};  // SIGTERM: time to let requests finish
};

class ApiServer {
 public:
  ApiServer(ServerConfig config, engine::EngineClient& engine,
            const tokenizer::Tokenizer& tokenizer, const tokenizer::ChatTemplate& chat_template);
  ~ApiServer();

  // Listens on `socket` (bound to config().host and port before the engine was built) and
  // serves until stop(); false when it cannot listen.
  bool listen(BoundSocket socket);
  // Graceful: stop accepting, let requests run for drain_timeout, then cut the rest (streams
  // get an error event and [DONE]; others a 503) and return once they are written.
  void stop();

  const ServerConfig& config() const { return config_; }

 private:
  friend class GenerateSession;
  void handle(std::shared_ptr<HttpExchange> exchange);
  void handle_generate(const std::shared_ptr<HttpExchange>& exchange, bool chat);
  // A generate request's prompts as token ids, and how a chat answer starts.
  struct GeneratePrompts {
    std::vector<std::vector<int32_t>> token_ids;
    std::vector<std::string> texts;  // each prompt as echo repeats it
    bool thinking = false;           // chat_template_kwargs asked for thinking
    std::string chat_role;           // the answer's role (--response-role, or continued)
    std::string chat_echo;           // what each chat choice starts with (echo)
  };
  // The steps of handle_generate; each returns the error to answer with, if any.
  // A text prompt too long in bytes alone for the context (unless the request truncates).
  std::optional<api::ApiError> check_prompt_bytes(size_t bytes,
                                                  const api::CommonRequestFields& fields) const;
  // tool_choice of a chat request: the parser that reads the model's tool calls ("" for none).
  std::optional<api::ApiError> read_tool_parser(const nlohmann::json& body,
                                                std::string* parser) const;
  // The chat's messages through the template, tokenized (and truncated if asked).
  std::optional<api::ApiError> read_chat_prompt(const nlohmann::json& body,
                                                const api::CommonRequestFields& fields,
                                                GeneratePrompts* prompts) const;
  // A completion's prompts (text, ids, or lists of either), tokenized.
  std::optional<api::ApiError> read_completion_prompts(const nlohmann::json& body,
                                                       const api::CommonRequestFields& fields,
                                                       GeneratePrompts* prompts) const;
  // Every prompt's ids in the vocabulary and within the context; each one's max_tokens.
  std::optional<api::ApiError> resolve_prompt_limits(const GeneratePrompts& prompts,
                                                     const api::CommonRequestFields& fields,
                                                     api::Endpoint endpoint,
                                                     std::vector<int32_t>* max_tokens) const;
  HttpResponse handle_tokenize(const HttpRequest& request) const;
  // The request's messages through the server's template, or through the request's own
  // `chat_template` (top level or in chat_template_kwargs) when the server trusts those.
  common::Result<std::string> render_chat(const nlohmann::json& body,
                                          const tokenizer::ChatRenderOptions& options) const;
  HttpResponse handle_detokenize(const HttpRequest& request) const;
  HttpResponse models_response() const;
  bool authorized(const HttpRequest& request) const;
  void track(const std::shared_ptr<GenerateSession>& session);
  void untrack(const GenerateSession* session);
  size_t live_sessions() const;

  ServerConfig config_;
  engine::EngineClient& engine_;
  const tokenizer::Tokenizer& tokenizer_;
  const tokenizer::ChatTemplate& chat_template_;
  const int64_t created_;
  std::unique_ptr<WorkerPool> workers_;
  std::unique_ptr<HttpServer> http_;
  std::atomic<uint64_t> next_engine_id_{0};
  std::atomic<bool> stopping_{false};
  // Completions and chats whose handling has not ended (--enable-server-load-tracking); shared
  // with the exchanges that count in it, which may outlive a stop.
  std::shared_ptr<std::atomic<int64_t>> server_load_ = std::make_shared<std::atomic<int64_t>>(0);
  // vLLM's per-parent-request histograms (n, most tokens of a prompt's choices); shared with
  // the sessions, which may end after the server.
  std::shared_ptr<ParentRequestMetrics> parent_metrics_;
  mutable std::mutex sessions_mu_;
  std::unordered_map<const GenerateSession*, std::weak_ptr<GenerateSession>> sessions_;
};

}  // namespace server
