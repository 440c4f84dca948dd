// Test helper: runs a shell command line and captures its exit code and output (stdout and
// stderr together).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace e2e {

struct CommandResult {
  int exit_code = -1;
  std::string out;
};

inline CommandResult run_shell(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  CommandResult r;
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace e2e
