#include "server/checkpoint.h"

#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "server/checkpoint_codec.h"
#include "server/checkpoint_keys.h"
#include "server/checkpointer.h"
#include "server/optimizer.h"
#include "server/param_store.h"
#include "tests/support/raw_checkpoint_db.h"
#include "tests/support/temp_dir.h"

namespace tether {
namespace {

constexpr uint64_t kSeed = 42;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<float> Floats(std::span<const float> values) {
  return {values.begin(), values.end()};
}

using ::tether::testing::RawCheckpointDb;
using ::tether::testing::TempDir;

std::unique_ptr<CheckpointStore> OpenOrDie(const std::string& dir) {
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(*store) : nullptr;
}

std::vector<uint32_t> Bits(std::span<const float> values) {
  std::vector<uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

OptimizerOptions Opt(OptimizerKind kind) {
  OptimizerOptions o;
  o.kind = kind;
  o.lr = 0.05f;
  return o;
}

RunSettings Settings(OptimizerKind kind, uint32_t block_size) {
  RunSettings s;
  s.seed = kSeed;
  s.num_shards = 2;
  s.num_workers = 3;
  s.max_staleness = 2;
  s.block_size = block_size;
  s.checkpoint_every = 5;
  s.resume_round = 2;
  s.optimizer = Opt(kind);
  return s;
}

// A small snapshot of one tensor, for tests about rounds rather than values.
ShardSnapshot SmallSnapshot(int64_t round) {
  ShardSnapshot s;
  s.round = round;
  s.min_clock = round * 10;
  s.settings = Settings(OptimizerKind::kSgd, 4);
  TensorSnapshot t;
  t.id = NameId("w");
  t.name = "w";
  t.shape = {6};
  TensorSnapshot::Block& b = t.blocks.emplace_back();
  b.index = 1;
  b.step = 3;
  b.weights = {float(round), 2.0f};
  s.tensors.push_back(t);
  return s;
}

// A snapshot of `floats` floats in blocks of 64 Ki (sgd: no slots).
ShardSnapshot BigSnapshot(int64_t round, uint64_t floats) {
  ShardSnapshot s;
  s.round = round;
  s.settings = Settings(OptimizerKind::kSgd, 65536);
  TensorSnapshot t;
  t.id = NameId("big");
  t.name = "big";
  t.shape = {floats};
  for (uint32_t b = 0; uint64_t{b} * 65536 < floats; ++b) {
    const uint64_t len =
        std::min<uint64_t>(65536, floats - uint64_t{b} * 65536);
    TensorSnapshot::Block& block = t.blocks.emplace_back();
    block.index = b;
    block.step = 1;
    block.weights.assign(len, 0.5f);
  }
  s.tensors.push_back(std::move(t));
  return s;
}

// The child WriteUntilKilled starts: a fresh process (this binary again),
// since RocksDB's background threads, which write a round's files, do not
// survive a fork of a threaded process. It writes BigSnapshot(round,
// floats) into dir, as TETHER_TEST_WRITE_ROUND="dir:round:floats" says,
// and exits before any test runs: 3 when the store does not open, 4 when
// the write finished, 5 when it failed.
const bool kWriteRoundChild = [] {
  const char* job = std::getenv("TETHER_TEST_WRITE_ROUND");
  if (job == nullptr) return false;
  const std::string text = job;
  const size_t a = text.rfind(':', text.rfind(':') - 1), b = text.rfind(':');
  const std::string dir = text.substr(0, a);
  const int64_t round = std::stoll(text.substr(a + 1, b - a - 1));
  const uint64_t floats = std::stoull(text.substr(b + 1));
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(dir);
  if (!store.ok()) _exit(3);
  Result<uint64_t> written = (*store)->WriteShard(BigSnapshot(round, floats));
  _exit(written.ok() ? 4 : 5);
}();

// Writes BigSnapshot(round, floats) into `dir` from a child process that
// the kernel kills (SIGXFSZ) once a file it writes passes `file_limit`
// bytes: a crash in the middle of WriteShard, after the round's header is
// in and before its marker is. Returns how the child ended ("killed by
// SIGXFSZ" when as planned).
std::string WriteUntilKilled(const std::string& dir, int64_t round,
                             uint64_t floats, uint64_t file_limit) {
  // Built before the fork: the child of a threaded process may only make
  // async-signal-safe calls until it execs.
  const std::string job = "TETHER_TEST_WRITE_ROUND=" + dir + ":" +
                          std::to_string(round) + ":" + std::to_string(floats);
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(const_cast<char*>(job.c_str()));
  env.push_back(nullptr);
  char name[] = "tether_unit_tests";
  char* const argv[] = {name, nullptr};
  const pid_t pid = fork();
  if (pid == 0) {
    const rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    const rlimit limit = {file_limit, file_limit};
    setrlimit(RLIMIT_FSIZE, &limit);
    execve("/proc/self/exe", argv, env.data());
    _exit(6);
  }
  if (pid < 0) return std::string("fork: ") + std::strerror(errno);
  int status = 0;
  // A hung child must not hang the test.
  for (int i = 0; i < 2000 && waitpid(pid, &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (i == 1999) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return "hung (killed after 10 s)";
    }
  }
  if (WIFSIGNALED(status)) {
    return WTERMSIG(status) == SIGXFSZ
               ? "killed by SIGXFSZ"
               : "killed by signal " + std::to_string(WTERMSIG(status));
  }
  switch (WEXITSTATUS(status)) {
    case 3:
      return "could not open the store";
    case 4:
      return "finished the write";
    case 5:
      return "WriteShard failed without being killed";
    case 6:
      return "could not start the child (exec failed)";
  }
  return "exit " + std::to_string(WEXITSTATUS(status));
}

// Keys in the store's "weights" family for `round`, read with RocksDB
// directly: what a crashed write left behind, which the store must hide.
int CountRawWeightKeys(const std::string& dir, int64_t round) {
  RawCheckpointDb raw(dir, /*read_only=*/true);
  EXPECT_TRUE(raw.status().ok()) << raw.status().ToString();
  return raw.status().ok() ? raw.CountWeightKeys(round) : -1;
}

// Every key of `round` in the weights and meta families.
int CountRawKeys(const std::string& dir, int64_t round) {
  RawCheckpointDb raw(dir, /*read_only=*/true);
  EXPECT_TRUE(raw.status().ok()) << raw.status().ToString();
  return raw.status().ok()
             ? raw.CountWeightKeys(round) + raw.CountMetaKeys(round)
             : -1;
}

// --- ParamStore snapshots through RocksDB -----------------------------------

// Both stores hold the same tensors and tables: every block and row reads
// the same bits.
void ExpectSameContents(ParamStore& a, ParamStore& b, uint32_t tensor,
                        uint32_t blocks, uint32_t table,
                        const std::vector<uint64_t>& keys) {
  for (uint32_t i = 0; i < blocks; ++i) {
    Result<std::span<const float>> x = a.ReadBlock(tensor, i);
    Result<std::span<const float>> y = b.ReadBlock(tensor, i);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(Bits(*x), Bits(*y)) << "block " << i;
  }
  const uint32_t dim = *a.TableDim(table);
  std::vector<float> x(keys.size() * dim), y(keys.size() * dim);
  ASSERT_TRUE(a.ReadRows(table, keys, x).ok());
  ASSERT_TRUE(b.ReadRows(table, keys, y).ok());
  EXPECT_EQ(Bits(x), Bits(y));
}

TEST(Checkpoint, RoundTripsWeightsSlotsAndSteps) {
  TempDir dir;
  const OptimizerOptions adam = Opt(OptimizerKind::kAdam);
  ParamStore original(kSeed, 4, adam);
  const InitSpec normal = {.kind = InitSpec::Kind::kNormal, .scale = 0.1f};
  const InitSpec uniform = {.kind = InitSpec::Kind::kUniform, .scale = 0.5f};
  const uint32_t w = *original.DefineTensor("w", {3, 5}, normal);  // 4 blocks
  const uint32_t emb = *original.DefineTable("emb", 3, uniform);
  // Touched: blocks 0, 2 and 3 (0 and 3 updated, 0 twice); block 1 never.
  ASSERT_TRUE(original.ReadBlock(w, 2).ok());
  const std::vector<float> g4 = {0.5f, -1.0f, 2.0f, 0.25f};
  const std::vector<float> g3 = {1.0f, -0.5f, 0.125f};
  ASSERT_TRUE(original.ApplyBlock(w, 0, g4).ok());
  ASSERT_TRUE(original.ApplyBlock(w, 0, g4, 0.5f).ok());
  ASSERT_TRUE(original.ApplyBlock(w, 3, g3).ok());
  // Rows: 5 and 2^63 only read; 42 updated twice, 7 once.
  const std::vector<uint64_t> read_keys = {5, uint64_t{1} << 63};
  std::vector<float> rows(read_keys.size() * 3);
  ASSERT_TRUE(original.ReadRows(emb, read_keys, rows).ok());
  const std::vector<uint64_t> push_keys = {42, 42, 7};
  const std::vector<float> row_grads = {1, 2, 3, -1, -2, -3, 0.5, 0.5, 0.5};
  ASSERT_TRUE(original.ApplyRows(emb, push_keys, row_grads).ok());

  ShardSnapshot snapshot;
  snapshot.round = 3;
  snapshot.shard_id = 1;
  snapshot.min_clock = 12;
  snapshot.worker_clocks = {12, 14, 13};
  snapshot.settings = Settings(OptimizerKind::kAdam, 4);
  original.Snapshot(&snapshot.tensors, &snapshot.tables);
  ASSERT_EQ(snapshot.tensors.size(), 1u);
  ASSERT_EQ(snapshot.tensors[0].blocks.size(), 3u);
  EXPECT_EQ(snapshot.tensors[0].blocks[0].step, 2u);
  EXPECT_EQ(snapshot.tensors[0].blocks[1].index, 2u);
  ASSERT_EQ(snapshot.tables[0].rows.size(), 4u);
  EXPECT_EQ(snapshot.tables[0].rows[2].key, 42u);  // sorted by key
  EXPECT_EQ(snapshot.tables[0].rows[2].step, 2u);

  std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
  Result<uint64_t> bytes = store->WriteShard(snapshot);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  // Blocks 0, 2 and 3, four rows of 3; weights and two Adam slots each.
  constexpr uint64_t kFloatsHeld = (4 + 4 + 3) + 4 * 3;
  EXPECT_GT(*bytes, kFloatsHeld * 3 * sizeof(float));
  Result<ShardSnapshot> back = store->ReadShard(3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->shard_id, 1);
  EXPECT_EQ(back->min_clock, 12);
  EXPECT_EQ(back->worker_clocks, snapshot.worker_clocks);
  EXPECT_EQ(back->settings.seed, kSeed);
  EXPECT_EQ(back->settings.max_staleness, 2);
  EXPECT_EQ(back->settings.checkpoint_every, 5);
  EXPECT_EQ(back->settings.resume_round, 2);
  EXPECT_EQ(back->settings.optimizer.kind, OptimizerKind::kAdam);
  EXPECT_EQ(back->settings.optimizer.lr, 0.05f);
  ASSERT_EQ(back->tensors.size(), 1u);
  EXPECT_EQ(back->tensors[0].name, "w");
  EXPECT_EQ(back->tensors[0].init, normal);
  ASSERT_EQ(back->tables.size(), 1u);
  EXPECT_EQ(back->tables[0].init, uniform);

  ParamStore restored(kSeed, 4, adam);
  ASSERT_TRUE(restored.Restore(back->tensors, back->tables).ok());
  EXPECT_EQ(restored.counts().dense_blocks, 3u);
  EXPECT_EQ(restored.counts().sparse_rows, 4u);
  EXPECT_EQ(restored.counts().bytes, original.counts().bytes);
  const std::vector<uint64_t> all_keys = {5, uint64_t{1} << 63, 42, 7, 99};
  ExpectSameContents(original, restored, w, 4, emb, all_keys);
  // The blocks were read once, into the buffers the restored store now
  // holds: no second copy.
  const TensorSnapshot::Block& read0 = back->tensors[0].blocks[0];
  ASSERT_EQ(read0.index, 0u);
  const std::vector<float> read0_before = Floats(read0.Weights());
  EXPECT_EQ(restored.ReadBlock(w, 0)->data(), read0.Weights().data());

  // Slots and steps came back too: further updates agree bit for bit.
  for (ParamStore* s : {&original, &restored}) {
    ASSERT_TRUE(s->ApplyBlock(w, 0, g4).ok());
    ASSERT_TRUE(s->ApplyBlock(w, 1, g4).ok());
    ASSERT_TRUE(s->ApplyBlock(w, 3, g3, 2.0f).ok());
    ASSERT_TRUE(s->ApplyRows(emb, push_keys, row_grads).ok());
  }
  ExpectSameContents(original, restored, w, 4, emb, all_keys);
  // The update wrote new buffers: the round as read is unchanged.
  EXPECT_NE(restored.ReadBlock(w, 0)->data(), read0.Weights().data());
  EXPECT_EQ(Bits(read0.Weights()), Bits(read0_before));
}

// A large round is read in key ranges on several threads; what comes back
// is the same as one thread reading it whole, whichever ranges the cuts
// make (in a tensor, between tensors, before the table's rows).
TEST(Checkpoint, ARoundReadInRangesOnThreadsIsTheSameAsReadWhole) {
  TempDir dir;
  ParamStore store(kSeed, 4, Opt(OptimizerKind::kAdam));
  const uint32_t a = *store.DefineTensor("a", {37}, {});     // 10 blocks
  const uint32_t b = *store.DefineTensor("b", {3, 50}, {});  // 38 blocks
  const uint32_t emb = *store.DefineTable("emb", 3, {});
  const std::vector<float> g4 = {0.5f, -1.0f, 2.0f, 0.25f};
  for (uint32_t i = 0; i < 9; i += 2)
    ASSERT_TRUE(store.ApplyBlock(a, i, g4).ok());
  ASSERT_TRUE(store.ApplyBlock(a, 9, std::vector<float>{1.0f}).ok());
  for (uint32_t i = 0; i < 37; ++i) {
    ASSERT_TRUE(store.ApplyBlock(b, i, g4, 1.0f + i % 3).ok());
  }
  const std::vector<uint64_t> keys = {3, 99, uint64_t{1} << 40};
  ASSERT_TRUE(store.ApplyRows(emb, keys, std::vector<float>(9, 0.5f)).ok());
  ShardSnapshot snapshot;
  snapshot.round = 7;
  snapshot.settings = Settings(OptimizerKind::kAdam, 4);
  store.Snapshot(&snapshot.tensors, &snapshot.tables);
  std::unique_ptr<CheckpointStore> ckpt = OpenOrDie(dir.path());
  ASSERT_TRUE(ckpt->WriteShard(snapshot).ok());

  Result<ShardSnapshot> whole = ckpt->ReadShard(7, {.threads = 1});
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  for (const uint64_t part_bytes : {1, 100, 400, 1000}) {
    Result<ShardSnapshot> cut =
        ckpt->ReadShard(7, {.threads = 6, .part_bytes = part_bytes});
    ASSERT_TRUE(cut.ok()) << cut.status().ToString();
    ASSERT_EQ(cut->tensors.size(), whole->tensors.size());
    for (size_t t = 0; t < whole->tensors.size(); ++t) {
      const auto& x = whole->tensors[t].blocks;
      const auto& y = cut->tensors[t].blocks;
      ASSERT_EQ(x.size(), y.size()) << "tensor " << t << ", " << part_bytes;
      for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(x[i].index, y[i].index);
        EXPECT_EQ(x[i].step, y[i].step);
        EXPECT_EQ(Bits(x[i].Weights()), Bits(y[i].Weights()));
        EXPECT_EQ(Bits(x[i].Slots()), Bits(y[i].Slots()));
      }
    }
    ASSERT_EQ(cut->tables.size(), 1u);
    ASSERT_EQ(cut->tables[0].rows.size(), keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(cut->tables[0].rows[i].key, whole->tables[0].rows[i].key);
      EXPECT_EQ(Bits(cut->tables[0].rows[i].weights),
                Bits(whole->tables[0].rows[i].weights));
      EXPECT_EQ(Bits(cut->tables[0].rows[i].slots),
                Bits(whole->tables[0].rows[i].slots));
    }
  }
  // And the store restored from a cut read is the one that was written.
  Result<ShardSnapshot> cut =
      ckpt->ReadShard(7, {.threads = 3, .part_bytes = 1});
  ASSERT_TRUE(cut.ok());
  ParamStore restored(kSeed, 4, Opt(OptimizerKind::kAdam));
  ASSERT_TRUE(restored.Restore(cut->tensors, cut->tables).ok());
  ExpectSameContents(store, restored, b, 38, emb, keys);
  ExpectSameContents(store, restored, a, 10, emb, keys);
}

TEST(ParamStoreSnapshot, RestoreRejectsMismatchedSlots) {
  ParamStore adam(kSeed, 4, Opt(OptimizerKind::kAdam));
  const uint32_t w = *adam.DefineTensor("w", {10}, {});
  ASSERT_TRUE(adam.ApplyBlock(w, 1, std::vector<float>(4, 1.0f)).ok());
  std::vector<TensorSnapshot> tensors;
  std::vector<TableSnapshot> tables;
  adam.Snapshot(&tensors, &tables);

  ParamStore sgd(kSeed, 4, Opt(OptimizerKind::kSgd));
  const uint32_t other = *sgd.DefineTensor("other", {4}, {});
  ASSERT_TRUE(sgd.ApplyBlock(other, 0, std::vector<float>(4, 1.0f)).ok());
  const std::vector<uint32_t> before = Bits(*sgd.ReadBlock(other, 0));
  const ParamStore::Counts counts = sgd.counts();

  Status s = sgd.Restore(tensors, tables);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "tensor 'w'")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "slot")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "sgd")) << s.message();
  // Unchanged: still only "other", with its values.
  EXPECT_EQ(sgd.TensorSize(w).status().code(), Code::kNotFound);
  EXPECT_EQ(Bits(*sgd.ReadBlock(other, 0)), before);
  EXPECT_EQ(sgd.counts().tensors, counts.tensors);
  EXPECT_EQ(sgd.counts().bytes, counts.bytes);

  // A block of the wrong length is refused the same way.
  TensorSnapshot::Block& shortened = tensors[0].blocks[0];
  shortened.weights.assign(shortened.Weights().begin(),
                           shortened.Weights().end() - 1);
  shortened.slots.assign(shortened.Slots().begin(), shortened.Slots().end());
  shortened.shared.reset();
  ParamStore adam2(kSeed, 4, Opt(OptimizerKind::kAdam));
  s = adam2.Restore(tensors, tables);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "tensor 'w': block 1")) << s.message();
}

