// Checkpoints are never lost and never silently wrong, tried as a hostile
// operator would with real processes and real RocksDB directories: a lost
// CURRENT file, a shard started on another shard's or another run's data, a
// corrupted .sst, pruning across shards, and a coordinator that dies.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "server/checkpoint.h"
#include "tests/support/cluster.h"
#include "tests/support/raw_checkpoint_db.h"
#include "tests/support/worker_pool.h"

namespace tether::testing {
namespace {

namespace fs = std::filesystem;

// Every file under `dir`, by path relative to it, with its bytes.
std::map<std::string, std::string> Files(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    files[fs::relative(entry.path(), dir).string()] = bytes.str();
  }
  return files;
}

void CopyDir(const std::string& from, const std::string& to) {
  fs::copy(from, to, fs::copy_options::recursive);
}

ClusterOptions RunOptions(uint64_t seed = 21,
                          std::vector<std::string> extra = {}) {
  ClusterOptions o;
  o.shards = 2;
  o.workers = 1;
  o.seed = seed;
  o.optimizer = "adam";
  o.lr = 0.01f;
  o.block_size = 1000;
  o.extra_flags = {"--checkpoint-every", "20"};
  o.extra_flags.insert(o.extra_flags.end(), extra.begin(), extra.end());
  return o;
}

// A run of one tether-client worker for `iterations` clocks, with a round
// every 20 clocks, into DIR/shard0 and DIR/shard1; the shards stop cleanly
// once `settled` holds (it is polled). The worker sleeps 10 ms a clock, so
// each round is written before the next is due even on a loaded machine
// (a round due while one is written is skipped, and the test waits for the
// last).
void TrainAndStop(const std::string& dir, int iterations, uint64_t seed = 21,
                  std::vector<std::string> extra = {},
                  const std::function<bool()>& settled = nullptr) {
  fs::create_directories(dir);
  auto cluster = Cluster::Start(RunOptions(seed, std::move(extra)), dir);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  std::string out;
  auto code = RunToExit({TETHER_CLIENT_BIN, "train", "--coordinator",
                         (*cluster)->coordinator(), "--tensor", "w", "--shape",
                         "5000", "--iterations", std::to_string(iterations),
                         "--grad", "pattern", "--sleep-ms", "10", "--quiet"},
                        &out, 60000);
  ASSERT_TRUE(code.ok() && *code == 0) << out;
  const int last = iterations / 20 * 20;
  ASSERT_TRUE(
      (*cluster)
          ->shard(0)
          .WaitForLine("checkpoint round " + std::to_string(last) + " complete",
                       20000)
          .ok());
  if (settled) {
    EXPECT_TRUE(Eventually(settled, 10000));
  }
}

// Shard 0 and shard 1 of a two-shard run, resuming from `d0` and `d1`.
struct Resumed {
  std::unique_ptr<Process> shard0, shard1;
  int code0 = -1, code1 = -1;  // -1: still running (or never started)
  std::string log0, log1;
  std::string address0;  // shard 0's, from its ready file
};

// With `refused` the two are expected to exit; else shard 0 is expected to
// resume, and is left running.
Resumed ResumeFrom(const std::string& d0, const std::string& d1,
                   const std::string& resume, const std::string& logs,
                   bool refused = true) {
  Resumed r;
  auto p0 = Process::Start({TETHER_SERVER_BIN,
                            "--shard-id",
                            "0",
                            "--shards",
                            "2",
                            "--listen",
                            "127.0.0.1:0",
                            "--http",
                            "off",
                            "--workers",
                            "1",
                            "--seed",
                            "21",
                            "--optimizer",
                            "adam",
                            "--lr",
                            "0.01",
                            "--block-size",
                            "1000",
                            "--checkpoint-every",
                            "20",
                            "--data-dir",
                            d0,
                            "--resume",
                            resume,
                            "--ready-file",
                            logs + "-shard0.ready"},
                           logs + "-shard0.log");
  EXPECT_TRUE(p0.ok());
  r.shard0 = std::move(*p0);
  auto ready = r.shard0->WaitForReady(logs + "-shard0.ready", 10000);
  if (ready.ok()) {
    r.address0 = ready->advertise;
    auto p1 = Process::Start(
        {TETHER_SERVER_BIN, "--shard-id", "1", "--shards", "2", "--listen",
         "127.0.0.1:0", "--coordinator", r.address0, "--data-dir", d1},
        logs + "-shard1.log");
    EXPECT_TRUE(p1.ok());
    r.shard1 = std::move(*p1);
    if (!refused) {
      EXPECT_TRUE(r.shard0->WaitForLine("every shard loaded it", 10000).ok());
    } else if (auto code1 = r.shard1->Wait(15000); code1.ok()) {
      r.code1 = *code1;
    }
  }
  if (refused) {
    if (auto code0 = r.shard0->Wait(5000); code0.ok()) r.code0 = *code0;
  }
  r.log0 = r.shard0->Log();
  if (r.shard1) r.log1 = r.shard1->Log();
  return r;
}

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// The name of the newest MANIFEST in `dir`, as the refusal names it.
std::string NewestManifest(const std::string& dir) {
  std::string newest;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("MANIFEST-", 0) == 0 && name > newest) newest = name;
  }
  return newest;
}

