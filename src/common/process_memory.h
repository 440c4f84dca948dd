// The process's memory as the kernel counts it: resident bytes now (/proc/self/statm) and the
// peak so far (getrusage's ru_maxrss), for the startup log, /metrics and the benchmarks.
// Thread-safe; 0 where the figures cannot be read.
#pragma once

#include <cstdint>

namespace common {

int64_t resident_bytes();
int64_t peak_resident_bytes();

}  // namespace common
