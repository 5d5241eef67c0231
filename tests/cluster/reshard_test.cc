// Issue 18: a checkpoint round written by 2 shards resumes on 3 shards and
// on 1 (--reshard-from), with real processes and real RocksDB: a round
// taken at once by the resumed run holds every weight, optimizer slot and
// update count bit for bit as the original round did.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "server/checkpoint.h"
#include "server/round_merge.h"
#include "tests/support/cluster.h"
#include "tests/support/worker_pool.h"

namespace tether::testing {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kRound = 20;

std::string Join(const std::vector<std::string>& dirs) {
  std::string out;
  for (const std::string& d : dirs) out += (out.empty() ? "" : ",") + d;
  return out;
}

// Trains 2 shards and 2 workers (mlp, adam: two slots per weight) until
// round 20 is complete, then kills every process.
void TrainUntilRound(const std::string& dir) {
  ClusterOptions o;
  o.shards = 2;
  o.workers = 2;
  o.seed = 21;
  o.optimizer = "adam";
  o.lr = 0.001f;
  o.block_size = 4096;
  o.extra_flags = {"--checkpoint-every", std::to_string(kRound)};
  fs::create_directories(dir);
  auto cluster = Cluster::Start(o, dir);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < 2; ++r) {
    auto p = Process::Start(
        {TETHER_WORKER_BIN, "--coordinator", (*cluster)->coordinator(),
         "--rank", std::to_string(r), "--staleness", "0", "--model", "mlp",
         "--hidden", "32", "--epochs", "1", "--batch", "200", "--eval-every",
         "0", "--quiet"},
        dir + "/worker" + std::to_string(r) + ".log");
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    workers.push_back(std::move(*p));
  }
  auto line = (*cluster)->shard(0).WaitForLine(
      "checkpoint round " + std::to_string(kRound) + " complete", 60000);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  for (auto& w : workers) w->Signal(SIGKILL);
  for (int i = 0; i < 2; ++i) (*cluster)->shard(i).Signal(SIGKILL);
  for (int i = 0; i < 2; ++i) (void)(*cluster)->shard(i).Wait(10000);
}

// Every block and row of a round, merged from its slices: by "tensor#block"
// or "table@key", its update count, weights and optimizer slots.
using Entries =
    std::map<std::string,
             std::tuple<uint64_t, std::vector<float>, std::vector<float>>>;
struct Round {
  Entries entries;
  std::set<std::string> tensors, tables;  // every definition
};

Round ReadMerged(const std::vector<std::string>& dirs, int64_t round) {
  std::vector<ShardSnapshot> slices;
  for (const std::string& d : dirs) {
    auto store = CheckpointStore::OpenReadOnly(d);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    if (!store.ok()) return {};
    auto slice = (*store)->ReadShard(round);
    EXPECT_TRUE(slice.ok()) << slice.status().ToString();
    if (!slice.ok()) return {};
    EXPECT_EQ(slice->settings.num_shards, static_cast<int>(dirs.size()));
    slices.push_back(std::move(*slice));
  }
  std::sort(slices.begin(), slices.end(),
            [](const ShardSnapshot& x, const ShardSnapshot& y) {
              return x.shard_id < y.shard_id;
            });
  std::vector<std::string> problems;
  const MergedRound merged = MergeSlices(
      slices, slices[0].settings.block_size,
      [](size_t k) { return "shard " + std::to_string(k); }, &problems);
  EXPECT_TRUE(problems.empty()) << problems[0];
  Round out;
  for (const auto& [name, t] : merged.tensors) {
    for (const auto& [index, held] : t.blocks) {
      const TensorSnapshot::Block& b = *held.second;
      out.entries[name + "#" + std::to_string(index)] = {
          b.step,
          {b.Weights().begin(), b.Weights().end()},
          {b.Slots().begin(), b.Slots().end()}};
    }
  }
  for (const auto& [name, t] : merged.tables) {
    for (const auto& [key, held] : t.rows) {
      out.entries[name + "@" + std::to_string(key)] = {
          held.second->step, held.second->weights, held.second->slots};
    }
  }
  // Every shard defines every tensor and table.
  for (const ShardSnapshot& s : slices) {
    std::set<std::string> names;
    for (const TensorSnapshot& t : s.tensors) names.insert(t.name);
    for (const auto& [name, t] : merged.tensors) {
      EXPECT_EQ(names.count(name), 1u)
          << "shard " << s.shard_id << " does not define " << name;
      out.tensors.insert(name);
    }
    for (const auto& [name, t] : merged.tables) out.tables.insert(name);
  }
  return out;
}

