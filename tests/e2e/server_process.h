// Test helper: runs `chunkpipe serve` (or any chunkpipe command) as a child process on
// 127.0.0.1 with a free port, waits for /health, and stops it with SIGTERM.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace e2e {

// How many times slower the instrumented builds serve: limits that wait on generation scale by
// it (under TSan on a 2-core Zen 5 a 900-token request took over 120 s, and an 8-token one
// through the PD proxy beside two streams over a second).
constexpr int sanitizer_slowdown() {
#if defined(__SANITIZE_THREAD__)
  return 10;
#elif defined(__SANITIZE_ADDRESS__)
  return 3;
#else
  return 1;
#endif
}

// A port the kernel just handed out on 127.0.0.1 (bound to port 0, then closed).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Runs a chunkpipe command to completion; returns its exit code.
inline int run_chunkpipe(const std::vector<std::string>& args) {
  std::string cmd = std::string(CHUNKPIPE_BINARY);
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " > /dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// While alive, the servers this process starts begin with `soft` as their soft limit on open
// descriptors (set in the child before exec), as on a machine whose default is 1024 or less.
class ChildFileLimit {
 public:
  explicit ChildFileLimit(rlim_t soft) { value() = soft; }
  ~ChildFileLimit() { value() = 0; }
  ChildFileLimit(const ChildFileLimit&) = delete;
  ChildFileLimit& operator=(const ChildFileLimit&) = delete;
  static rlim_t& value() {  // 0: inherit this process's limit
    static rlim_t soft = 0;
    return soft;
  }
};

class ServerProcess {
 public:
  // Starts `chunkpipe serve MODEL --host 127.0.0.1 --port P <extra>`; log goes to log_path.
  ServerProcess(const std::string& model, const std::vector<std::string>& extra,
                const std::string& log_path)
      : port_(free_port()) {
    std::vector<std::string> args = {"serve",     model,    "--host",
                                     "127.0.0.1", "--port", std::to_string(port_)};
    args.insert(args.end(), extra.begin(), extra.end());
    start(args, log_path, "/health");
  }
  // Starts `chunkpipe <command...> --host 127.0.0.1 --port P` (e.g. {"proxy", ...}); ready
  // once GET health_path answers 200.
  ServerProcess(const std::vector<std::string>& command, const std::string& log_path,
                const std::string& health_path)
      : port_(free_port()) {
    std::vector<std::string> args = command;
    args.insert(args.end(), {"--host", "127.0.0.1", "--port", std::to_string(port_)});
    start(args, log_path, health_path);
  }

 private:
  void start(std::vector<std::string> args, const std::string& log_path,
             const std::string& health_path) {
    args.insert(args.begin(), CHUNKPIPE_BINARY);
    const rlim_t soft_file_limit = ChildFileLimit::value();
    pid_ = fork();
    if (pid_ == 0) {
      FILE* log = std::freopen(log_path.c_str(), "w", stderr);
      (void)log;
      if (rlimit nofile{}; soft_file_limit > 0 && getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
        nofile.rlim_cur = std::min(soft_file_limit, nofile.rlim_max);
        setrlimit(RLIMIT_NOFILE, &nofile);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    httplib::Client c("127.0.0.1", port_);
    // Up to 120 s: four rank processes under TSan on two busy cores start slowly.
    for (int i = 0; i < 1200 && !ready_; ++i) {
      auto r = c.Get(health_path);
      ready_ = r && r->status == 200;
      if (!ready_) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      int status;
      if (!ready_ && waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        pid_ = -1;
        break;
      }
    }
    if (!ready_) {  // say why in the test's output: the end of the server's log
      std::ifstream in(log_path);
      const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::fprintf(
          stderr, "server on port %d not ready (%s); the end of %s:\n%s\n", port_,
          pid_ > 0 ? "still starting" : ("exit code " + std::to_string(exit_code_)).c_str(),
          log_path.c_str(), log.substr(log.size() > 4000 ? log.size() - 4000 : 0).c_str());
    }
  }

 public:
  ~ServerProcess() { stop(); }

  bool ready() const { return ready_; }
  int port() const { return port_; }
  httplib::Client client(int timeout_s = 120 * sanitizer_slowdown()) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(timeout_s, 0);
    c.set_write_timeout(timeout_s, 0);
    return c;
  }
  pid_t pid() const { return pid_; }
  // Waits up to timeout_s for the server to exit on its own; its exit code, or -2 if it runs.
  int wait_exit(double timeout_s) {
    for (int i = 0; i < timeout_s * 10 && pid_ > 0; ++i) {
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        pid_ = -1;
        return exit_code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return pid_ > 0 ? -2 : exit_code_;
  }
  // SIGTERM, then the exit code (-1 if it did not exit within 20 s).
  int stop() {
    if (pid_ <= 0) return exit_code_;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        pid_ = -1;
        return exit_code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    return -1;
  }

 private:
  int port_;
  pid_t pid_ = -1;
  bool ready_ = false;
  int exit_code_ = -1;
};

// The value of a labelled Prometheus sample `name{...} v` on /metrics; -1 when absent.
inline double metric(const ServerProcess& s, const std::string& name) {
  auto r = s.client().Get("/metrics");
  if (!r) return -1;
  size_t pos = r->body.find("\n" + name + "{");
  if (pos == std::string::npos) return -1;
  pos = r->body.find("} ", pos);
  return std::stod(r->body.substr(pos + 2));
}

// The sum of every labelled sample `name{...} v` on /metrics (one per data-parallel engine);
// -1 when there is none.
inline double metric_total(const ServerProcess& s, const std::string& name) {
  auto r = s.client().Get("/metrics");
  if (!r) return -1;
  double total = -1;
  for (size_t pos = 0; (pos = r->body.find("\n" + name + "{", pos)) != std::string::npos;) {
    pos = r->body.find("} ", pos);
    total = std::max(total, 0.0) + std::stod(r->body.substr(pos + 2));
  }
  return total;
}

// Process ids of `parent`'s children whose command line contains `needle`.
inline std::vector<pid_t> child_processes(pid_t parent, const std::string& needle) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream cmd(e.path() / "cmdline");
    std::string args((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    std::replace(args.begin(), args.end(), '\0', ' ');
    if (args.find(needle) != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

// A POST whose streamed answer is read on its own thread: chunks() counts what has arrived,
// and after join() body() holds all of it.
class BackgroundStream {
 public:
  BackgroundStream(const ServerProcess& server, const std::string& path, std::string body)
      : thread_([this, &server, path, body = std::move(body)] {
          auto c = server.client();
          httplib::Request req;
          req.method = "POST";
          req.path = path;
          req.body = body;
          req.set_header("Content-Type", "application/json");
          req.content_receiver = [this](const char* data, size_t n, uint64_t, uint64_t) {
            {
              std::lock_guard<std::mutex> lock(mu_);
              body_.append(data, n);
            }
            ++chunks_;
            return true;
          };
          c.send(req);
        }) {}
  ~BackgroundStream() { join(); }
  int chunks() const { return chunks_.load(); }
  // Waits up to timeout_ms for at least n chunks.
  bool wait_chunks(int n, int timeout_ms) const {
    for (int i = 0; i < timeout_ms / 20 && chunks_ < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return chunks_ >= n;
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  std::string body() const {
    std::lock_guard<std::mutex> lock(mu_);
    return body_;
  }

 private:
  mutable std::mutex mu_;
  std::string body_;
  std::atomic<int> chunks_{0};
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace e2e