// --- Rounds
// ---------------------------------------------------------------------

TEST(Checkpoint, HalfWrittenRoundIsInvisible) {
  TempDir dir;
  {
    std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
    ASSERT_TRUE(store->WriteShard(SmallSnapshot(1)).ok());
  }
  // 20 MB; the child dies as the round's data file passes 12 MiB, so the
  // header is in (through the log) and the marker never is.
  ASSERT_EQ(WriteUntilKilled(dir.path(), 2, 5'000'000, 12 << 20),
            "killed by SIGXFSZ");
  EXPECT_GT(CountRawKeys(dir.path(), 2), 0)
      << "the crash should leave keys of round 2 behind";

  std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
  EXPECT_EQ(*store->ShardRounds(), std::vector<int64_t>{1});
  EXPECT_EQ(store->ReadShard(2).status().code(), Code::kNotFound);
  Result<ShardSnapshot> one = store->ReadShard(1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(Floats(one->tensors[0].blocks[0].Weights()),
            (std::vector<float>{1.0f, 2.0f}));

  // Writing the round again replaces the leftovers entirely.
  ShardSnapshot small2 = SmallSnapshot(2);
  ASSERT_TRUE(store->WriteShard(small2).ok());
  Result<ShardSnapshot> two = store->ReadShard(2);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  ASSERT_EQ(two->tensors.size(), 1u);
  EXPECT_EQ(two->tensors[0].name, "w");
  EXPECT_EQ(two->tensors[0].blocks.size(), 1u);
}

// A round's data goes into files of its own that the store takes in whole.
// Writing a round again over a complete one (data left from before) leaves
// only the new data, tables' rows in key order whatever order they came
// in, and no data file outside the store.
TEST(Checkpoint, RoundWrittenAgainOverAnOldOneHoldsOnlyTheNewData) {
  TempDir dir;
  std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
  ShardSnapshot first = BigSnapshot(4, 300'000);  // 5 blocks
  ASSERT_TRUE(store->WriteShard(first).ok());
  ShardSnapshot again = SmallSnapshot(4);
  again.settings = Settings(OptimizerKind::kAdam, 4);
  again.tensors[0].blocks[0].slots = {0.1f, 0.2f, 0.3f, 0.4f};
  TableSnapshot table;
  table.id = NameId("emb");
  table.name = "emb";
  table.dim = 1;
  for (uint64_t key : {9, 2, 5}) {
    TableSnapshot::Row& r = table.rows.emplace_back();
    r.key = key;
    r.step = key;
    r.weights = {float(key)};
    r.slots = {1.0f, 2.0f};
  }
  again.tables.push_back(table);
  ASSERT_TRUE(store->WriteShard(again).ok());
  EXPECT_EQ(CountRawWeightKeys(dir.path(), 4), 4);  // 1 block, 3 rows

  Result<ShardSnapshot> read = store->ReadShard(4);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->tensors.size(), 1u);
  EXPECT_EQ(read->tensors[0].name, "w");
  ASSERT_EQ(read->tensors[0].blocks.size(), 1u);
  EXPECT_EQ(Floats(read->tensors[0].blocks[0].Weights()),
            (std::vector<float>{4.0f, 2.0f}));
  EXPECT_EQ(Floats(read->tensors[0].blocks[0].Slots()),
            (std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}));
  ASSERT_EQ(read->tables.size(), 1u);
  ASSERT_EQ(read->tables[0].rows.size(), 3u);
  std::map<uint64_t, float> rows;
  for (const auto& r : read->tables[0].rows) rows[r.key] = r.weights[0];
  EXPECT_EQ(rows, (std::map<uint64_t, float>{{2, 2.0f}, {5, 5.0f}, {9, 9.0f}}));
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_FALSE(e.path().filename().string().starts_with("tether-ingest-"))
        << e.path();
  }
}

