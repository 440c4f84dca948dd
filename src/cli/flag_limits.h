// Upper bounds for integer flags that chunkpipe stores as int. Beyond them a value would wrap
// (--pipeline-parallel-size 99999999999 was read as 1215752191 stages) or ask for more threads
// than a process can start (--threads 99999999 ended in std::system_error). Constants only.
#pragma once

#include <cstdint>
#include <limits>

namespace cli {

constexpr int64_t kMaxIntFlag = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxRanks = 1024;    // pipeline stages, nodes, data-parallel ranks
constexpr int64_t kMaxThreads = 1024;  // threads per rank, or per HTTP pool
constexpr int64_t kMaxBlockSize = int64_t{1} << 16;

}  // namespace cli