// Issue 13, item 1: without CURRENT, RocksDB would start a new database in
// the directory and delete the old one's files. A resume is refused, names
// the file, says how to recover, and leaves every byte as it was.
TEST(CheckpointSafety, MissingCurrentIsRefusedAndNothingOnDiskChanges) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  ASSERT_NO_FATAL_FAILURE(TrainAndStop(run, 60));
  for (int shard : {0, 1}) {
    for (bool without_wal : {false, true}) {
      SCOPED_TRACE(
          "shard " + std::to_string(shard) +
          (without_wal ? ", CURRENT and WAL deleted" : ", CURRENT deleted"));
      const std::string copy = dir.path() + "/copy" + std::to_string(shard) +
                               (without_wal ? "w" : "");
      CopyDir(run, copy);
      const std::string damaged = copy + "/shard" + std::to_string(shard);
      fs::remove(damaged + "/CURRENT");
      if (without_wal) {
        for (const auto& e : fs::directory_iterator(damaged)) {
          if (e.path().extension() == ".log") fs::remove(e.path());
        }
      }
      const auto before = Files(damaged);
      // Twice: the first refusal must not prepare the second's damage.
      for (int attempt = 0; attempt < 2; ++attempt) {
        Resumed r = ResumeFrom(copy + "/shard0", copy + "/shard1", "latest",
                               copy + "-" + std::to_string(attempt));
        EXPECT_NE(r.code0, 0) << r.log0;
        EXPECT_NE(r.code0, -1) << "shard 0 still runs:\n" << r.log0;
        const std::string& log = shard == 0 ? r.log0 : r.log1;
        EXPECT_TRUE(Has(log, damaged)) << log;
        EXPECT_TRUE(Has(log, "CURRENT")) << log;
        EXPECT_FALSE(Has(r.log0, "resumed from checkpoint round")) << r.log0;
        if (shard == 1) {
          EXPECT_NE(r.code1, 0) << r.log1;
          EXPECT_NE(r.code1, -1) << "shard 1 still runs:\n" << r.log1;
          EXPECT_TRUE(Has(r.log0, "shard 1 cannot load round 60")) << r.log0;
        }
        if (!without_wal) {
          EXPECT_TRUE(Has(log, "echo " + NewestManifest(damaged) + " > " +
                                   damaged + "/CURRENT"))
              << log;
        }
        EXPECT_EQ(Files(damaged), before)
            << "the refused resume changed " << damaged;
      }
      if (!without_wal) {
        // The recovery the message gives works, and nothing was lost.
        std::ofstream(damaged + "/CURRENT") << NewestManifest(damaged) << "\n";
        Resumed r = ResumeFrom(copy + "/shard0", copy + "/shard1", "latest",
                               copy + "-recovered", /*refused=*/false);
        EXPECT_TRUE(Has(r.log0,
                        "resumed from checkpoint round 60: every shard "
                        "loaded it"))
            << r.log0;
      }
    }
  }
  // A --data-dir that does not exist is not created by a resume.
  Resumed typo = ResumeFrom(dir.path() + "/typo", run + "/shard1", "latest",
                            dir.path() + "/typo");
  EXPECT_EQ(typo.code0, 1) << typo.log0;
  EXPECT_TRUE(Has(typo.log0, "does not exist")) << typo.log0;
  EXPECT_FALSE(fs::exists(dir.path() + "/typo"));
}

