// A round written by N shards, merged and cut again for N' shards
// (server/round_merge.h), in memory and from real stores.
#include "server/round_merge.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "schema/slicing.h"
#include "server/param_store.h"
#include "tests/support/temp_dir.h"

namespace tether {
namespace {

using testing::TempDir;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

RunSettings Settings(int shards) {
  RunSettings s;
  s.run_id = "run-a";
  s.num_shards = shards;
  s.num_workers = 2;
  s.seed = 5;
  s.block_size = 4;
  s.optimizer.kind = OptimizerKind::kAdam;  // two slots per weight
  return s;
}

// Round 60 of a run on `shards` shards: tensor "w" (10 floats: blocks 0..2,
// block 1 never touched), tensor "idle" (no block held anywhere) and table
// "emb" (dim 2, rows 1..20), each block and row on the shard the default
// slicer names, its values telling which it is.
std::vector<ShardSnapshot> Slices(int shards) {
  std::vector<ShardSnapshot> slices(shards);
  for (int k = 0; k < shards; ++k) {
    ShardSnapshot& s = slices[k];
    s.round = 60;
    s.shard_id = k;
    s.min_clock = 60;
    s.worker_clocks = {61, 60};
    s.settings = Settings(shards);
    TensorSnapshot& w = s.tensors.emplace_back();
    w.id = NameId("w");
    w.name = "w";
    w.shape = {5, 2};
    w.init.kind = InitSpec::Kind::kUniform;
    w.init.scale = 0.5f;
    for (uint32_t b : {0u, 2u}) {
      if (DefaultDenseShard(w.id, b, shards) != k) continue;
      TensorSnapshot::Block& block = w.blocks.emplace_back();
      block.index = b;
      block.step = 10 + b;
      const uint32_t len = b == 2 ? 2 : 4;
      for (uint32_t i = 0; i < len; ++i) block.weights.push_back(b + i * 0.1f);
      for (uint32_t i = 0; i < 2 * len; ++i) block.slots.push_back(-1.0f * i);
    }
    TensorSnapshot& idle = s.tensors.emplace_back();
    idle.id = NameId("idle");
    idle.name = "idle";
    idle.shape = {3};
    TableSnapshot& emb = s.tables.emplace_back();
    emb.id = NameId("emb");
    emb.name = "emb";
    emb.dim = 2;
    for (uint64_t key = 1; key <= 20; ++key) {
      if (DefaultSparseShard(emb.id, key, shards) != k) continue;
      TableSnapshot::Row& row = emb.rows.emplace_back();
      row.key = key;
      row.step = key;
      row.weights = {float(key), float(key) + 0.5f};
      row.slots = {1, 2, 3, float(key)};
    }
  }
  return slices;
}

std::string At(size_t k) { return "shard " + std::to_string(k); }

// Every block and row of `slices` by (name, index or key): step, weights,
// slots, and the shard holding it.
using Held =
    std::map<std::pair<std::string, uint64_t>,
             std::tuple<uint64_t, std::vector<float>, std::vector<float>, int>>;
Held Everything(const std::vector<ShardSnapshot>& slices) {
  Held out;
  for (const ShardSnapshot& s : slices) {
    for (const TensorSnapshot& t : s.tensors) {
      for (const TensorSnapshot::Block& b : t.blocks) {
        EXPECT_TRUE(
            out.try_emplace({t.name, b.index},
                            std::tuple{b.step,
                                       std::vector<float>(b.Weights().begin(),
                                                          b.Weights().end()),
                                       std::vector<float>(b.Slots().begin(),
                                                          b.Slots().end()),
                                       s.shard_id})
                .second);
      }
    }
    for (const TableSnapshot& t : s.tables) {
      for (const TableSnapshot::Row& r : t.rows) {
        EXPECT_TRUE(
            out.try_emplace({t.name, r.key},
                            std::tuple{r.step, r.weights, r.slots, s.shard_id})
                .second);
      }
    }
  }
  return out;
}

TEST(RoundMerge, TwoShardsCutForThreeAndOneKeepEveryValueWhereTheSlicerSays) {
  const std::vector<ShardSnapshot> two = Slices(2);
  std::vector<std::string> problems;
  const MergedRound merged = MergeSlices(two, 4, At, &problems);
  ASSERT_TRUE(problems.empty()) << problems[0];
  ASSERT_EQ(merged.tensors.size(), 2u);
  EXPECT_EQ(merged.tensors.at("w").num_blocks, 3u);
  EXPECT_EQ(merged.tensors.at("w").blocks.size(), 2u);
  EXPECT_EQ(merged.tables.at("emb").rows.size(), 20u);

  const Held before = Everything(two);
  for (int n : {3, 1, 2}) {
    std::vector<ShardSnapshot> parts;
    for (int k = 0; k < n; ++k) parts.push_back(PartFor(merged, two[0], k, n));
    for (int k = 0; k < n; ++k) {
      const ShardSnapshot& p = parts[k];
      EXPECT_EQ(p.shard_id, k);
      EXPECT_EQ(p.round, 60);
      EXPECT_EQ(p.min_clock, 60);
      EXPECT_EQ(p.worker_clocks, (std::vector<int64_t>{61, 60}));
      EXPECT_EQ(p.settings.num_shards, 2) << "the writers' count stays";
      // Every shard defines every tensor and table, held or not.
      ASSERT_EQ(p.tensors.size(), 2u);
      ASSERT_EQ(p.tables.size(), 1u);
      for (const TensorSnapshot& t : p.tensors) {
        const TensorSnapshot& def =
            t.name == "w" ? two[0].tensors[0] : two[0].tensors[1];
        EXPECT_EQ(t.id, def.id);
        EXPECT_EQ(t.shape, def.shape);
        EXPECT_EQ(t.init, def.init);
      }
      EXPECT_EQ(p.tables[0].dim, 2u);
    }
    const Held after = Everything(parts);
    ASSERT_EQ(after.size(), before.size()) << n << " shards";
    for (const auto& [what, held] : after) {
      const auto& [step, weights, slots, shard] = held;
      const auto& [step0, weights0, slots0, shard0] = before.at(what);
      EXPECT_EQ(step, step0) << what.first << " " << what.second;
      EXPECT_EQ(weights, weights0) << what.first << " " << what.second;
      EXPECT_EQ(slots, slots0) << what.first << " " << what.second;
      const uint32_t id = NameId(what.first);
      const int owner =
          what.first == "emb"
              ? DefaultSparseShard(id, what.second, n)
              : DefaultDenseShard(id, static_cast<uint32_t>(what.second), n);
      EXPECT_EQ(shard, owner) << what.first << " " << what.second;
    }
  }
}

TEST(RoundMerge, InconsistentSlicesAreProblemsNamingWhere) {
  std::vector<ShardSnapshot> two = Slices(2);
  // Shard 1 holds shard 0's first row too, and defines "idle" otherwise.
  const ShardSnapshot& zero = two[0];
  ASSERT_FALSE(zero.tables[0].rows.empty());
  two[1].tables[0].rows.push_back(zero.tables[0].rows[0]);
  two[1].tensors[1].shape = {4};
  std::vector<std::string> problems;
  MergeSlices(two, 4, At, &problems);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_TRUE(Contains(problems[0],
                       "shard 1: tensor 'idle' is [4] zeros, "
                       "elsewhere [3] zeros"))
      << problems[0];
  EXPECT_TRUE(
      Contains(problems[1], "shard 1: table 'emb' row " +
                                std::to_string(zero.tables[0].rows[0].key) +
                                " is also held by shard 0"))
      << problems[1];
}

// The slices written into real stores, one data dir each.
std::vector<std::string> WriteStores(const std::string& root,
                                     const std::vector<ShardSnapshot>& slices) {
  std::vector<std::string> dirs;
  for (const ShardSnapshot& s : slices) {
    dirs.push_back(root + "/shard" + std::to_string(s.shard_id));
    auto store = CheckpointStore::Open(dirs.back());
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    if (store.ok()) {
      EXPECT_TRUE((*store)->WriteShard(s).ok());
    }
  }
  return dirs;
}

TEST(RoundMerge, ReadRoundPartFromEveryOldShardsStore) {
  TempDir dir;
  const std::vector<ShardSnapshot> two = Slices(2);
  const std::vector<std::string> dirs = WriteStores(dir.path(), two);
  const RunSettings run = Settings(3);  // the resumed run: 3 shards

  // In any order; every value lands where the slicer says, nowhere else.
  std::vector<ShardSnapshot> parts;
  for (int k = 0; k < 3; ++k) {
    auto part = ReadRoundPart({dirs[1], dirs[0]}, 60, run, k);
    ASSERT_TRUE(part.ok()) << part.status().ToString();
    parts.push_back(std::move(*part));
  }
  const Held before = Everything(two), after = Everything(parts);
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [what, held] : after) {
    EXPECT_EQ(std::get<1>(held), std::get<1>(before.at(what)));
    EXPECT_EQ(std::get<2>(held), std::get<2>(before.at(what)));
  }
}

TEST(RoundMerge, AMissingWrongOrRepeatedDirIsRefusedNamingIt) {
  TempDir dir;
  const std::vector<std::string> dirs = WriteStores(dir.path(), Slices(2));
  const RunSettings run = Settings(3);
  auto message = [&](const std::vector<std::string>& given, int64_t round,
                     const RunSettings& r) {
    auto part = ReadRoundPart(given, round, r, 0);
    EXPECT_FALSE(part.ok());
    return part.ok() ? std::string() : part.status().message();
  };
  std::string m = message({dirs[0]}, 60, run);
  EXPECT_TRUE(Contains(m, "round 60 was written by 2 shards")) << m;
  EXPECT_TRUE(Contains(m, "holds shard 1's slice")) << m;

  m = message({dirs[0], dir.path() + "/nowhere"}, 60, run);
  EXPECT_TRUE(Contains(m, dir.path() + "/nowhere")) << m;
  EXPECT_TRUE(Contains(m, "does not exist")) << m;

  m = message({dirs[0], dirs[1]}, 61, run);
  EXPECT_TRUE(Contains(m, dirs[0] + ": round 61")) << m;

  m = message({dirs[0], dirs[0], dirs[1]}, 60, run);
  EXPECT_TRUE(Contains(m, "shard 0's slice, which " + dirs[0] + " holds too"))
      << m;

  RunSettings other = run;
  other.run_id = "run-b";
  m = message(dirs, 60, other);
  EXPECT_TRUE(Contains(m, "not a slice of this run")) << m;
  EXPECT_TRUE(Contains(m, "run id run-a in the round, run-b here")) << m;

  // The worker count is free; the seed is not.
  RunSettings more_workers = run;
  more_workers.num_workers = 7;
  EXPECT_TRUE(ReadRoundPart(dirs, 60, more_workers, 0).ok());
  RunSettings other_seed = run;
  other_seed.seed = 6;
  m = message(dirs, 60, other_seed);
  EXPECT_TRUE(Contains(m, "--seed 5 in the round, 6 now")) << m;
}

}  // namespace
}  // namespace tether
