#include "tools/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace tether {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Result<std::unique_ptr<Process>> Process::Start(std::vector<std::string> argv,
                                                std::string log) {
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status(Code::kIoError, "cannot create " + log);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    return Status(Code::kIoError, "fork failed");
  }
  if (pid == 0) {
    // The child dies with its parent (tether-up killed with SIGKILL must
    // not leave shards holding their data dirs): SIGTERM, so a shard still
    // stops cleanly. The parent may already be gone.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fd);
  return std::unique_ptr<Process>(new Process(pid, std::move(log)));
}

Process::~Process() {
  if (Running()) {
    kill(pid_, SIGKILL);
    (void)Wait(10000);
  }
}

std::string Process::Log() const { return ReadFile(log_); }

bool Process::Running() {
  if (exited_) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    exit_code_ =
        WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

Result<int> Process::Wait(int timeout_ms) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return Status(Code::kTimeout,
                    "process " + std::to_string(pid_) + " still running");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

void Process::Signal(int sig) {
  if (Running()) kill(pid_, sig);
}

Result<std::string> Process::WaitForLine(const std::string& needle,
                                         int timeout_ms) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    std::string log = Log();
    if (auto at = log.find(needle); at != std::string::npos) {
      auto begin = log.rfind('\n', at);
      begin = begin == std::string::npos ? 0 : begin + 1;
      auto end = log.find('\n', at);
      return log.substr(
          begin, end == std::string::npos ? std::string::npos : end - begin);
    }
    if (!Running()) {
      return Unavailable("process exited (" + std::to_string(exit_code_) +
                         ") before logging '" + needle + "':\n" +
                         Tail(log, 20));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Status(Code::kTimeout,
                    "no '" + needle + "' in log:\n" + Tail(log, 20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string AddressFromLine(const std::string& line) {
  const std::string marker = "listening on ";
  auto at = line.find(marker);
  if (at == std::string::npos) return "";
  std::string rest = line.substr(at + marker.size());
  auto space = rest.find_first_of(" \n");
  return rest.substr(0, space);
}

std::string Tail(const std::string& text, int lines) {
  size_t at = text.size();
  for (int i = 0; i <= lines && at != std::string::npos && at > 0; ++i) {
    at = text.rfind('\n', at - 1);
  }
  return at == std::string::npos ? text : text.substr(at + 1);
}

}  // namespace tether