// Issue 13, item 2: a shard's round carries the run's identity, and a
// shard refuses to serve a round of another shard or another run.
TEST(CheckpointSafety, AnotherShardsOrAnotherRunsRoundIsRefused) {
  TempDir dir;
  const std::string a = dir.path() + "/a", b = dir.path() + "/b";
  ASSERT_NO_FATAL_FAILURE(TrainAndStop(a, 60));
  ASSERT_NO_FATAL_FAILURE(TrainAndStop(b, 60));  // same flags, another run

  // Shard 1 started on a copy of shard 0's directory.
  const std::string x = dir.path() + "/x";
  fs::create_directories(x);
  CopyDir(a + "/shard0", x + "/shard0");
  CopyDir(a + "/shard0", x + "/shard1");
  for (const std::string resume : {"60", "latest"}) {
    Resumed r =
        ResumeFrom(x + "/shard0", x + "/shard1", resume, x + "-" + resume);
    EXPECT_EQ(r.code0, 1) << r.log0;
    EXPECT_EQ(r.code1, 1) << r.log1;
    EXPECT_TRUE(Has(r.log1, x + "/shard1: round 60")) << r.log1;
    EXPECT_TRUE(Has(r.log1, "shard id 0 in the round, 1 here")) << r.log1;
    EXPECT_TRUE(Has(r.log0, "shard id 0 in the round, 1 here")) << r.log0;
    EXPECT_FALSE(Has(r.log0, "resumed from checkpoint round")) << r.log0;
  }

  // Shard 1 started on another run's shard-1 directory with the same round.
  const std::string y = dir.path() + "/y";
  fs::create_directories(y);
  CopyDir(a + "/shard0", y + "/shard0");
  CopyDir(b + "/shard1", y + "/shard1");
  Resumed r = ResumeFrom(y + "/shard0", y + "/shard1", "60", y);
  EXPECT_EQ(r.code0, 1) << r.log0;
  EXPECT_EQ(r.code1, 1) << r.log1;
  EXPECT_TRUE(Has(r.log1, y + "/shard1: round 60")) << r.log1;
  EXPECT_TRUE(Has(r.log1, "run id ")) << r.log1;
  EXPECT_TRUE(Has(r.log1, " in the round, ")) << r.log1;
  EXPECT_FALSE(Has(r.log1, "shard id")) << r.log1;

  // The genuine pair still resumes.
  Resumed ok = ResumeFrom(a + "/shard0", a + "/shard1", "60", a + "-ok",
                          /*refused=*/false);
  EXPECT_TRUE(Has(ok.log1, "loaded checkpoint round 60")) << ok.log1;
}

// Flips the bytes of the first half of each of `dir`'s .sst files (their
// data blocks; the index and footer at the end stay readable).
void CorruptSsts(const std::string& dir) {
  {
    // Moves what the WAL holds into .sst files first.
    RawCheckpointDb db(dir, /*read_only=*/false);
    ASSERT_TRUE(db.status().ok()) << db.status().ToString();
    ASSERT_TRUE(db.FlushAll().ok());
  }
  int damaged = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".sst") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes(e.file_size() / 2, '\0');
    f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    for (char& c : bytes) c = static_cast<char>(~c);
    f.seekp(0);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ++damaged;
  }
  ASSERT_GT(damaged, 0) << "no .sst file in " << dir;
}

