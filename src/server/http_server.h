// HttpServer: the event-driven HTTP/1.1 transport (Boost.Beast over Asio). A few I/O threads
// serve every connection, so idle, slow or stalled clients cost no thread. Owns timeouts, body
// and header limits, keep-alive and pipelining, chunked streaming with a bounded buffer per
// response, disconnect detection and draining. Knows nothing of OpenAI: each request goes to the
// handler as an HttpExchange, which may be answered later from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace server {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query string
  std::string target;
  unsigned version = 11;  // 10 or 11
  HttpHeaders headers;
  std::string body;
  // The first value of a header (case-insensitive name), or "".
  std::string header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;
};

// One request and its response. Thread-safe: respond / stream from any thread. Never blocks:
// output is queued and written by the connection's I/O thread.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequest& request() const = 0;
  // A whole response. Ignored once something was sent or the exchange is closed.
  virtual void respond(HttpResponse response) = 0;
  // Starts a streamed response (chunked for HTTP/1.1; plain bytes then close for HTTP/1.0).
  virtual void start_stream(int status, std::string content_type, HttpHeaders headers) = 0;
  // Queues bytes of the stream. False when the exchange is closed: the client went away, the
  // server cut it, or this write would exceed the stream buffer limit (the client reads too
  // slowly), in which case the connection is dropped.
  virtual bool send(std::string data) = 0;
  virtual void end_stream() = 0;
  // Runs once, on an I/O thread, if the exchange closes before its response was fully written
  // (the client vanished, fell behind, or the server stopped). Runs soon if already closed.
  virtual void on_close(std::function<void()> fn) = 0;
  virtual bool closed() const = 0;
};

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;
  int io_threads = 2;
  size_t max_body_bytes = 32 << 20;                    // every body encoding, chunked included
  size_t max_header_bytes = 64 << 10;                  // request line + header fields
  size_t max_stream_buffer_bytes = 4 << 20;            // queued, unwritten bytes of one response
  std::chrono::milliseconds header_timeout{30000};     // a request's header must arrive within
  std::chrono::milliseconds body_timeout{60000};       // and its body within
  std::chrono::milliseconds keep_alive_timeout{5000};  // idle time between requests
  std::chrono::milliseconds write_timeout{60000};      // one write's progress
  // Builds the body of a transport-level error (malformed request, body too large).
  std::function<HttpResponse(int status, const std::string& message)> error_response;
  // Headers added to every response to a request, whole or streamed (CORS). Optional.
  std::function<HttpHeaders(const HttpRequest&)> response_headers;
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

// A TCP socket bound to host:port and not yet listening: the port is held from here on, and a
// taken port fails at once. vLLM binds before it builds the engine, so a port conflict is
// reported in seconds rather than after the model has loaded. Move-only; closes its descriptor
// unless an HttpServer took it. The descriptor is close-on-exec: spawned ranks do not hold it.
class BoundSocket {
 public:
  static common::Result<BoundSocket> bind(const std::string& host, int port);
  BoundSocket(BoundSocket&& other) noexcept;
  BoundSocket& operator=(BoundSocket&& other) noexcept;
  BoundSocket(const BoundSocket&) = delete;
  BoundSocket& operator=(const BoundSocket&) = delete;
  ~BoundSocket();

  int port() const { return port_; }  // the bound port (the kernel's pick for port 0)

 private:
  friend class HttpServer;
  BoundSocket(int fd, bool v6, int port) : fd_(fd), v6_(v6), port_(port) {}
  int fd_ = -1;
  bool v6_ = false;
  int port_ = 0;
};

class HttpServer {
 public:
  // The handler runs on an I/O thread and must not block: long work goes elsewhere.
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  common::Status bind();  // binds options.host:options.port and listens (backlog SOMAXCONN)
  common::Status listen(BoundSocket socket);  // listens on a socket bound earlier
  void run();  // serves on io_threads threads until stop(); returns after they exit
  // Draining: refuses new connections, closes idle keep-alive ones, and closes each busy one
  // once its response is written. Thread-safe.
  void stop_accepting();
  // Closes every connection (open exchanges are closed) and makes run() return. Thread-safe.
  void stop();
  size_t open_connections() const;
  size_t open_exchanges() const;

  struct Impl;  // opaque: Asio stays inside http_server.cpp

 private:
  std::unique_ptr<Impl> impl_;
};

// Raises this process's soft limit on open descriptors to its hard limit, as vLLM's API server
// does at start: every connection holds one, and a proxy's request three (client, prefiller,
// decoder), so a soft limit of 1024 would refuse a few hundred concurrent clients. An error
// names the limit: the caller warns and goes on.
common::Status raise_open_file_limit();

}  // namespace server
