// Child processes for the launcher and the tests: a binary run with its
// stdout and stderr in a log file, killed (SIGKILL) on destruction if it
// still runs. Started with posix_spawn, so that a threaded parent runs
// nothing between fork and exec. A tether program started here dies with
// the thread that started it (schema/launcher.h: it is sent SIGTERM), so
// that a launcher killed with SIGKILL leaves nothing behind: start
// processes from a thread that outlives them.
// Not thread-safe.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schema/status.h"

namespace tether {

// What a tether-server started with --ready-file PATH writes to PATH once it
// listens (README, "tether-server flags").
struct ShardReady {
  int shard_id = 0;
  std::string listen;     // HOST:PORT it is bound to, its port picked
  std::string advertise;  // HOST:PORT workers dial (--advertise, or listen)
  std::string dashboard;  // "http(s)://HOST:PORT/"; empty without one
  pid_t pid = 0;
};

// Parses a ready file's text. kInvalidArgument saying what is wrong.
Result<ShardReady> ParseShardReady(std::string_view text);

class Process {
 public:
  // Starts `argv` (argv[0] is the binary's path); output goes to `log`,
  // created or truncated. kIoError naming the log or the binary when it
  // cannot be created or started (a missing binary, for one).
  static Result<std::unique_ptr<Process>> Start(std::vector<std::string> argv,
                                                std::string log);
  ~Process();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_; }
  std::string Log() const;

  // Waits until a log line contains `needle`; returns that line. kTimeout,
  // or kUnavailable when the process exits first.
  Result<std::string> WaitForLine(const std::string& needle, int timeout_ms);
  // Waits until `find`, given the whole log, returns what it looks for;
  // returns that. kTimeout, or kUnavailable when the process exits first,
  // each naming `what` (as in "no `what` in log") and the log's tail.
  using LogMatcher =
      std::function<std::optional<std::string>(const std::string& log)>;
  Result<std::string> WaitForLog(const std::string& what,
                                 const LogMatcher& find, int timeout_ms);
  // Waits until `path` holds this process's ready file (tether-server
  // --ready-file PATH: written whole, once it listens; one left by another
  // process is ignored). kTimeout, or kUnavailable when the process exits
  // first, each with the tail of the log; kInvalidArgument when the file
  // does not parse.
  Result<ShardReady> WaitForReady(const std::string& path, int timeout_ms);
  // Waits for exit: the exit status, or 128 + signal. kTimeout if running.
  Result<int> Wait(int timeout_ms);
  void Signal(int sig);
  bool Running();

 private:
  Process(pid_t pid, std::string log) : pid_(pid), log_(std::move(log)) {}
  pid_t pid_;
  std::string log_;
  bool exited_ = false;
  int exit_code_ = 0;
};

// The last `lines` lines of `text`.
std::string Tail(const std::string& text, int lines);

}  // namespace tether