RoundRecord Record(int64_t round) {
  RoundRecord r;
  r.round = round;
  r.clock = round * 10;
  r.unix_ms = 1700000000000 + round;
  r.bytes = 1000 + round;
  r.settings = Settings(OptimizerKind::kMomentum, 4);
  r.workers = {{0, round * 10, 1, 640}, {1, round * 10 + 1, 2, 1280}};
  return r;
}

std::vector<int64_t> RecordedRounds(const CheckpointStore& store) {
  std::vector<int64_t> rounds;
  Result<std::vector<RoundRecord>> records = store.CompleteRounds();
  EXPECT_TRUE(records.ok()) << records.status().ToString();
  if (!records.ok()) return rounds;
  for (const RoundRecord& r : *records) rounds.push_back(r.round);
  return rounds;
}

TEST(Checkpoint, CompleteRoundsRecordedAndPruned) {
  TempDir dir;
  std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
  for (int64_t r = 1; r <= 5; ++r) {
    ASSERT_TRUE(store->WriteShard(SmallSnapshot(r)).ok());
    ASSERT_TRUE(store->MarkComplete(Record(r)).ok());
  }
  Result<std::vector<RoundRecord>> records = store->CompleteRounds();
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), 5u);
  const RoundRecord& third = (*records)[2];
  EXPECT_EQ(third.round, 3);
  EXPECT_EQ(third.clock, 30);
  EXPECT_EQ(third.unix_ms, 1700000000003);
  EXPECT_EQ(third.bytes, 1003u);
  EXPECT_EQ(third.settings.optimizer.kind, OptimizerKind::kMomentum);
  EXPECT_EQ(third.settings.seed, kSeed);
  ASSERT_EQ(third.workers.size(), 2u);
  EXPECT_EQ(third.workers[1].rank, 1);
  EXPECT_EQ(third.workers[1].clock, 31);
  EXPECT_EQ(third.workers[1].epoch, 2);
  EXPECT_EQ(third.workers[1].samples, 1280u);

  ASSERT_TRUE(store->Prune(2, 5).ok());
  EXPECT_EQ(RecordedRounds(*store), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(*store->ShardRounds(), (std::vector<int64_t>{4, 5}));
  for (int64_t r = 1; r <= 3; ++r) {
    EXPECT_EQ(store->ReadShard(r).status().code(), Code::kNotFound);
    EXPECT_EQ(CountRawWeightKeys(dir.path(), r), 0) << "round " << r;
  }
  EXPECT_TRUE(store->ReadShard(4).ok());
}