void ExpectSame(const Round& original, const Round& got,
                const std::string& what) {
  EXPECT_EQ(got.tensors, original.tensors) << what;
  EXPECT_EQ(got.tables, original.tables) << what;
  ASSERT_EQ(got.entries.size(), original.entries.size()) << what;
  ASSERT_FALSE(original.entries.empty());
  for (const auto& [key, want] : original.entries) {
    auto it = got.entries.find(key);
    ASSERT_NE(it, got.entries.end()) << what << ": " << key << " is missing";
    const auto& [step, weights, slots] = it->second;
    EXPECT_EQ(step, std::get<0>(want)) << what << ": " << key;
    ASSERT_EQ(weights.size(), std::get<1>(want).size()) << key;
    ASSERT_EQ(slots.size(), std::get<2>(want).size()) << key;
    EXPECT_FALSE(slots.empty()) << key << ": adam keeps slots";
    EXPECT_EQ(std::memcmp(weights.data(), std::get<1>(want).data(),
                          weights.size() * sizeof(float)),
              0)
        << what << ": " << key << "'s weights differ";
    EXPECT_EQ(std::memcmp(slots.data(), std::get<2>(want).data(),
                          slots.size() * sizeof(float)),
              0)
        << what << ": " << key << "'s optimizer slots differ";
  }
}

// `tether-ckpt export --format npy` of a round: each array's file, whole.
std::map<std::string, std::string> Export(const std::string& data_dir,
                                          int64_t round,
                                          const std::string& out) {
  std::string said;
  auto code =
      RunToExit({TETHER_CKPT_BIN, "export", "--data-dir", data_dir, "--round",
                 std::to_string(round), "--format", "npy", "--out", out},
                &said, 30000);
  EXPECT_TRUE(code.ok() && *code == 0) << said;
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(out)) {
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    files[e.path().filename().string()] = bytes.str();
  }
  return files;
}

// Resumes round 20 on `shards` shards, data dirs DIR/shardN, with no
// workers; an observer takes a round at once. Returns its number.
int64_t ResumeAndTakeRound(const std::string& dir, int shards,
                           const std::vector<std::string>& reshard_from) {
  ClusterOptions o;
  o.shards = shards;
  o.run_flags = false;  // the run's settings come from the round
  // The round taken at once is at clock 0 (no workers hold a clock): the
  // old rounds must not push it out.
  o.extra_flags = {"--resume", std::to_string(kRound), "--workers",
                   "0",        "--keep-checkpoints",   "100"};
  o.shard_flags = {"--reshard-from", Join(reshard_from)};
  fs::create_directories(dir);
  auto cluster = Cluster::Start(o, dir);
  EXPECT_TRUE(cluster.ok()) << cluster.status().ToString();
  if (!cluster.ok()) return -1;
  Cluster& c = **cluster;
  auto resumed = c.shard(0).WaitForLine(
      "resumed from checkpoint round " + std::to_string(kRound), 20000);
  EXPECT_TRUE(resumed.ok()) << resumed.status().ToString();
  const std::string said = "resuming round " + std::to_string(kRound) +
                           " written by 2 shards on " + std::to_string(shards) +
                           " shards";
  for (int i = 0; i < shards; ++i) {
    EXPECT_TRUE(c.shard(i).WaitForLine(said, 5000).ok())
        << "shard " << i << ":\n"
        << Tail(c.shard(i).Log(), 20);
  }
  auto observer = ConnectObserver(c.coordinator());
  if (observer == nullptr) return -1;
  auto round = observer->CheckpointNow();
  EXPECT_TRUE(round.ok()) << round.status().ToString();
  if (!round.ok()) return -1;
  auto complete = c.shard(0).WaitForLine(
      "checkpoint round " + std::to_string(*round) + " complete", 20000);
  EXPECT_TRUE(complete.ok()) << Tail(c.shard(0).Log(), 20);
  if (::testing::Test::HasFailure()) c.DumpLogs();
  return *round;
}

