// HttpServer on Boost.Beast: one coroutine per connection on its own strand. A connection
// reads a request (header and body each under a deadline), hands it to the handler as an
// Exchange, then writes what the exchange queues while it watches the socket for the client
// leaving (EOF or reset closes the exchange, which lets the owner abort its work). Output is
// queued under the exchange's mutex and written by the strand, so producers never wait on a
// client; a response whose unwritten bytes pass the limit is dropped instead.
#include "server/http_server.h"

#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/logging.h"

namespace server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Strand = net::any_io_executor;  // a connection's sockets and timers run on its strand
using net::awaitable;
using namespace net::experimental::awaitable_operators;
constexpr auto kNoThrow = net::as_tuple(net::use_awaitable);
// Bytes of pipelined requests read (and kept) while a response is still being produced.
constexpr size_t kMaxReadAhead = 64 << 10;

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

class Connection;

// What the connection should write next, taken from an exchange in one go.
struct Work {
  bool closed = false;
  std::optional<HttpResponse> full;
  bool start_stream = false;
  int status = 200;
  std::string content_type;
  HttpHeaders headers;
  std::vector<std::string> data;  // one HTTP chunk each: a streamed SSE event is never split or
                                  // merged (clients such as the PD proxy parse chunk by chunk)
  bool end = false;
};

class Exchange final : public HttpExchange {
 public:
  Exchange(std::weak_ptr<Connection> connection, HttpRequest request, size_t buffer_limit)
      : connection_(std::move(connection)), request_(std::move(request)), limit_(buffer_limit) {}

  const HttpRequest& request() const override { return request_; }

  void respond(HttpResponse response) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || started_) return;
    started_ = true;
    full_ = std::move(response);
    notify_locked();
  }
  void start_stream(int status, std::string content_type, HttpHeaders headers) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || started_) return;
    started_ = streaming_ = header_pending_ = true;
    status_ = status;
    content_type_ = std::move(content_type);
    headers_ = std::move(headers);
    notify_locked();
  }
  bool send(std::string data) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || !streaming_ || ended_) return false;
    if (queued_bytes_ + data.size() > limit_) {
      LOG(WARNING) << "client of " << request_.path << " is " << queued_bytes_ + data.size()
                   << " bytes behind (limit " << limit_ << "): dropping the connection";
      closed_ = true;  // the connection sees it, closes the socket and runs on_close
      notify_locked();
      return false;
    }
    queued_bytes_ += data.size();
    queued_.push_back(std::move(data));
    notify_locked();
    return true;
  }
  void end_stream() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || !streaming_ || ended_) return;
    ended_ = true;
    notify_locked();
  }
  void on_close(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (complete_) return;
      if (!close_handled_) {
        on_close_ = std::move(fn);
        return;
      }
    }
    fn();
  }
  bool closed() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

  // Connection side, on its strand.
  Work take() {
    std::lock_guard<std::mutex> lock(mu_);
    notify_pending_ = false;
    Work w;
    w.closed = closed_;
    if (closed_) return w;
    w.full = std::move(full_);
    full_.reset();
    if (header_pending_) {
      header_pending_ = false;
      w.start_stream = true;
      w.status = status_;
      w.content_type = std::move(content_type_);
      w.headers = std::move(headers_);
    }
    w.data.swap(queued_);
    queued_bytes_ = 0;
    if (ended_ && !end_taken_) w.end = end_taken_ = true;
    return w;
  }
  void mark_complete() {
    std::lock_guard<std::mutex> lock(mu_);
    complete_ = true;
    on_close_ = nullptr;
  }
  // The exchange ends before its response was written: the client left or the server cut it.
  void close_by_transport() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      if (close_handled_ || complete_) return;
      close_handled_ = true;
      fn = std::move(on_close_);
    }
    if (fn) fn();
  }

 private:
  void notify_locked();

  const std::weak_ptr<Connection> connection_;
  const HttpRequest request_;
  const size_t limit_;
  mutable std::mutex mu_;
  bool notify_pending_ = false;
  bool closed_ = false, close_handled_ = false, complete_ = false;
  bool started_ = false, streaming_ = false, header_pending_ = false, ended_ = false,
       end_taken_ = false;
  std::optional<HttpResponse> full_;
  int status_ = 200;
  std::string content_type_;
  HttpHeaders headers_;
  std::vector<std::string> queued_;  // sends not yet taken by the connection
  size_t queued_bytes_ = 0;
  std::function<void()> on_close_;
};

}  // namespace

