#include "tests/cluster.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace tether::testing {
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
  pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    return Status(Code::kIoError, "fork failed");
  }
  if (pid == 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    std::vector<char*> args;
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

TempDir::TempDir() {
  char pattern[] = "/tmp/tether-test-XXXXXX";
  char* made = mkdtemp(pattern);
  path_ = made ? made : "/tmp";
}

TempDir::~TempDir() {
  if (::testing::Test::HasFailure()) {
    std::cerr << "test files kept in " << path_ << "\n";
    return;
  }
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
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

Result<int> RunToExit(const std::vector<std::string>& argv, std::string* output,
                      int timeout_ms) {
  char pattern[] = "/tmp/tether-run-XXXXXX";
  int fd = mkstemp(pattern);
  if (fd < 0) return Status(Code::kIoError, "mkstemp failed");
  close(fd);
  auto p = Process::Start(argv, pattern);
  if (!p.ok()) return p.status();
  auto code = (*p)->Wait(timeout_ms);
  *output = (*p)->Log();
  unlink(pattern);
  return code;
}

Result<std::unique_ptr<Cluster>> Cluster::Start(const ClusterOptions& o,
                                                const std::string& dir) {
  std::unique_ptr<Cluster> c(new Cluster());
  auto flags = [&](int id) {
    std::vector<std::string> argv = {TETHER_SERVER_BIN,
                                     "--shard-id",
                                     std::to_string(id),
                                     "--shards",
                                     std::to_string(o.shards),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--data-dir",
                                     dir + "/shard" + std::to_string(id)};
    if (id == 0) {
      std::vector<std::string> run = {"--workers",
                                      std::to_string(o.workers),
                                      "--seed",
                                      std::to_string(o.seed),
                                      "--max-staleness",
                                      std::to_string(o.max_staleness),
                                      "--reject-staleness",
                                      std::to_string(o.reject_staleness),
                                      "--block-size",
                                      std::to_string(o.block_size),
                                      "--optimizer",
                                      o.optimizer,
                                      "--lr",
                                      std::to_string(o.lr)};
      argv.insert(argv.end(), run.begin(), run.end());
      argv.insert(argv.end(), o.extra_flags.begin(), o.extra_flags.end());
    } else {
      argv.push_back("--coordinator");
      argv.push_back(c->coordinator_);
    }
    return argv;
  };
  for (int id = 0; id < o.shards; ++id) {
    auto p =
        Process::Start(flags(id), dir + "/shard" + std::to_string(id) + ".log");
    if (!p.ok()) return p.status();
    c->shards_.push_back(std::move(*p));
    auto line = c->shards_.back()->WaitForLine("listening on", 10000);
    if (!line.ok()) {
      return line.status().WithContext("shard " + std::to_string(id));
    }
    if (id == 0) c->coordinator_ = AddressFromLine(*line);
  }
  if (o.shards > 1) {
    // The coordinator logs each registration; wait for the last one.
    for (int id = 1; id < o.shards; ++id) {
      auto line = c->shards_[0]->WaitForLine(
          "shard " + std::to_string(id) + " registered", 10000);
      if (!line.ok()) return line.status();
    }
  }
  return c;
}

Cluster::~Cluster() {
  if (::testing::Test::HasFailure()) DumpLogs();
  for (auto& p : shards_) p->Signal(SIGTERM);
  for (auto& p : shards_) (void)p->Wait(5000);
}

void Cluster::DumpLogs() const {
  for (size_t i = 0; i < shards_.size(); ++i) {
    std::cerr << "--- shard " << i << " log (" << shards_[i]->log_path()
              << ") ---\n"
              << Tail(shards_[i]->Log(), 30);
  }
}

}  // namespace tether::testing
