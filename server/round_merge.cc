#include "server/round_merge.h"

#include <algorithm>
#include <memory>

#include "schema/slicing.h"
#include "server/param_store.h"

namespace tether {
namespace {

void MergeTensor(const TensorSnapshot& t, size_t k, uint32_t block_size,
                 const std::string& where, MergedRound* m,
                 std::vector<std::string>* problems) {
  MergedRound::Tensor& d = m->tensors[t.name];
  if (d.def == nullptr) {
    d.def = &t;
    d.numel = 1;
    for (uint64_t n : t.shape) d.numel *= n;
    d.num_blocks = d.numel == 0 ? 0 : (d.numel - 1) / block_size + 1;
  } else if (d.def->shape != t.shape || d.def->init != t.init ||
             d.def->id != t.id) {
    problems->push_back(where + ": tensor '" + t.name + "' is " +
                        ShapeString(t.shape) + " " + InitString(t.init) +
                        ", elsewhere " + ShapeString(d.def->shape) + " " +
                        InitString(d.def->init));
    return;
  }
  for (const TensorSnapshot::Block& b : t.blocks) {
    const std::string what =
        where + ": tensor '" + t.name + "' block " + std::to_string(b.index);
    auto [it, first] = d.blocks.try_emplace(b.index, k, &b);
    if (!first) {
      problems->push_back(what + " is also held by shard " +
                          std::to_string(it->second.first));
      continue;
    }
    const uint64_t begin = uint64_t{b.index} * block_size;
    const uint64_t len =
        begin < d.numel ? std::min<uint64_t>(block_size, d.numel - begin) : 0;
    if (b.Weights().size() != len) {
      it->second.second = nullptr;
      problems->push_back(what + " has " + std::to_string(b.Weights().size()) +
                          " floats, expected " + std::to_string(len));
    }
  }
}

void MergeTable(const TableSnapshot& t, size_t k, const std::string& where,
                MergedRound* m, std::vector<std::string>* problems) {
  MergedRound::Table& s = m->tables[t.name];
  if (s.def == nullptr) {
    s.def = &t;
  } else if (s.def->dim != t.dim || s.def->init != t.init ||
             s.def->id != t.id) {
    problems->push_back(where + ": table '" + t.name + "' has dim " +
                        std::to_string(t.dim) + ", elsewhere " +
                        std::to_string(s.def->dim));
    return;
  }
  for (const TableSnapshot::Row& r : t.rows) {
    const std::string what =
        where + ": table '" + t.name + "' row " + std::to_string(r.key);
    auto [it, first] = s.rows.try_emplace(r.key, k, &r);
    if (!first) {
      problems->push_back(what + " is also held by shard " +
                          std::to_string(it->second.first));
    } else if (r.weights.size() != t.dim) {
      it->second.second = nullptr;
      problems->push_back(what + " has " + std::to_string(r.weights.size()) +
                          " floats, expected " + std::to_string(t.dim));
    }
  }
}

}  // namespace

MergedRound MergeSlices(std::span<const ShardSnapshot> slices,
                        uint32_t block_size,
                        const std::function<std::string(size_t)>& where,
                        std::vector<std::string>* problems) {
  MergedRound m;
  for (size_t k = 0; k < slices.size(); ++k) {
    const std::string at = where(k);
    for (const TensorSnapshot& t : slices[k].tensors) {
      MergeTensor(t, k, block_size, at, &m, problems);
    }
    for (const TableSnapshot& t : slices[k].tables) {
      MergeTable(t, k, at, &m, problems);
    }
  }
  return m;
}

ShardSnapshot PartFor(const MergedRound& merged, const ShardSnapshot& like,
                      int shard_id, int num_shards) {
  ShardSnapshot part;
  part.round = like.round;
  part.shard_id = shard_id;
  part.min_clock = like.min_clock;
  part.worker_clocks = like.worker_clocks;
  part.settings = like.settings;
  for (const auto& [name, d] : merged.tensors) {
    TensorSnapshot& t = part.tensors.emplace_back();
    t.id = d.def->id;
    t.name = name;
    t.shape = d.def->shape;
    t.init = d.def->init;
    for (const auto& [index, held] : d.blocks) {
      const TensorSnapshot::Block* b = held.second;
      if (b == nullptr ||
          DefaultDenseShard(t.id, index, num_shards) != shard_id) {
        continue;
      }
      TensorSnapshot::Block& copy = t.blocks.emplace_back();
      copy.index = index;
      copy.step = b->step;
      copy.weights.assign(b->Weights().begin(), b->Weights().end());
      copy.slots.assign(b->Slots().begin(), b->Slots().end());
    }
  }
  for (const auto& [name, s] : merged.tables) {
    TableSnapshot& t = part.tables.emplace_back();
    t.id = s.def->id;
    t.name = name;
    t.dim = s.def->dim;
    t.init = s.def->init;
    for (const auto& [key, held] : s.rows) {
      const TableSnapshot::Row* r = held.second;
      if (r == nullptr ||
          DefaultSparseShard(t.id, key, num_shards) != shard_id) {
        continue;
      }
      t.rows.push_back(*r);
    }
  }
  return part;
}

Result<std::vector<ShardSnapshot>> ReadRoundSlices(
    const std::vector<std::string>& dirs, int64_t round, const RunSettings& run,
    std::vector<std::string>* from) {
  const std::string what = "round " + std::to_string(round);
  std::vector<ShardSnapshot> read;
  std::vector<std::string> read_from;
  for (const std::string& dir : dirs) {
    TETHER_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store,
                            CheckpointStore::OpenReadOnly(dir));
    TETHER_ASSIGN_OR_RETURN(ShardSnapshot slice, store->ReadShard(round));
    const std::string where = "checkpoint dir " + dir + ": " + what;
    const int written_by = slice.settings.num_shards;
    if (!read.empty() && written_by != read[0].settings.num_shards) {
      return InvalidArgument(
          where + ": written by " + std::to_string(written_by) +
          " shards, but the round in " + read_from[0] + " by " +
          std::to_string(read[0].settings.num_shards) +
          ": they are not the same round");
    }
    if (!read.empty() && slice.min_clock != read[0].min_clock) {
      return InvalidArgument(
          where + ": taken at clock " + std::to_string(slice.min_clock) +
          ", in " + read_from[0] + " at " + std::to_string(read[0].min_clock) +
          ": they are not the same round");
    }
    // Of this run, but with the count of shards that wrote the round.
    RunSettings writers = run;
    writers.num_shards = written_by;
    if (std::string mismatch = IdentityMismatch(slice, slice.shard_id, writers);
        !mismatch.empty()) {
      return InvalidArgument(where + ": not a slice of this run: " + mismatch);
    }
    for (size_t i = 0; i < read.size(); ++i) {
      if (read[i].shard_id == slice.shard_id) {
        return InvalidArgument(
            where + ": shard " + std::to_string(slice.shard_id) +
            "'s slice, which " + read_from[i] + " holds too");
      }
    }
    read.push_back(std::move(slice));
    read_from.push_back(dir);
  }
  if (read.empty()) return InvalidArgument(what + ": no data dir given");
  const int written_by = read[0].settings.num_shards;
  std::vector<ShardSnapshot> slices(written_by);
  std::vector<std::string> dir_of(written_by);
  std::vector<bool> found(written_by, false);
  for (size_t i = 0; i < read.size(); ++i) {
    const int k = read[i].shard_id;
    if (k < 0 || k >= written_by) {
      return InvalidArgument("checkpoint dir " + read_from[i] + ": " + what +
                             ": a slice of shard " + std::to_string(k) +
                             " of " + std::to_string(written_by));
    }
    found[k] = true;
    slices[k] = std::move(read[i]);
    dir_of[k] = read_from[i];
  }
  for (int k = 0; k < written_by; ++k) {
    if (!found[k]) {
      return InvalidArgument(
          what + " was written by " + std::to_string(written_by) +
          " shards, and none of the " + std::to_string(dirs.size()) +
          " data dirs given holds shard " + std::to_string(k) +
          "'s slice: give every shard's data dir");
    }
  }
  if (from != nullptr) *from = std::move(dir_of);
  return slices;
}

Result<ShardSnapshot> ReadRoundPart(const std::vector<std::string>& dirs,
                                    int64_t round, const RunSettings& run,
                                    int shard_id) {
  std::vector<std::string> from;
  TETHER_ASSIGN_OR_RETURN(std::vector<ShardSnapshot> slices,
                          ReadRoundSlices(dirs, round, run, &from));
  std::vector<std::string> problems;
  MergedRound merged = MergeSlices(
      slices, slices[0].settings.block_size,
      [&](size_t k) {
        return "round " + std::to_string(round) + ": shard " +
               std::to_string(k) + " (" + from[k] + ")";
      },
      &problems);
  if (!problems.empty()) {
    return InvalidArgument(
        problems[0] +
        (problems.size() > 1
             ? " (and " + std::to_string(problems.size() - 1) + " more)"
             : ""));
  }
  return PartFor(merged, slices[0], shard_id, run.num_shards);
}

}  // namespace tether
