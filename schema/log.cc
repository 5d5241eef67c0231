#include "schema/log.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>

namespace tether {
namespace {
std::string g_tag = "tether";
LogLevel g_min_level = LogLevel::kInfo;

const char* LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "D";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarning:
      return "W";
    case LogLevel::kError:
      return "E";
  }
  return "?";
}
}  // namespace

void InitLogging(std::string tag, LogLevel min_level) {
  g_tag = std::move(tag);
  g_min_level = min_level;
}

bool LogEnabled(LogLevel level) { return level >= g_min_level; }

void LogLine(LogLevel level, const std::string& line) {
  using std::chrono::system_clock;
  auto now = system_clock::now();
  std::time_t secs = system_clock::to_time_t(now);
  int ms =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                           now.time_since_epoch())
                           .count() %
                       1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
  std::string out = std::string(LevelLetter(level)) + " " + stamp + "." +
                    std::to_string(1000 + ms).substr(1) + " [" + g_tag + "] " +
                    line + "\n";
  // One write() keeps lines from different threads whole.
  (void)!write(STDERR_FILENO, out.data(), out.size());
}

}  // namespace tether
