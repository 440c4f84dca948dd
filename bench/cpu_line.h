// The line every benchmark prints first: the CPU model, its SIMD flags that matter here
// (AVX2, AVX-512 family, AVX-VNNI, AMX) and the core count, read from /proc/cpuinfo.
// Thread-safe (reads a file).
#pragma once

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

namespace bench {

inline void print_cpu_line() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model;
  std::set<std::string> flags;
  while (std::getline(in, line)) {
    if (model.empty() && line.rfind("model name", 0) == 0) model = line.substr(line.find(':') + 2);
    if (flags.empty() && line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;)
        if (w == "avx2" || w.rfind("avx512", 0) == 0 || w == "avx_vnni" || w.rfind("amx", 0) == 0)
          flags.insert(w);
    }
  }
  std::string f;
  for (const auto& w : flags) f += (f.empty() ? "" : " ") + w;
  std::printf("cpu: %s; flags: %s; cores: %u\n", model.c_str(), f.c_str(),
              std::thread::hardware_concurrency());
}

}  // namespace bench