struct HttpServer::Impl {
  Impl(HttpServerOptions o, HttpHandler h)
      : options(std::move(o)), handler(std::move(h)), acceptor(net::make_strand(ioc)) {}

  awaitable<void> accept_loop();
  void add(const std::shared_ptr<Connection>& c);
  void remove(Connection* c);
  std::vector<std::shared_ptr<Connection>> connections();

  const HttpServerOptions options;
  const HttpHandler handler;
  net::io_context ioc;
  tcp::acceptor acceptor;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard;
  std::atomic<bool> draining{false};
  std::atomic<bool> stopped{false};
  std::atomic<size_t> open_exchanges{0};
  mutable std::mutex mu;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> conns;
};

namespace {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpServer::Impl& server, tcp::socket socket)
      : server_(server),
        strand_(socket.get_executor()),
        stream_(std::move(socket)),
        wake_(strand_) {}

  Strand strand() const { return strand_; }

  awaitable<void> run() {
    try {
      co_await serve();
    } catch (const std::exception& e) {
      LOG(ERROR) << "HTTP connection failed: " << e.what();
    }
    if (exchange_) exchange_->close_by_transport();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
    server_.remove(this);
  }

  // From any thread: wakes the writer (new output, or the exchange closed).
  void wake() {
    net::post(strand_, [self = shared_from_this()] { self->wake_.cancel(); });
  }
  // From any thread: closes the connection now (close_idle: only if waiting for a request).
  void close(bool only_if_idle) {
    net::post(strand_, [self = shared_from_this(), only_if_idle] {
      if (only_if_idle && !self->idle_) return;
      self->closing_ = true;
      beast::error_code ec;
      self->stream_.socket().close(ec);
      self->wake_.cancel();
    });
  }

 private:
  awaitable<void> serve() {
    const HttpServerOptions& o = server_.options;
    beast::flat_buffer buffer;
    for (bool first = true; !closing_ && !server_.draining; first = false) {
      http::request_parser<http::string_body> parser;
      parser.header_limit(static_cast<uint32_t>(o.max_header_bytes));
      parser.body_limit(o.max_body_bytes);
      if (buffer.size() == 0) {  // wait for the next request: an idle keep-alive connection
        idle_ = true;
        stream_.expires_after(first ? o.header_timeout : o.keep_alive_timeout);
        auto [ec, n] = co_await stream_.async_read_some(buffer.prepare(4096), kNoThrow);
        idle_ = false;
        if (ec) co_return;
        buffer.commit(n);
      }
      stream_.expires_after(o.header_timeout);
      auto [ec, n] = co_await http::async_read_header(stream_, buffer, parser, kNoThrow);
      if (ec) co_return co_await fail_request(ec);
      const auto& fields = parser.get();
      if (iequals(std::string(fields[http::field::expect]), "100-continue") && !parser.is_done()) {
        static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        auto [wec, wn] = co_await net::async_write(stream_, net::buffer(kContinue), kNoThrow);
        if (wec) co_return;
      }
      stream_.expires_after(o.body_timeout);
      std::tie(ec, n) = co_await http::async_read(stream_, buffer, parser, kNoThrow);
      if (ec) co_return co_await fail_request(ec);
      stream_.expires_never();

      auto message = parser.release();
      HttpRequest request;
      request.method = std::string(message.method_string());
      request.target = std::string(message.target());
      request.path = request.target.substr(0, request.target.find('?'));
      request.version = message.version();
      for (const auto& f : message) {
        request.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
      }
      request.body = std::move(message.body());
      keep_alive_ = message.keep_alive();
      version_ = message.version();

      exchange_ = std::make_shared<Exchange>(weak_from_this(), std::move(request),
                                             o.max_stream_buffer_bytes);
      ++server_.open_exchanges;
      try {
        server_.handler(exchange_);
      } catch (const std::exception& e) {
        LOG(ERROR) << "HTTP handler failed: " << e.what();
        exchange_->respond(o.error_response(500, "Internal Server Error"));
      }
      auto outcome = co_await (write_exchange() || watch_input(buffer));
      --server_.open_exchanges;
      const bool complete = outcome.index() == 0 && std::get<0>(outcome);
      if (!complete) {
        exchange_->close_by_transport();
        exchange_.reset();
        co_return;
      }
      exchange_.reset();
      if (!reuse_) co_return;
    }
  }

  // A request that could not be read: answer what can be answered, then close.
  awaitable<void> fail_request(beast::error_code ec) {
    int status = 0;
    std::string message;
    if (ec == http::error::body_limit) {
      status = 413, message = "Request body too large";
    } else if (ec == http::error::header_limit) {
      status = 431, message = "Request header fields too large";
    } else if (ec.category() == http::make_error_code(http::error::bad_method).category() &&
               ec != http::error::end_of_stream && ec != http::error::partial_message) {
      status = 400, message = "Invalid HTTP request: " + ec.message();
    }
    if (status == 0 || closing_) co_return;  // timeout, EOF or reset: nobody to answer
    HttpResponse r = server_.options.error_response(status, message);
    http::response<http::string_body> res{static_cast<http::status>(r.status), 11};
    res.set(http::field::content_type, r.content_type);
    res.keep_alive(false);
    res.body() = std::move(r.body);
    res.prepare_payload();
    stream_.expires_after(server_.options.write_timeout);
    co_await http::async_write(stream_, res, kNoThrow);
  }

  // Writes what the exchange produces until its response is complete (true) or it is closed.
  awaitable<bool> write_exchange() {
    const HttpServerOptions& o = server_.options;
    reuse_ = keep_alive_;
    bool chunked = false;
    for (;;) {
      Work w = exchange_->take();
      if (w.closed || closing_) co_return false;
      const HttpRequest& request = exchange_->request();
      if (w.full) {
        http::response<http::string_body> res{static_cast<http::status>(w.full->status), version_};
        res.set(http::field::content_type, w.full->content_type);
        for (const auto& [k, v] : w.full->headers) res.insert(k, v);
        if (o.response_headers) {
          for (const auto& [k, v] : o.response_headers(request)) res.insert(k, v);
        }
        reuse_ = reuse_ && !server_.draining;
        res.keep_alive(reuse_);
        res.body() = std::move(w.full->body);
        res.prepare_payload();
        stream_.expires_after(o.write_timeout);
        http::response_serializer<http::string_body> sr{res};
        // A response to HEAD is the GET response's header alone, Content-Length included.
        auto [ec, n] = request.method == "HEAD"
                           ? co_await http::async_write_header(stream_, sr, kNoThrow)
                           : co_await http::async_write(stream_, sr, kNoThrow);
        if (ec) co_return false;
        exchange_->mark_complete();
        co_return true;
      }
      const bool progress = w.start_stream || !w.data.empty() || w.end;
      if (w.start_stream) {
        http::response<http::empty_body> res{static_cast<http::status>(w.status), version_};
        res.set(http::field::content_type, w.content_type);
        for (const auto& [k, v] : w.headers) res.insert(k, v);
        if (o.response_headers) {
          for (const auto& [k, v] : o.response_headers(request)) res.insert(k, v);
        }
        chunked = version_ >= 11;  // an HTTP/1.0 client gets the bytes, then the close
        reuse_ = reuse_ && chunked;
        res.keep_alive(reuse_);
        if (chunked) res.chunked(true);
        http::response_serializer<http::empty_body> sr{res};
        stream_.expires_after(o.write_timeout);
        auto [ec, n] = co_await http::async_write_header(stream_, sr, kNoThrow);
        if (ec) co_return false;
      }
      for (const std::string& piece : w.data) {
        stream_.expires_after(o.write_timeout);
        auto [ec, n] = chunked ? co_await net::async_write(
                                     stream_, http::make_chunk(net::buffer(piece)), kNoThrow)
                               : co_await net::async_write(stream_, net::buffer(piece), kNoThrow);
        if (ec) co_return false;
      }
      if (w.end) {
        if (chunked) {
          stream_.expires_after(o.write_timeout);
          auto [ec, n] = co_await net::async_write(stream_, http::make_chunk_last(), kNoThrow);
          if (ec) co_return false;
        }
        stream_.expires_never();
        if (server_.draining) reuse_ = false;
        exchange_->mark_complete();
        co_return true;
      }
      if (progress) continue;
      stream_.expires_never();
      wake_.expires_at(net::steady_timer::time_point::max());
      co_await wake_.async_wait(kNoThrow);
      auto cs = co_await net::this_coro::cancellation_state;
      if (cs.cancelled() != net::cancellation_type::none) co_return false;
    }
  }

  // Reads ahead while the response is produced: pipelined bytes are kept for the next request;
  // EOF or an error means the client left (false).
  awaitable<bool> watch_input(beast::flat_buffer& buffer) {
    for (;;) {
      if (buffer.size() >= kMaxReadAhead) {
        net::steady_timer never(strand_, net::steady_timer::time_point::max());
        co_await never.async_wait(kNoThrow);
        co_return true;
      }
      auto [ec, n] = co_await stream_.socket().async_read_some(buffer.prepare(4096), kNoThrow);
      buffer.commit(n);
      if (ec == net::error::operation_aborted && !closing_) co_return true;
      if (ec) co_return false;
    }
  }

  HttpServer::Impl& server_;
  Strand strand_;
  beast::tcp_stream stream_;
  net::steady_timer wake_;
  std::shared_ptr<Exchange> exchange_;
  bool idle_ = false, closing_ = false, keep_alive_ = true, reuse_ = true;
  unsigned version_ = 11;
};

