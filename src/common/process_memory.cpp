// Reads /proc/self/statm (resident pages) and getrusage (peak resident KiB).
#include "common/process_memory.h"

#include <sys/resource.h>
#include <unistd.h>
#include <cstdio>

namespace common {

int64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long long size_pages = 0, resident_pages = 0;
  const int read = std::fscanf(f, "%lld %lld", &size_pages, &resident_pages);
  std::fclose(f);
  if (read != 2) return 0;
  return static_cast<int64_t>(resident_pages) * sysconf(_SC_PAGESIZE);
}

int64_t peak_resident_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace common
