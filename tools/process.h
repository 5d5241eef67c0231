// Child processes for the launcher and the tests: a binary run with its
// stdout and stderr in a log file, killed (SIGKILL) on destruction if it
// still runs, and sent SIGTERM by the kernel when the thread that started
// it exits (PR_SET_PDEATHSIG), so that a launcher killed with SIGKILL
// leaves nothing behind: start processes from a thread that outlives them.
// Not thread-safe.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "schema/status.h"

namespace tether {

class Process {
 public:
  // Starts `argv` (argv[0] is the binary's path); output goes to `log`.
  static Result<std::unique_ptr<Process>> Start(std::vector<std::string> argv,
                                                std::string log);
  ~Process();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_; }
  std::string Log() const;

  // Waits until a log line contains `needle`; returns that line. kTimeout,
  // or kUnavailable when the process exits first.
  Result<std::string> WaitForLine(const std::string& needle, int timeout_ms);
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

// The address in a "... listening on HOST:PORT" log line.
std::string AddressFromLine(const std::string& line);
// The last `lines` lines of `text`.
std::string Tail(const std::string& text, int lines);

}  // namespace tether