void Exchange::notify_locked() {
  if (notify_pending_) return;
  if (auto c = connection_.lock()) {
    notify_pending_ = true;
    c->wake();
  }
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return v;
  }
  return "";
}

void HttpServer::Impl::add(const std::shared_ptr<Connection>& c) {
  std::lock_guard<std::mutex> lock(mu);
  conns.emplace(c.get(), c);
}
void HttpServer::Impl::remove(Connection* c) {
  std::lock_guard<std::mutex> lock(mu);
  conns.erase(c);
}
std::vector<std::shared_ptr<Connection>> HttpServer::Impl::connections() {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<std::shared_ptr<Connection>> out;
  for (const auto& [p, w] : conns) {
    if (auto c = w.lock()) out.push_back(std::move(c));
  }
  return out;
}

awaitable<void> HttpServer::Impl::accept_loop() {
  // Failures are logged at most once a second, with how many there were since the last line.
  auto last_logged = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  int64_t unlogged_failures = 0;
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(net::make_strand(ioc), kNoThrow);
    if (!acceptor.is_open() || draining) co_return;
    if (ec) {
      // Out of descriptors (EMFILE) and the like: back off instead of spinning.
      ++unlogged_failures;
      if (const auto now = std::chrono::steady_clock::now();
          now - last_logged >= std::chrono::seconds(1)) {
        LOG(WARNING) << "accept failed " << unlogged_failures
                     << (unlogged_failures == 1 ? " time: " : " times: ") << ec.message();
        last_logged = now;
        unlogged_failures = 0;
      }
      net::steady_timer pause(acceptor.get_executor(), std::chrono::milliseconds(50));
      co_await pause.async_wait(kNoThrow);
      continue;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);  // SSE chunks are small: no Nagle delay
    auto c = std::make_shared<Connection>(*this, std::move(socket));
    add(c);
    net::co_spawn(
        c->strand(), [c]() -> awaitable<void> { co_await c->run(); }, net::detached);
  }
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}

