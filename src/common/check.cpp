// Failure path of CHECK: prints the condition, location and message, then aborts.
#include "common/check.h"

#include <cstdio>
#include <cstdlib>

namespace common::internal {

CheckFailure::CheckFailure(const char* file, int line, const char* condition) {
  stream_ << "CHECK failed at " << file << ":" << line << ": " << condition << " ";
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "%s\n", stream_.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace common::internal
