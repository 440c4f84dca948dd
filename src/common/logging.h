// LOG(INFO) << "...": one line per message on stderr in vLLM's shape
// `INFO 11-30 01:15:24 [file.cpp:123] message`. Thread-safe: each line is written with one call.
#pragma once

#include <sstream>
#include <string>

namespace common {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

// Messages below this level are dropped. Default kInfo;
// CHUNKPIPE_LOG_LEVEL=DEBUG|INFO|WARNING|ERROR.
LogLevel min_log_level();
void set_min_log_level(LogLevel level);
// Text put before every line of this process, e.g. "(PP1 pid=1234)" as vLLM marks its worker
// processes. Call once at start-up, before other threads log.
void set_log_prefix(const std::string& prefix);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  template <typename T>
  LogMessage& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace common

#define CP_LOG_LEVEL_DEBUG ::common::LogLevel::kDebug
#define CP_LOG_LEVEL_INFO ::common::LogLevel::kInfo
#define CP_LOG_LEVEL_WARNING ::common::LogLevel::kWarning
#define CP_LOG_LEVEL_ERROR ::common::LogLevel::kError
namespace common {
// Lets `LOG(x) << msg` be an expression of type void (safe inside an unbraced if).
struct LogVoidify {
  void operator&(LogMessage&) {}
};
}  // namespace common

#define LOG(level)                                   \
  (CP_LOG_LEVEL_##level < ::common::min_log_level()) \
      ? (void)0                                      \
      : ::common::LogVoidify() & ::common::LogMessage(CP_LOG_LEVEL_##level, __FILE__, __LINE__)