HttpServer::~HttpServer() {
  stop();
}

common::Result<BoundSocket> BoundSocket::bind(const std::string& host, int port) {
  beast::error_code ec;
  const auto address = net::ip::make_address(host, ec);
  if (ec) return common::invalid_argument("invalid host address " + host);
  const std::string where = host + ":" + std::to_string(port);
  if (port < 0 || port > 65535) return common::invalid_argument("cannot listen on " + where);
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  // Plain POSIX here: Asio opens sockets without close-on-exec, and the engine's ranks are
  // spawned between this bind and the listen.
  const int fd = ::socket(endpoint.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return common::unavailable("cannot listen on " + where + ": " + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, endpoint.data(), static_cast<socklen_t>(endpoint.size())) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return common::unavailable("cannot listen on " + where + ": " + why);
  }
  tcp::endpoint bound;
  socklen_t len = static_cast<socklen_t>(bound.capacity());
  ::getsockname(fd, bound.data(), &len);
  return BoundSocket(fd, address.is_v6(), bound.port());
}

BoundSocket::BoundSocket(BoundSocket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), v6_(other.v6_), port_(other.port_) {}

BoundSocket& BoundSocket::operator=(BoundSocket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    v6_ = other.v6_;
    port_ = other.port_;
  }
  return *this;
}