TEST(Checkpoint, OtherShardsPruneAnnouncedRoundsAndHalfWrittenOnes) {
  // A shard other than 0 has no records: it learns which rounds completed
  // from Prune's argument, one announcement per round.
  TempDir dir;
  {
    std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
    for (int64_t r = 1; r <= 3; ++r) {
      ASSERT_TRUE(store->WriteShard(SmallSnapshot(r)).ok());
      ASSERT_TRUE(store->Prune(2, r).ok());
    }
  }
  ASSERT_EQ(WriteUntilKilled(dir.path(), 4, 5'000'000, 12 << 20),
            "killed by SIGXFSZ");
  ASSERT_GT(CountRawKeys(dir.path(), 4), 0);

  std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
  EXPECT_EQ(*store->ShardRounds(), (std::vector<int64_t>{2, 3}));
  ASSERT_TRUE(store->WriteShard(SmallSnapshot(5)).ok());
  ASSERT_TRUE(store->Prune(2, 5).ok());
  // Kept: the two newest complete rounds. Gone: older ones, and round 4,
  // which this shard never finished, so no shard can have recorded it.
  EXPECT_EQ(*store->ShardRounds(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(CountRawKeys(dir.path(), 4), 0);
  EXPECT_EQ(CountRawWeightKeys(dir.path(), 2), 0);
  EXPECT_TRUE(store->ReadShard(3).ok());
}

TEST(Checkpoint, CorruptValueNamesRoundAndKey) {
  TempDir dir;
  {
    std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
    ASSERT_TRUE(store->WriteShard(SmallSnapshot(7)).ok());
  }
  {
    // Truncate block 1's value behind the store's back.
    RawCheckpointDb raw(dir.path(), /*read_only=*/false);
    ASSERT_TRUE(raw.status().ok()) << raw.status().ToString();
    EXPECT_TRUE(raw.PutBlock(7, "w", 1, std::string(8 + 4, '\0')).ok());
  }
  std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
  Result<ShardSnapshot> read = store->ReadShard(7);
  EXPECT_EQ(read.status().code(), Code::kCorruption);
  const std::string& m = read.status().message();
  EXPECT_TRUE(Contains(m, dir.path())) << m;
  EXPECT_TRUE(Contains(m, "round 7")) << m;
  EXPECT_TRUE(Contains(m, "corrupt")) << m;
  EXPECT_TRUE(Contains(m, "tensor 'w' block 1")) << m;
  EXPECT_TRUE(Contains(m, "key 0000000000000007")) << m;
}

// --- Failures
// ---------------------------------------------------------------------

TEST(Checkpoint, OpenUnwritableDirNamesIt) {
  TempDir dir;
  const std::string file = dir.path() + "/not_a_dir";
  std::ofstream(file) << "x";
  const std::string under_file = file + "/shard0";
  Result<std::unique_ptr<CheckpointStore>> store =
      CheckpointStore::Open(under_file);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Code::kIoError);
  EXPECT_TRUE(Contains(store.status().message(), under_file))
      << store.status().message();

  Result<std::unique_ptr<CheckpointStore>> missing =
      CheckpointStore::OpenReadOnly(dir.path() + "/missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kIoError);
  EXPECT_TRUE(Contains(missing.status().message(), dir.path() + "/missing"));
}

// A tmpfs of `bytes` mounted on a fresh directory for one test.
class TinyFilesystem {
 public:
  explicit TinyFilesystem(uint64_t bytes) {
    const std::string options = "size=" + std::to_string(bytes);
    if (mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, options.c_str()) != 0) {
      error_ = std::string("mount tmpfs on ") + dir_.path() + ": " +
               std::strerror(errno) + " (this test needs root)";
    }
  }
  ~TinyFilesystem() {
    if (error_.empty()) umount2(dir_.path().c_str(), MNT_DETACH);
  }
  const std::string& path() const { return dir_.path(); }
  const std::string& error() const { return error_; }

 private:
  TempDir dir_;
  std::string error_;
};

TEST(Checkpoint, FullDiskIsAnErrorNotACrash) {
  TinyFilesystem disk(4 << 20);
  ASSERT_TRUE(disk.error().empty()) << disk.error();
  const std::string db_dir = disk.path() + "/shard0";
  std::unique_ptr<CheckpointStore> store = OpenOrDie(db_dir);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->WriteShard(SmallSnapshot(1)).ok());

  Result<uint64_t> written = store->WriteShard(BigSnapshot(2, 2'000'000));
  ASSERT_FALSE(written.ok());
  const Status& s = written.status();
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_TRUE(Contains(s.message(), "space")) << s.message();
  EXPECT_TRUE(Contains(s.message(), db_dir)) << s.message();
  EXPECT_TRUE(Contains(s.message(), "round 2")) << s.message();

  // The earlier round is intact and still the only one.
  EXPECT_EQ(*store->ShardRounds(), std::vector<int64_t>{1});
  Result<ShardSnapshot> one = store->ReadShard(1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(Floats(one->tensors[0].blocks[0].Weights()),
            (std::vector<float>{1.0f, 2.0f}));
  // Later writes fail cleanly too while the disk stays full.
  Result<uint64_t> again = store->WriteShard(BigSnapshot(3, 2'000'000));
  EXPECT_EQ(again.status().code(), Code::kIoError) << again.status().ToString();
  EXPECT_TRUE(Contains(again.status().message(), "space"))
      << again.status().message();
  store.reset();  // closed before the unmount
}

}  // namespace
// --- Opening safely ----------------------------------------------------------

