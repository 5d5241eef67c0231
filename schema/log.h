// Minimal leveled logging to stderr: one line per message, with a UTC
// timestamp and the process's tag. Thread-safe (each line is written with a
// single call). Normal endings (peer closed, operation aborted) should not
// be logged as errors by callers.
#pragma once

#include <sstream>
#include <string>

namespace tether {

enum class LogLevel { kDebug = 0, kInfo, kWarning, kError };

// Sets the process tag (e.g. "shard 1") and the lowest level printed.
// Call once at start, before other threads log.
void InitLogging(std::string tag, LogLevel min_level = LogLevel::kInfo);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const std::string& line);

namespace internal {
class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage() { LogLine(level_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace tether

#define TETHER_LOG(level)                                 \
  if (!::tether::LogEnabled(::tether::LogLevel::level)) { \
  } else                                                  \
    ::tether::internal::LogMessage(::tether::LogLevel::level).stream()
