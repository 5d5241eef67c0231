#include "tests/support/cluster.h"

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
#include <regex>
#include <sstream>
#include <thread>

#include "schema/flags.h"

namespace tether::testing {

bool Eventually(const std::function<bool()>& check, int timeout_ms) {
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (check()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return check();
}

Result<int64_t> WaitForRoundComplete(Process& shard, int64_t at_least,
                                     int timeout_ms) {
  static const std::regex kComplete(R"(checkpoint round (\d+) complete)");
  TETHER_ASSIGN_OR_RETURN(
      std::string round,
      shard.WaitForLog(
          "complete checkpoint round >= " + std::to_string(at_least),
          [&](const std::string& log) -> std::optional<std::string> {
            for (auto it =
                     std::sregex_iterator(log.begin(), log.end(), kComplete);
                 it != std::sregex_iterator(); ++it) {
              if (std::stoll((*it)[1].str()) >= at_least) return (*it)[1].str();
            }
            return std::nullopt;
          },
          timeout_ms));
  return std::stoll(round);
}

int64_t ProcStatusKib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::stoll(line.substr(field.size() + 1));
    }
  }
  return -1;
}

bool CommandLineHas(pid_t pid, const std::vector<std::string>& args) {
  const std::string path = "/proc/" + std::to_string(pid) + "/cmdline";
  std::string text;
  // Empty while the process is between two programs (a worker started as
  // `env ... python3`, caught as env execs python3): read again then.
  Eventually(
      [&] {
        std::ifstream in(path);
        std::stringstream read;
        read << in.rdbuf();
        text = read.str();
        return !text.empty();
      },
      5000);
  std::string wanted(1, '\0');  // args start after an argument ends
  for (const std::string& a : args) wanted += a + '\0';
  return text.find(wanted) != std::string::npos;
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
                                     "--http",
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
                                      NumberText(o.lr)};
      if (o.run_flags) argv.insert(argv.end(), run.begin(), run.end());
      argv.insert(argv.end(), o.extra_flags.begin(), o.extra_flags.end());
    } else {
      argv.push_back("--coordinator");
      argv.push_back(c->coordinator_);
    }
    for (std::string flag : o.shard_flags) {
      if (size_t at = flag.find("{shard}"); at != std::string::npos) {
        flag.replace(at, 7, std::to_string(id));
      }
      argv.push_back(std::move(flag));
    }
    argv.push_back("--ready-file");
    argv.push_back(dir + "/shard" + std::to_string(id) + ".ready");
    return argv;
  };
  c->dir_ = dir;
  for (int id = 0; id < o.shards; ++id) {
    const std::string base = dir + "/shard" + std::to_string(id);
    c->argv_.push_back(flags(id));
    auto p = Process::Start(c->argv_.back(), base + ".log");
    if (!p.ok()) return p.status();
    c->shards_.push_back(std::move(*p));
    auto ready = c->shards_.back()->WaitForReady(base + ".ready", 10000);
    if (!ready.ok()) {
      return ready.status().WithContext("shard " + std::to_string(id));
    }
    c->addresses_.push_back(ready->advertise);
    if (id == 0) {
      c->coordinator_ = ready->advertise;
      // http://HOST:PORT/, or https:// with TLS
      const std::string& url = ready->dashboard;
      const size_t host = url.find("://");
      if (host == std::string::npos) {
        return Unavailable("shard 0 serves no dashboard (ready file: " + base +
                           ".ready)");
      }
      c->dashboard_ = url.substr(host + 3, url.find('/', host + 3) - host - 3);
    }
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

std::vector<std::unique_ptr<Process>> StartWorkers(
    const std::string& coordinator, int n, const std::string& dir,
    const std::vector<std::string>& flags) {
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv = {TETHER_WORKER_BIN, "--coordinator",
                                     coordinator,       "--rank",
                                     std::to_string(r), "--quiet"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto p = Process::Start(argv, dir + "/worker" + std::to_string(r) + ".log");
    EXPECT_TRUE(p.ok());
    if (p.ok()) workers.push_back(std::move(*p));
  }
  return workers;
}

Status Cluster::Restart(int id, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = argv_[id];
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--listen") argv[i + 1] = addresses_[id];
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  const std::string base = dir_ + "/shard" + std::to_string(id);
  std::filesystem::remove(base + ".ready");
  auto p = Process::Start(argv, base + "-again.log");
  if (!p.ok()) return p.status();
  shards_[id] = std::move(*p);
  auto ready = shards_[id]->WaitForReady(base + ".ready", 10000);
  if (!ready.ok()) {
    return ready.status().WithContext("shard " + std::to_string(id) +
                                      " restarted");
  }
  return Status::Ok();
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