// Every file in `dir` with its bytes.
std::map<std::string, std::string> DirFiles(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    files[e.path().filename().string()] =
        std::string(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

TEST(Checkpoint, OpenNeverStartsANewStoreOverAnOldOne) {
  TempDir dir;
  const std::string db = dir.path() + "/db";
  {
    std::unique_ptr<CheckpointStore> store = OpenOrDie(db);
    ASSERT_TRUE(store->WriteShard(SmallSnapshot(7)).ok());
  }
  std::filesystem::remove(db + "/CURRENT");
  const auto before = DirFiles(db);
  for (auto mode : {CheckpointStore::OpenMode::kCreate,
                    CheckpointStore::OpenMode::kExisting}) {
    auto store = CheckpointStore::Open(db, mode);
    ASSERT_FALSE(store.ok());
    const std::string& m = store.status().message();
    EXPECT_TRUE(Contains(m, db)) << m;
    EXPECT_TRUE(Contains(m, "CURRENT file is missing")) << m;
    EXPECT_TRUE(Contains(m, "nothing was changed")) << m;
    EXPECT_TRUE(Contains(m, "echo MANIFEST-")) << m;
    EXPECT_EQ(DirFiles(db), before);
  }
  EXPECT_FALSE(CheckpointStore::OpenReadOnly(db).ok());
  EXPECT_EQ(DirFiles(db), before);

  // CURRENT naming a MANIFEST that is gone.
  std::ofstream(db + "/CURRENT") << "MANIFEST-999999\n";
  auto named = CheckpointStore::Open(db);
  ASSERT_FALSE(named.ok());
  EXPECT_TRUE(Contains(named.status().message(), "names 'MANIFEST-999999'"))
      << named.status().message();

  // Files that are no store at all.
  const std::string other = dir.path() + "/other";
  std::filesystem::create_directories(other);
  std::ofstream(other + "/notes.txt") << "mine";
  auto foreign = CheckpointStore::Open(other);
  ASSERT_FALSE(foreign.ok());
  EXPECT_TRUE(Contains(foreign.status().message(), "no RocksDB CURRENT"))
      << foreign.status().message();
  EXPECT_EQ(DirFiles(other).size(), 1u);

  // Resuming creates nothing: neither a missing directory nor a store in an
  // empty one.
  const std::string missing = dir.path() + "/missing";
  auto none =
      CheckpointStore::Open(missing, CheckpointStore::OpenMode::kExisting);
  EXPECT_EQ(none.status().code(), Code::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(missing));
  std::filesystem::create_directories(missing);
  none = CheckpointStore::Open(missing, CheckpointStore::OpenMode::kExisting);
  EXPECT_EQ(none.status().code(), Code::kNotFound);
  EXPECT_TRUE(std::filesystem::is_empty(missing));
}

TEST(Checkpoint, ChecksumErrorInSlotsIsReportedAsCorruption) {
  TempDir dir;
  ShardSnapshot snapshot = SmallSnapshot(3);
  snapshot.settings = Settings(OptimizerKind::kAdam, 4);
  snapshot.tensors[0].blocks[0].slots = {0.1f, 0.2f, 0.3f, 0.4f};
  {
    std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
    ASSERT_TRUE(store->WriteShard(snapshot).ok());
  }
  std::vector<std::string> slot_files;
  {
    RawCheckpointDb raw(dir.path(), /*read_only=*/false);
    ASSERT_TRUE(raw.status().ok()) << raw.status().ToString();
    ASSERT_TRUE(raw.FlushAll().ok());
    slot_files = raw.SstFiles("slots");
  }
  ASSERT_FALSE(slot_files.empty());
  for (const std::string& path : slot_files) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    char c = 0;
    f.seekg(10);
    f.get(c);
    f.seekp(10);
    f.put(static_cast<char>(~c));
  }
  std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
  Result<ShardSnapshot> read = store->ReadShard(3);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), Code::kCorruption);
  const std::string& m = read.status().message();
  EXPECT_TRUE(Contains(m, "reading optimizer slots")) << m;
  EXPECT_TRUE(Contains(m, "Corruption")) << m;
  EXPECT_FALSE(Contains(m, "has no optimizer slots")) << m;
}