// Issue 13, item 4: shard 0 says "resumed" only once every shard loaded
// the round. A corrupted .sst on shard 1 stops the run from starting; a
// damaged newest round with --resume latest falls back to the newest round
// every shard holds intact, saying so.
TEST(CheckpointSafety, CorruptSliceOnShard1RefusesOrFallsBack) {
  TempDir dir;
  const std::string one = dir.path() + "/one";
  ASSERT_NO_FATAL_FAILURE(TrainAndStop(one, 30));  // round 20 only
  ASSERT_NO_FATAL_FAILURE(CorruptSsts(one + "/shard1"));
  for (const std::string resume : {"20", "latest"}) {
    Resumed r = ResumeFrom(one + "/shard0", one + "/shard1", resume,
                           one + "-" + resume);
    EXPECT_EQ(r.code0, 1) << r.log0;
    EXPECT_EQ(r.code1, 1) << r.log1;
    EXPECT_TRUE(Has(r.log0, "shard 1 cannot load round 20")) << r.log0;
    EXPECT_TRUE(Has(r.log0, "the run does not start")) << r.log0;
    EXPECT_TRUE(Has(r.log0, "Corruption")) << r.log0;
    EXPECT_FALSE(Has(r.log0, "resumed from checkpoint round")) << r.log0;
  }

  // Rounds 20, 40 and 60; round 60 damaged on shard 1 only.
  const std::string three = dir.path() + "/three";
  ASSERT_NO_FATAL_FAILURE(TrainAndStop(three, 60));
  {
    RawCheckpointDb db(three + "/shard1", /*read_only=*/false);
    ASSERT_TRUE(db.status().ok());
    ASSERT_TRUE(db.TruncateFirstValue(60).ok());
  }
  Resumed r =
      ResumeFrom(three + "/shard0", three + "/shard1", "60", three + "-60");
  EXPECT_EQ(r.code0, 1) << r.log0;
  EXPECT_TRUE(Has(r.log0, "shard 1 cannot load round 60")) << r.log0;

  Resumed latest = ResumeFrom(three + "/shard0", three + "/shard1", "latest",
                              three + "-latest", /*refused=*/false);
  const std::string log0 = latest.log0;
  EXPECT_TRUE(Has(log0,
                  "resumed from checkpoint round 40: every shard "
                  "loaded it"))
      << log0;
  EXPECT_TRUE(Has(log0, "falling back to round 40")) << log0;
  EXPECT_TRUE(Has(latest.shard1->Log(), "loaded checkpoint round 40"));
  // The run goes on from round 40: a worker joins at clock 40 and trains.
  std::string out;
  auto code = RunToExit({TETHER_CLIENT_BIN, "train", "--coordinator",
                         latest.address0, "--tensor", "w", "--shape", "5000",
                         "--iterations", "70", "--grad", "pattern", "--quiet"},
                        &out, 60000);
  EXPECT_TRUE(code.ok() && *code == 0) << out;
}

// Issue 13, item 5: --keep-checkpoints is run-wide, and tether-ckpt list
// calls a round complete only while every shard still holds it.
TEST(CheckpointSafety, KeepCheckpointsIsRunWideAndListChecksEveryShard) {
  TempDir dir;
  std::string out;
  auto refused =
      RunToExit({TETHER_SERVER_BIN, "--shard-id", "1", "--shards", "2",
                 "--coordinator", "127.0.0.1:1", "--keep-checkpoints", "2"},
                &out, 10000);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(*refused, 2) << out;
  EXPECT_TRUE(Has(out, "--keep-checkpoints: run-wide setting")) << out;

  const std::string run = dir.path() + "/run";
  auto rounds_of = [&](int shard) {
    auto store =
        CheckpointStore::OpenReadOnly(run + "/shard" + std::to_string(shard));
    if (!store.ok()) return std::vector<int64_t>{};
    auto rounds = (*store)->ShardRounds();
    return rounds.ok() ? *rounds : std::vector<int64_t>{};
  };
  const std::vector<int64_t> kept = {80, 100};
  // Shard 1 prunes when shard 0 tells it round 100 completed.
  ASSERT_NO_FATAL_FAILURE(TrainAndStop(
      run, 100, 21, {"--keep-checkpoints", "2"},
      [&] { return rounds_of(0) == kept && rounds_of(1) == kept; }));
  EXPECT_EQ(rounds_of(0), kept);
  EXPECT_EQ(rounds_of(1), kept);
  auto listed =
      RunToExit({TETHER_CKPT_BIN, "list", "--data-dir", run}, &out, 10000);
  ASSERT_TRUE(listed.ok() && *listed == 0) << out;
  EXPECT_FALSE(Has(out, "INCOMPLETE")) << out;
  EXPECT_FALSE(Has(out, "\n60 ")) << out;

  // Shard 1 loses round 100: shard 0's record alone does not make it
  // complete any more.
  {
    RawCheckpointDb db(run + "/shard1", /*read_only=*/false);
    ASSERT_TRUE(db.status().ok());
    ASSERT_TRUE(db.DeleteMarker(100).ok());
  }
  listed = RunToExit({TETHER_CKPT_BIN, "list", "--data-dir", run}, &out, 10000);
  ASSERT_TRUE(listed.ok() && *listed == 0) << out;
  EXPECT_TRUE(Has(out, "INCOMPLETE: shard 1 no longer holds it")) << out;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("80 ", 0) == 0) {
      EXPECT_TRUE(Has(line, "complete")) << line;
    }
    if (line.rfind("100 ", 0) == 0) {
      EXPECT_TRUE(Has(line, "INCOMPLETE"));
    }
  }
}

