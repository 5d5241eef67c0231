// Test support: real tether processes on loopback.
//
// Process runs a binary with its stdout and stderr in a log file and kills
// it (SIGKILL) on destruction if it still runs. Cluster starts shard 0 on a
// free port, then the other shards pointed at it, and waits until each has
// written its --ready-file (DIR/shardN.ready), which says where it
// listens. A test that fails prints the tail of every log.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "schema/status.h"
#include "tests/support/temp_dir.h"
#include "tools/process.h"

namespace tether::testing {

using tether::Process;

// Built with ThreadSanitizer (the tsan preset): every process runs many
// times slower, so tests that slow workers down on purpose need not.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kUnderTsan = true;
#else
inline constexpr bool kUnderTsan = false;
#endif
#else
inline constexpr bool kUnderTsan = false;
#endif
// A launcher run's straggler (tether-up --slowdown): 3x slower, 2x under
// TSan, where every process is slow already (at 3x a three- or four-epoch
// run there took 155-180 s).
inline constexpr const char* kSlowdown = kUnderTsan ? "2" : "3";
using tether::Tail;

struct ClusterOptions {
  int shards = 1;
  int workers = 1;
  uint64_t seed = 1;
  int max_staleness = -1;
  int reject_staleness = -1;
  int block_size = 65536;
  std::string optimizer = "sgd";
  float lr = 0.1f;
  std::vector<std::string> extra_flags;  // given to shard 0
  // false: shard 0 gets none of the run-wide flags above, only extra_flags
  // (a resume that takes the run's settings from its round).
  bool run_flags = true;
  // Given to every shard, "{shard}" in each replaced by the shard's id.
  std::vector<std::string> shard_flags;
};

class Cluster {
 public:
  // Starts every shard; returns once all listen and are registered.
  static Result<std::unique_ptr<Cluster>> Start(const ClusterOptions& options,
                                                const std::string& dir);
  ~Cluster();

  const std::string& coordinator() const { return coordinator_; }
  // HOST:PORT of shard 0's dashboard.
  const std::string& dashboard() const { return dashboard_; }
  // HOST:PORT shard i listens on (shard 0's is coordinator()).
  const std::string& address(int i) const { return addresses_[i]; }
  Process& shard(int i) { return *shards_[i]; }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  // Prints the tail of every shard's log to stderr.
  void DumpLogs() const;
  // Starts shard `id` again (it was killed) as it was first started, on the
  // same address and data dir, with `extra` flags added; logs to
  // DIR/shardN-again.log. Returns once it listens (its ready file).
  Status Restart(int id, const std::vector<std::string>& extra);

 private:
  Cluster() = default;
  std::string dir_;
  std::vector<std::vector<std::string>> argv_;  // by shard, as started
  std::vector<std::unique_ptr<Process>> shards_;
  std::string coordinator_;
  std::string dashboard_;
  std::vector<std::string> addresses_;
};

// Starts `n` tether-worker processes with ranks 0..n-1, logging to
// DIR/workerR.log, with `flags` added.
std::vector<std::unique_ptr<Process>> StartWorkers(
    const std::string& coordinator, int n, const std::string& dir,
    const std::vector<std::string>& flags);

// Polls `check` every 100 ms for up to `timeout_ms`; true once it holds.
bool Eventually(const std::function<bool()>& check, int timeout_ms);

// Waits until `shard` logs a complete checkpoint round of at least
// `at_least` and returns the first such round. A round due while the one
// before it is still being written is skipped (by design), so a test that
// only needs "a round at or after N" waits with this, not for round N.
// kTimeout or kUnavailable (the shard exited) with the log's tail.
Result<int64_t> WaitForRoundComplete(Process& shard, int64_t at_least,
                                     int timeout_ms);

// A field of /proc/PID/status in KiB ("VmRSS", "VmPeak"), or -1.
int64_t ProcStatusKib(pid_t pid, const std::string& field);

// Whether process `pid`'s command line holds `args` as consecutive
// arguments (e.g. {"--wire-dtype", "bf16"}). A process caught between two
// programs (exec) has none for a moment: waits up to 5 s for one.
bool CommandLineHas(pid_t pid, const std::vector<std::string>& args);

// Runs `argv` to completion (at most `timeout_ms`); returns its exit code
// and fills `output` with what it printed.
Result<int> RunToExit(const std::vector<std::string>& argv, std::string* output,
                      int timeout_ms);

}  // namespace tether::testing