TEST(Checkpoint, DamagedHeaderMarkerAndRecordAreCorruption) {
  TempDir dir;
  {
    std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
    ASSERT_TRUE(store->WriteShard(SmallSnapshot(7)).ok());
    ASSERT_TRUE(store->WriteShard(SmallSnapshot(8)).ok());
    ASSERT_TRUE(store->MarkComplete(Record(7)).ok());
  }
  {
    RawCheckpointDb raw(dir.path(), /*read_only=*/false);
    ASSERT_TRUE(raw.status().ok()) << raw.status().ToString();
    ASSERT_TRUE(
        raw.PutMeta(checkpoint::MetaKey(checkpoint::kHeaderTag, 7), "{").ok());
    ASSERT_TRUE(
        raw.PutMeta(checkpoint::MetaKey(checkpoint::kMarkerTag, 8), "[]").ok());
    std::string record = checkpoint::RecordToJson(Record(7));
    record.replace(record.find("\"clock\""), 7, "\"clonk\"");
    ASSERT_TRUE(raw.PutMeta(checkpoint::RecordKey(7), record).ok());
  }
  std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
  Result<ShardSnapshot> header = store->ReadShard(7);
  EXPECT_EQ(header.status().code(), Code::kCorruption);
  EXPECT_TRUE(Contains(header.status().message(),
                       "round 7: corrupt: header is not JSON"))
      << header.status().message();
  Result<ShardSnapshot> marker = store->ReadShard(8);
  EXPECT_EQ(marker.status().code(), Code::kCorruption);
  EXPECT_TRUE(Contains(marker.status().message(),
                       "round 8: corrupt: marker is not a JSON object"))
      << marker.status().message();
  Result<std::vector<RoundRecord>> records = store->CompleteRounds();
  EXPECT_EQ(records.status().code(), Code::kCorruption);
  EXPECT_TRUE(Contains(records.status().message(),
                       "round/00000000000000000007: corrupt: record has no "
                       "field 'clock'"))
      << records.status().message();
}