// Issue 18: a shard > 0 whose coordinator is gone serves on and waits for
// it, saying so once, however long that takes. A coordinator started again
// for another run (no --resume) refuses it: the shard exits non-zero,
// naming the runs and what would take its run back, and frees its data dir.
TEST(CheckpointSafety, ShardWaitsForItsCoordinatorAndANewRunRefusesIt) {
  TempDir dir;
  auto cluster = Cluster::Start(RunOptions(21, {"--worker-timeout-ms", "2000"}),
                                dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  (*cluster)->shard(0).Signal(SIGKILL);
  ASSERT_TRUE((*cluster)->shard(0).Wait(5000).ok());
  // Twice the run's timeout: it still waits, and said so once.
  std::this_thread::sleep_for(std::chrono::milliseconds(4000));
  ASSERT_TRUE((*cluster)->shard(1).Running()) << (*cluster)->shard(1).Log();
  std::string log = (*cluster)->shard(1).Log();
  size_t said = 0;
  for (size_t at = log.find("lost the coordinator"); at != std::string::npos;
       at = log.find("lost the coordinator", at + 1)) {
    ++said;
  }
  EXPECT_EQ(said, 1u) << log;
  EXPECT_TRUE(Has(log, "--resume latest")) << log;

  // A new run on shard 0's address (its own data dir).
  Status fresh = (*cluster)->Restart(
      0, {"--data-dir", dir.path() + "/another-run", "--seed", "22"});
  ASSERT_TRUE(fresh.ok()) << fresh.ToString();
  auto code = (*cluster)->shard(1).Wait(15000);
  ASSERT_TRUE(code.ok()) << "shard 1 still runs under another run's "
                            "coordinator\n"
                         << (*cluster)->shard(1).Log();
  EXPECT_EQ(*code, 1);
  log = (*cluster)->shard(1).Log();
  EXPECT_TRUE(Has(log, "this coordinator runs")) << log;
  EXPECT_TRUE(Has(log, "--resume latest")) << log;
  // Its RocksDB lock is free again.
  auto store = CheckpointStore::Open(dir.path() + "/shard1");
  EXPECT_TRUE(store.ok()) << store.status().ToString();
}

}  // namespace
}  // namespace tether::testing

namespace tether::testing {
namespace {

// A data dir another shard has open is refused naming that process, not
// with RocksDB's "Resource temporarily unavailable" on its LOCK file.
TEST(CheckpointSafety, DataDirHeldByARunningShardIsNamed) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  auto first = Process::Start({TETHER_SERVER_BIN, "--listen", "127.0.0.1:0",
                               "--http", "off", "--data-dir", data},
                              dir.path() + "/first.log");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE((*first)->WaitForLine("listening on", 10000).ok())
      << (*first)->Log();
  std::string out;
  auto code = RunToExit({TETHER_SERVER_BIN, "--listen", "127.0.0.1:0", "--http",
                         "off", "--data-dir", data},
                        &out, 10000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_NE(*code, 0) << out;
  EXPECT_NE(out.find("is held by tether-server pid " +
                     std::to_string((*first)->pid())),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("Resource temporarily unavailable"), std::string::npos)
      << out;
  // The first shard goes on undisturbed.
  EXPECT_TRUE((*first)->Running()) << (*first)->Log();
}

}  // namespace
}  // namespace tether::testing
