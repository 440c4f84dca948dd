// fork/exec with PR_SET_PDEATHSIG, and waitpid-based exit checks.
#include "dist/process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

namespace dist {

common::Result<pid_t> spawn_process(const std::string& binary, const std::vector<std::string>& args,
                                    const std::vector<int>& inherit_fds, bool own_process_group) {
  std::vector<std::string> argv_storage;
  argv_storage.push_back(binary);
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return common::invalid_argument(std::string("fork failed: ") + strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls until exec: the parent may have other threads.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the parent died before prctl took effect
    if (own_process_group) setpgid(0, 0);
    for (int fd : inherit_fds) {
      const int flags = fcntl(fd, F_GETFD);
      if (flags >= 0) fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC);
    }
    execv(argv[0], argv.data());
    const char msg[] = "chunkpipe: exec of a worker process failed\n";
    if (write(2, msg, sizeof(msg) - 1) < 0) _exit(127);
    _exit(127);
  }
  if (own_process_group) setpgid(pid, pid);  // either side may run first; both set the same
  return pid;
}

std::optional<std::string> reap_if_exited(pid_t pid) {
  int status = 0;
  const pid_t r = waitpid(pid, &status, WNOHANG);
  if (r == 0) return std::nullopt;
  if (r < 0) return std::string("is gone (") + strerror(errno) + ")";
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return std::string("stopped");
}

std::string self_binary() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "/proc/self/exe";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace dist
