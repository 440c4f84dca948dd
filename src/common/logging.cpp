// Logger implementation: level filter from the environment, timestamped single-line writes.
#include "common/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace common {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("CHUNKPIPE_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  std::string v(env);
  if (v == "DEBUG") return LogLevel::kDebug;
  if (v == "WARNING") return LogLevel::kWarning;
  if (v == "ERROR") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<LogLevel>& level_storage() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "INFO";
}

std::string& prefix_storage() {
  static std::string prefix;  // set once at process start, before other threads log
  return prefix;
}

}  // namespace

void set_log_prefix(const std::string& prefix) {
  prefix_storage() = prefix;
}

LogLevel min_log_level() {
  return level_storage().load(std::memory_order_relaxed);
}
void set_min_log_level(LogLevel level) {
  level_storage().store(level);
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%m-%d %H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  if (!prefix_storage().empty()) stream_ << prefix_storage() << " ";
  stream_ << level_name(level_) << " " << stamp << " [" << (base ? base + 1 : file) << ":" << line
          << "] ";
}

LogMessage::~LogMessage() {
  stream_ << "\n";
  std::string s = stream_.str();
  std::fwrite(s.data(), 1, s.size(), stderr);
}

}  // namespace common
