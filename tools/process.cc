#include "tools/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "schema/launcher.h"

extern char** environ;

namespace tether {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// posix_spawn's attributes and file actions, destroyed with the scope.
struct SpawnSetup {
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
};

// This process's environment, with kLauncherPidEnv set to this pid.
std::vector<std::string> ChildEnvironment() {
  const std::string key = std::string(kLauncherPidEnv) + "=";
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, key.c_str(), key.size()) != 0) env.emplace_back(*e);
  }
  env.push_back(key + std::to_string(getpid()));
  return env;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace

Result<std::unique_ptr<Process>> Process::Start(std::vector<std::string> argv,
                                                std::string log) {
  if (argv.empty()) return InvalidArgument("Process::Start: no program");
  // O_CLOEXEC: a child started at the same time by another thread must not
  // keep this log open.
  const int fd =
      open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status(Code::kIoError,
                  "cannot create " + log + ": " + std::strerror(errno));
  }
  std::vector<std::string> env = ChildEnvironment();
  std::vector<char*> args = Pointers(argv);
  std::vector<char*> envp = Pointers(env);
  SpawnSetup setup;
  posix_spawn_file_actions_adddup2(&setup.actions, fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&setup.actions, fd, STDERR_FILENO);
  // The calling thread may block signals the child must get (SIGTERM).
  // Ignored signals stay ignored, as across fork and exec: `nohup` reaches
  // the children too.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&setup.attr, &none);
  posix_spawnattr_setflags(&setup.attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  const int error = posix_spawn(&pid, args[0], &setup.actions, &setup.attr,
                                args.data(), envp.data());
  close(fd);
  if (error != 0) {
    return Status(Code::kIoError,
                  "cannot start " + argv[0] + ": " + std::strerror(error));
  }
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
  return WaitForLog(
      "'" + needle + "'",
      [&](const std::string& log) -> std::optional<std::string> {
        const auto at = log.find(needle);
        if (at == std::string::npos) return std::nullopt;
        auto begin = log.rfind('\n', at);
        begin = begin == std::string::npos ? 0 : begin + 1;
        const auto end = log.find('\n', at);
        return log.substr(
            begin, end == std::string::npos ? std::string::npos : end - begin);
      },
      timeout_ms);
}

Result<std::string> Process::WaitForLog(const std::string& what,
                                        const LogMatcher& find,
                                        int timeout_ms) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    std::string log = Log();
    if (std::optional<std::string> found = find(log)) return *std::move(found);
    if (!Running()) {
      return Unavailable("process exited (" + std::to_string(exit_code_) +
                         ") before logging " + what + " in " + log_ + ":\n" +
                         Tail(log, 20));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Status(Code::kTimeout,
                    "no " + what + " in " + log_ + ":\n" + Tail(log, 20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Result<ShardReady> Process::WaitForReady(const std::string& path,
                                         int timeout_ms) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string other;  // what else was there: a file left by an earlier run
  while (true) {
    // Written by rename: there whole, or not at all.
    if (std::ifstream in(path); in) {
      std::stringstream text;
      text << in.rdbuf();
      auto ready = ParseShardReady(text.str());
      if (ready.ok() && ready->pid == pid_) return ready;
      other = ready.ok() ? "pid " + std::to_string(ready->pid) + "'s"
                         : ready.status().message();
    }
    if (!Running()) {
      return Unavailable("process exited (" + std::to_string(exit_code_) +
                         ") before writing " + path + "; last lines of " +
                         log_ + ":\n" + Tail(Log(), 20));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Status(Code::kTimeout,
                    "no " + path +
                        (other.empty() ? "" : " (only " + other + ")") +
                        " after " + std::to_string(timeout_ms) +
                        " ms; last lines of " + log_ + ":\n" + Tail(Log(), 20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Result<ShardReady> ParseShardReady(std::string_view text) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(text, ec);
  if (ec) return InvalidArgument("not JSON: " + ec.message());
  const boost::json::object* o = v.if_object();
  if (o == nullptr) return InvalidArgument("not a JSON object");
  auto text_of = [&](const char* key) -> const boost::json::string* {
    const boost::json::value* f = o->if_contains(key);
    return f == nullptr ? nullptr : f->if_string();
  };
  auto number_of = [&](const char* key) -> const int64_t* {
    const boost::json::value* f = o->if_contains(key);
    return f == nullptr ? nullptr : f->if_int64();
  };
  const boost::json::string* listen = text_of("listen");
  const boost::json::string* advertise = text_of("advertise");
  const int64_t* shard_id = number_of("shard_id");
  const int64_t* pid = number_of("pid");
  const boost::json::value* dashboard = o->if_contains("dashboard");
  if (listen == nullptr || advertise == nullptr || shard_id == nullptr ||
      pid == nullptr || dashboard == nullptr ||
      !(dashboard->is_string() || dashboard->is_null())) {
    return InvalidArgument(
        "expected shard_id, listen, advertise, dashboard and pid");
  }
  ShardReady ready;
  ready.shard_id = static_cast<int>(*shard_id);
  ready.listen = std::string(*listen);
  ready.advertise = std::string(*advertise);
  if (dashboard->is_string()) {
    ready.dashboard = std::string(dashboard->get_string());
  }
  ready.pid = static_cast<pid_t>(*pid);
  return ready;
}

std::string Tail(const std::string& text, int lines) {
  size_t at = text.size();
  for (int i = 0; i <= lines && at != std::string::npos && at > 0; ++i) {
    at = text.rfind('\n', at - 1);
  }
  return at == std::string::npos ? text : text.substr(at + 1);
}

}  // namespace tether