TEST(Checkpoint, IdentityMismatchNamesEveryDifference) {
  ShardSnapshot snapshot = SmallSnapshot(3);
  snapshot.shard_id = 0;
  snapshot.settings.run_id = "aaaa";
  RunSettings run = snapshot.settings;
  EXPECT_EQ(IdentityMismatch(snapshot, 0, run), "");
  run.run_id = "bbbb";
  run.seed = 9;
  const std::string m = IdentityMismatch(snapshot, 1, run);
  EXPECT_TRUE(Contains(m, "shard id 0 in the round, 1 here")) << m;
  EXPECT_TRUE(Contains(m, "run id aaaa in the round, bbbb here")) << m;
  EXPECT_TRUE(Contains(m, "--seed 42 in the round, 9 now")) << m;
}

// --- Checkpointer -----------------------------------------------------------

// While a round is being written, a periodic round is dropped, a requested
// one (a stop's, the dashboard's) waits its turn and is written after it,
// and a third one is refused rather than queued.
TEST(Checkpointer, RequestedRoundWaitsForTheWriteInProgress) {
  TempDir dir;
  std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
  std::promise<void> first_written, release, all_written;
  std::shared_future<void> released = release.get_future().share();
  Mutex mu;
  std::vector<int64_t> written;
  Checkpointer writer(
      store.get(), [&](int64_t round, const Result<uint64_t>& bytes, double) {
        EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
        size_t count = 0;
        {
          MutexLock lock(&mu);
          written.push_back(round);
          count = written.size();
        }
        if (count == 1) {
          first_written.set_value();
          released.wait();  // the writer stays busy until the test says so
        }
        if (count == 2) all_written.set_value();
      });
  using IfBusy = Checkpointer::IfBusy;
  ASSERT_TRUE(writer.Submit(SmallSnapshot(1), IfBusy::kDrop));
  first_written.get_future().wait();
  EXPECT_FALSE(writer.Submit(SmallSnapshot(2), IfBusy::kDrop));
  EXPECT_TRUE(writer.Submit(SmallSnapshot(3), IfBusy::kQueue));
  EXPECT_FALSE(writer.Submit(SmallSnapshot(4), IfBusy::kQueue));
  release.set_value();
  ASSERT_EQ(all_written.get_future().wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  {
    MutexLock lock(&mu);
    EXPECT_EQ(written, (std::vector<int64_t>{1, 3}));
  }
  EXPECT_EQ(*store->ShardRounds(), (std::vector<int64_t>{1, 3}));
}

// A round taken again is not written again: while it is being written the
// request is answered at once; once written, it is reported again (a
// coordinator forgets a round another shard failed). A round whose write
// failed is written when asked again.
TEST(Checkpointer, ARoundIsWrittenOnceAndAFailedOneAgain) {
  TempDir dir;
  std::unique_ptr<CheckpointStore> store = OpenOrDie(dir.path());
  struct Report {
    int64_t round;
    bool ok;
    uint64_t bytes;
    double seconds;
  };
  Mutex mu;
  CondVar cv;
  std::vector<Report> reports;
  Checkpointer writer(store.get(), [&](int64_t round,
                                       const Result<uint64_t>& bytes,
                                       double seconds) {
    MutexLock lock(&mu);
    reports.push_back({round, bytes.ok(), bytes.ok() ? *bytes : 0, seconds});
    cv.SignalAll();
  });
  auto await = [&](size_t n) {
    MutexLock lock(&mu);
    const auto end =
        std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (reports.size() < n && std::chrono::steady_clock::now() < end) {
      cv.WaitFor(mu, std::chrono::milliseconds(100));
    }
    return reports.size() >= n;
  };
  using IfBusy = Checkpointer::IfBusy;
  // Round 5 fails (a block that does not fit its shape)...
  ShardSnapshot bad = SmallSnapshot(5);
  bad.tensors[0].blocks[0].weights.push_back(1.0f);
  ASSERT_TRUE(writer.Submit(std::move(bad), IfBusy::kQueue));
  ASSERT_TRUE(await(1));
  // ...and is written when asked again.
  ASSERT_TRUE(writer.Submit(SmallSnapshot(5), IfBusy::kQueue));
  ASSERT_TRUE(await(2));
  // Asked a third time: reported again, not rewritten.
  ASSERT_TRUE(writer.Submit(SmallSnapshot(5), IfBusy::kDrop));
  ASSERT_TRUE(await(3));
  MutexLock lock(&mu);
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[0].round, 5);
  EXPECT_FALSE(reports[0].ok);
  EXPECT_TRUE(reports[1].ok);
  EXPECT_GT(reports[1].seconds, 0.0);
  EXPECT_TRUE(reports[2].ok);
  EXPECT_EQ(reports[2].bytes, reports[1].bytes);
  EXPECT_EQ(reports[2].seconds, 0.0);
  EXPECT_EQ(*store->ShardRounds(), (std::vector<int64_t>{5}));
}

}  // namespace tether