TEST(Reshard, RoundOfTwoShardsResumesOnThreeAndOnOneBitIdentically) {
  TempDir dir;
  const std::string a = dir.path() + "/a";
  ASSERT_NO_FATAL_FAILURE(TrainUntilRound(a));
  const std::vector<std::string> old = {a + "/shard0", a + "/shard1"};
  const Round original = ReadMerged(old, kRound);
  const auto exported = Export(a, kRound, dir.path() + "/a.npy");
  ASSERT_FALSE(exported.empty());

  // 3 shards laid out as tether-up does: the old shards keep their dirs (a
  // copy here), the third starts a new one, and all read both old ones.
  const std::string b = dir.path() + "/b";
  fs::create_directories(b);
  for (const char* shard : {"/shard0", "/shard1"}) {
    fs::copy(a + shard, b + shard, fs::copy_options::recursive);
  }
  const int64_t on_three =
      ResumeAndTakeRound(b, 3, {b + "/shard0", b + "/shard1"});
  ASSERT_GE(on_three, 0);
  ExpectSame(
      original,
      ReadMerged({b + "/shard0", b + "/shard1", b + "/shard2"}, on_three),
      "on 3 shards");
  EXPECT_EQ(Export(b, on_three, dir.path() + "/b.npy"), exported)
      << "tether-ckpt export differs on 3 shards";

  // 1 shard with a new data dir: the round's record comes from the old
  // shard 0's, and the old dirs are only read.
  const std::string c = dir.path() + "/c";
  const int64_t on_one = ResumeAndTakeRound(c, 1, old);
  ASSERT_GE(on_one, 0);
  ExpectSame(original, ReadMerged({c + "/shard0"}, on_one), "on 1 shard");
  EXPECT_EQ(Export(c, on_one, dir.path() + "/c.npy"), exported)
      << "tether-ckpt export differs on 1 shard";
  // The old round is still there, unchanged.
  ExpectSame(original, ReadMerged(old, kRound), "the old dirs afterwards");
}

TEST(Reshard, AnotherShardCountWithoutReshardFromIsRefusedNamingIt) {
  TempDir dir;
  const std::string a = dir.path() + "/a";
  ASSERT_NO_FATAL_FAILURE(TrainUntilRound(a));
  std::string out;
  auto code =
      RunToExit({TETHER_SERVER_BIN, "--shard-id", "0", "--shards", "3",
                 "--listen", "127.0.0.1:0", "--http", "off", "--data-dir",
                 a + "/shard0", "--resume", std::to_string(kRound)},
                &out, 20000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_NE(*code, 0) << out;
  EXPECT_NE(out.find("written by 2 shards and this run has 3 (--shards): "
                     "give --reshard-from"),
            std::string::npos)
      << out;

  // A --reshard-from dir that lacks the round is named.
  code = RunToExit({TETHER_SERVER_BIN, "--shard-id", "0", "--shards", "3",
                    "--listen", "127.0.0.1:0", "--http", "off", "--data-dir",
                    a + "/shard0", "--resume", std::to_string(kRound),
                    "--reshard-from", a + "/shard0," + dir.path() + "/missing"},
                   &out, 20000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_NE(*code, 0) << out;
  EXPECT_NE(out.find("--reshard-from: checkpoint dir " + dir.path() +
                     "/missing does not exist"),
            std::string::npos)
      << out;
}

// tether-up --resume with another --shards gives every shard --reshard-from
// with the old shards' dirs (DIR/shard0, DIR/shard1), from its saved flags.
TEST(Reshard, TetherUpResumesOnAnotherShardCount) {
  TempDir dir;
  const std::string data = dir.path() + "/run";
  std::string out;
  auto code = RunToExit({TETHER_UP_BIN,
                         "--data-dir",
                         data,
                         "--log-dir",
                         dir.path() + "/first",
                         "--shards",
                         "2",
                         "--workers",
                         "2",
                         "--slow",
                         "0",
                         "--epochs",
                         "1",
                         "--model",
                         "softmax",
                         "--checkpoint-every",
                         "20",
                         "--http",
                         "off",
                         "--target-accuracy",
                         "0.1"},
                        &out, 60000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  ASSERT_EQ(*code, 0) << out;
  code = RunToExit({TETHER_UP_BIN, "--data-dir", data, "--log-dir",
                    dir.path() + "/second", "--resume", "latest", "--shards",
                    "3", "--http", "off", "--target-accuracy", "0.1"},
                   &out, 60000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0) << out;
  EXPECT_NE(out.find("tether-up: resuming from round"), std::string::npos)
      << out;
  for (int i = 0; i < 3; ++i) {
    std::ifstream in(dir.path() + "/second/shard" + std::to_string(i) + ".log");
    std::stringstream log;
    log << in.rdbuf();
    EXPECT_NE(log.str().find(" written by 2 shards on 3 shards"),
              std::string::npos)
        << "shard " << i << ":\n"
        << log.str();
  }
}

}  // namespace
}  // namespace tether::testing
