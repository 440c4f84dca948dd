// Test helper: a pids cgroup (cgroup v1's pids hierarchy, or v2's unified one) that caps how
// many threads a process may start, as a container's pids.max does. Needs root and a pids
// controller: ok() is false where there is none, and the test skips. The cgroup is removed on
// destruction, once the processes moved into it are gone.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace e2e {

class PidsLimit {
 public:
  explicit PidsLimit(const std::string& name) {
    namespace fs = std::filesystem;
    if (const fs::path v2 = "/sys/fs/cgroup/cgroup.subtree_control"; fs::exists(v2))
      write(v2, "+pids");  // v2: let child cgroups use the controller
    for (const char* base : {"/sys/fs/cgroup/pids", "/sys/fs/cgroup"}) {
      std::error_code ec;
      const fs::path dir = fs::path(base) / name;
      if (!fs::create_directory(dir, ec) && !fs::is_directory(dir, ec)) continue;
      if (fs::exists(dir / "pids.max", ec)) {
        dir_ = dir;
        return;
      }
      fs::remove(dir, ec);
    }
  }
  ~PidsLimit() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove(dir_, ec);
  }
  PidsLimit(const PidsLimit&) = delete;
  PidsLimit& operator=(const PidsLimit&) = delete;

  bool ok() const { return !dir_.empty(); }

  // Moves `pid` with all its threads into the cgroup, then lets it start `more` tasks.
  bool confine(pid_t pid, int more) {
    if (!ok() || !write(dir_ / "cgroup.procs", std::to_string(pid))) return false;
    std::ifstream in(dir_ / "pids.current");
    int current = 0;
    if (!(in >> current)) return false;
    return write(dir_ / "pids.max", std::to_string(current + more));
  }

 private:
  static bool write(const std::filesystem::path& file, const std::string& value) {
    std::ofstream out(file, std::ios::in | std::ios::out);  // an existing file only
    out << value;
    out.flush();
    return static_cast<bool>(out);
  }

  std::filesystem::path dir_;
};

}  // namespace e2e