BoundSocket::~BoundSocket() {
  if (fd_ >= 0) ::close(fd_);
}

common::Status HttpServer::bind() {
  CP_ASSIGN_OR_RETURN(BoundSocket socket,
                      BoundSocket::bind(impl_->options.host, impl_->options.port));
  return listen(std::move(socket));
}

common::Status HttpServer::listen(BoundSocket socket) {
  beast::error_code ec;
  auto& a = impl_->acceptor;
  a.assign(socket.v6_ ? tcp::v6() : tcp::v4(), socket.fd_, ec);
  if (!ec) socket.fd_ = -1;  // the acceptor owns it now
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return common::unavailable("cannot listen on " + impl_->options.host + ":" +
                               std::to_string(socket.port()) + ": " + ec.message());
  }
  return common::Status();
}

void HttpServer::run() {
  Impl& s = *impl_;
  if (s.stopped) return;
  s.guard.emplace(net::make_work_guard(s.ioc));
  net::co_spawn(s.acceptor.get_executor(), s.accept_loop(), net::detached);
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, s.options.io_threads); ++i) {
    threads.emplace_back([&s] { s.ioc.run(); });
  }
  s.ioc.run();
  for (auto& t : threads) t.join();
}

void HttpServer::stop_accepting() {
  Impl& s = *impl_;
  if (s.draining.exchange(true)) return;
  net::post(s.acceptor.get_executor(), [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
  });
  for (const auto& c : s.connections()) c->close(/*only_if_idle=*/true);
}

void HttpServer::stop() {
  Impl& s = *impl_;
  if (s.stopped.exchange(true)) return;
  s.draining = true;
  net::post(s.acceptor.get_executor(), [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
  });
  for (const auto& c : s.connections()) c->close(/*only_if_idle=*/false);
  net::post(s.ioc, [&s] { s.guard.reset(); });
}

size_t HttpServer::open_connections() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->conns.size();
}

size_t HttpServer::open_exchanges() const {
  return impl_->open_exchanges;
}

common::Status raise_open_file_limit() {
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) != 0)
    return common::Status(common::StatusCode::kInternal,
                          std::string("cannot read the open-file limit: ") + std::strerror(errno));
  if (nofile.rlim_cur >= nofile.rlim_max) return common::Status::ok_status();
  const rlim_t soft = nofile.rlim_cur;
  nofile.rlim_cur = nofile.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &nofile) != 0)
    return common::Status(common::StatusCode::kInternal,
                          "cannot raise the open-file limit from " + std::to_string(soft) + " to " +
                              std::to_string(nofile.rlim_max) + ": " + std::strerror(errno) +
                              "; raise it with ulimit -n");
  return common::Status::ok_status();
}

}  // namespace server
