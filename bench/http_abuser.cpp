// http_abuser: holds many hostile connections against a server on 127.0.0.1 for a while and
// measures /health meanwhile. One thread polls every abusive socket:
//   --idle N   keep-alive connections that sent one GET /health and then sit idle (reopened when
//              the server closes them);
//   --slow N   streaming completions read --read-bytes (64) every --read-interval-ms (500)
//              with a 4 KiB receive buffer (restarted when they end or are dropped).
// Another thread GETs /health every 20 ms on a fresh connection and prints p50 / p99 / max.
//   http_abuser PORT [--idle 2000] [--slow 500] [--seconds 60] [--api-key KEY] [--max-tokens 256]
//               [--read-bytes 64] [--read-interval-ms 500]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

int open_socket(int port, int rcvbuf, bool nonblocking) {
  const int fd = socket(AF_INET, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) return -1;
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

struct Peer {
  bool slow = false;
  int fd = -1;
  bool sent = false;
  Clock::time_point next_read;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: http_abuser PORT [--idle N] [--slow N] [--seconds S] [--api-key KEY] "
                 "[--max-tokens N]\n");
    return 2;
  }
  const int port = std::stoi(argv[1]);
  int idle = 2000, slow = 500, seconds = 60, max_tokens = 256, read_bytes = 64,
      read_interval_ms = 500;
  std::string key;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--idle")
      idle = std::stoi(v);
    else if (a == "--slow")
      slow = std::stoi(v);
    else if (a == "--seconds")
      seconds = std::stoi(v);
    else if (a == "--api-key")
      key = v;
    else if (a == "--max-tokens")
      max_tokens = std::stoi(v);
  }
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  setrlimit(RLIMIT_NOFILE, &nofile);

  const std::string health = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  const std::string body =
      "{\"prompt\": \"slow reader\", \"max_tokens\": " + std::to_string(max_tokens) +
      ", \"ignore_eos\": true, \"stream\": true}";
  const std::string stream_req =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
      (key.empty() ? std::string() : "Authorization: Bearer " + key + "\r\n") +
      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;

  std::atomic<bool> stop{false};
  std::vector<double> latencies_ms;
  int health_failures = 0;
  std::thread prober([&] {
    while (!stop) {
      const auto t0 = Clock::now();
      const int fd = open_socket(port, 0, false);
      bool ok = false;
      if (fd >= 0) {
        timeval tv{5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
          char buf[512];
          const ssize_t n = recv(fd, buf, sizeof(buf), 0);
          ok = n > 12 && std::string(buf, 12) == "HTTP/1.1 200";
        }
        close(fd);
      }
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (ok)
        latencies_ms.push_back(ms);
      else
        ++health_failures;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  std::vector<Peer> peers(static_cast<size_t>(idle + slow));
  for (size_t i = 0; i < peers.size(); ++i) peers[i].slow = static_cast<int>(i) >= idle;
  long reconnects = 0, slow_streams = 0, opened = 0;
  char buf[65536];
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  std::vector<pollfd> fds(peers.size());
  while (Clock::now() < end) {
    const auto now = Clock::now();
    for (size_t i = 0; i < peers.size(); ++i) {
      Peer& p = peers[i];
      if (p.fd < 0) {
        p.fd = open_socket(port, p.slow ? 4096 : 0, true);
        p.sent = false;
        if (p.fd >= 0) ++opened;
      }
      fds[i].fd = p.fd;
      fds[i].events =
          static_cast<short>((p.sent ? 0 : POLLOUT) | (!p.slow || now >= p.next_read ? POLLIN : 0));
      fds[i].revents = 0;
    }
    poll(fds.data(), fds.size(), 50);
    for (size_t i = 0; i < peers.size(); ++i) {
      Peer& p = peers[i];
      if (p.fd < 0) continue;
      const short ev = fds[i].revents;
      bool drop = (ev & (POLLERR | POLLNVAL)) != 0;
      if (!drop && !p.sent && (ev & POLLOUT)) {
        const std::string& req = p.slow ? stream_req : health;
        drop = send(p.fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size());
        p.sent = true;
        if (p.slow) ++slow_streams;
        p.next_read = Clock::now() + std::chrono::milliseconds(read_interval_ms);
      }
      if (!drop && (ev & (POLLIN | POLLHUP))) {
        const ssize_t n =
            recv(p.fd, buf, p.slow ? static_cast<size_t>(read_bytes) : sizeof(buf), 0);
        if (n <= 0) drop = true;
        // A finished stream ends with the chunked terminator: start another.
        if (n > 0 && p.slow && std::string(buf, n).find("\r\n0\r\n\r\n") != std::string::npos)
          drop = true;
        p.next_read = Clock::now() + std::chrono::milliseconds(read_interval_ms);
      }
      if (drop) {
        close(p.fd);
        p.fd = -1;
        ++reconnects;
      }
    }
  }
  stop = true;
  prober.join();
  for (Peer& p : peers) {
    if (p.fd >= 0) close(p.fd);
  }
  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto pct = [&](double q) {
    return latencies_ms.empty()
               ? -1.0
               : latencies_ms[std::min(latencies_ms.size() - 1,
                                       static_cast<size_t>(q * latencies_ms.size()))];
  };
  std::printf(
      "abuse: %d idle + %d slow-reader connections for %d s: %ld opened, %ld reopened, "
      "%ld slow streams started\n",
      idle, slow, seconds, opened, reconnects, slow_streams);
  std::printf("/health: %zu probes ok, %d failed; latency p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
              latencies_ms.size(), health_failures, pct(0.5), pct(0.99),
              latencies_ms.empty() ? -1.0 : latencies_ms.back());
  return 0;
}
