// Test helper: a raw TCP client on 127.0.0.1 for what an HTTP library will not do: slow or
// stalled readers, partial headers, pipelining, bogus lengths, HTTP/1.0, vanishing mid-request.
// Every read has a deadline, so a test cannot hang on a server that stopped answering.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace e2e {

class RawConnection {
 public:
  // rcvbuf > 0 shrinks the receive buffer before connecting (a reader that falls behind fast).
  explicit RawConnection(int port, int rcvbuf = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  RawConnection(RawConnection&& o) noexcept : fd_(o.fd_), connected_(o.connected_) { o.fd_ = -1; }

  bool connected() const { return connected_; }
  bool send(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads what arrives within timeout_ms (stops early at EOF); appends to *out. False on EOF
  // or error, true when the deadline passed with the connection still open.
  bool read_for(int timeout_ms, std::string* out) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    char buf[65536];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) return true;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return false;
      out->append(buf, static_cast<size_t>(n));
    }
  }
  // Reads until the peer closes or `until` appears in the data, within timeout_ms.
  std::string read_until(const std::string& until, int timeout_ms, bool* closed = nullptr) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    bool open = true;
    while (open && (until.empty() || out.find(until) == std::string::npos) &&
           std::chrono::steady_clock::now() < deadline) {
      open = read_for(50, &out);
    }
    if (closed) *closed = !open;
    return out;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes with an RST instead of a FIN.
  void reset() {
    linger l{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close();
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

inline std::string http_post(const std::string& path, const std::string& body,
                             const std::string& extra_headers = "", const char* version = "1.1") {
  return "POST " + path + " HTTP/" + version + "\r\nHost: 127.0.0.1\r\n" +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + extra_headers + "\r\n" + body;
}

// The `data:` payloads of a server-sent-event body, in order, up to "[DONE]" (left out; *done
// says whether it came).
inline std::vector<std::string> sse_payloads(const std::string& body, bool* done = nullptr) {
  std::vector<std::string> out;
  if (done) *done = false;
  for (size_t pos = 0; (pos = body.find("data: ", pos)) != std::string::npos;) {
    const size_t end = body.find('\n', pos);
    std::string payload = body.substr(pos + 6, end == std::string::npos ? end : end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      if (done) *done = true;
      break;
    }
    out.push_back(std::move(payload));
  }
  return out;
}

}  // namespace e2e
