// ApiServer: the OpenAI-compatible HTTP front end (cpp-httplib, thread per connection) over an
// EngineCore: /v1/completions, /v1/chat/completions (SSE streaming), /v1/models, /health,
// /version, /tokenize, /detokenize, /metrics. Validation errors come back in vLLM's nested
// error JSON; the engine never sees an invalid request. listen() blocks; stop() is
// thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace server {

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
  int http_threads = 256;
  size_t max_body_bytes = 32 << 20;
};

class ApiServer {
 public:
  ApiServer(ServerConfig config, engine::EngineCore& engine, const tokenizer::Tokenizer& tokenizer,
            const tokenizer::ChatTemplate& chat_template);
  ~ApiServer();

  // Binds and serves until stop(); false when the address cannot be bound.
  bool listen();
  void stop();

 private:
  struct Session;
  void register_routes();
  bool check_api_key(const httplib::Request& req, httplib::Response& res) const;
  void handle_generate(const httplib::Request& req, httplib::Response& res, bool chat);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);

  ServerConfig config_;
  engine::EngineCore& engine_;
  const tokenizer::Tokenizer& tokenizer_;
  const tokenizer::ChatTemplate& chat_template_;
  std::unique_ptr<httplib::Server> http_;
  int64_t created_;
};

}  // namespace server
