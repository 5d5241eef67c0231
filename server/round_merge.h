// A checkpoint round as one whole, whatever number of shards wrote it:
// every shard's slice read from its data dir and checked to belong to one
// round of one run (ReadRoundSlices), the slices merged (MergeSlices), and
// the part a shard of another shard count holds under the default slicer
// (PartFor). tether-ckpt assembles whole tensors from a MergedRound; a
// shard resumed on another number of shards (--reshard-from) loads its
// part (ReadRoundPart).
//
// Pure functions but for the reads; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "schema/status.h"
#include "server/checkpoint.h"
#include "server/run_settings.h"

namespace tether {

// The slices of a round merged: each tensor and table defined once, every
// block and row with the index (in the slices given) of the slice holding
// it. Points into those slices: valid while they are, unchanged.
struct MergedRound {
  struct Tensor {
    const TensorSnapshot* def = nullptr;  // the first slice's definition
    uint64_t numel = 0;
    uint64_t num_blocks = 0;
    std::map<uint32_t, std::pair<size_t, const TensorSnapshot::Block*>> blocks;
  };
  struct Table {
    const TableSnapshot* def = nullptr;
    // By key, ascending; the row is null when it does not fit the dim.
    std::map<uint64_t, std::pair<size_t, const TableSnapshot::Row*>> rows;
  };
  std::map<std::string, Tensor> tensors;  // by name
  std::map<std::string, Table> tables;    // by name
};

// Merges `slices` (a round's, by shard id) of a run with `block_size`.
// Every inconsistency is appended to `problems`, prefixed with where(i) for
// slice i, and what it concerns is left out: a tensor or table defined
// differently by two slices (e.g. "...: tensor 'w' is [4, 2] zeros,
// elsewhere [8] zeros"), a block or row two slices hold ("... is also held
// by shard 1"), a block or row of the wrong length.
MergedRound MergeSlices(std::span<const ShardSnapshot> slices,
                        uint32_t block_size,
                        const std::function<std::string(size_t)>& where,
                        std::vector<std::string>* problems);

// The part of `merged` shard `shard_id` of `num_shards` holds under the
// default slicer (schema/slicing.h): every tensor's and table's definition
// (as any shard defines every one), and the blocks and rows it owns, copied
// unchanged: weights, optimizer slots, update counts. The round, clocks and
// settings come from `like` (one of the round's slices: its settings keep
// the shard count that wrote the round); shard_id is `shard_id`.
ShardSnapshot PartFor(const MergedRound& merged, const ShardSnapshot& like,
                      int shard_id, int num_shards);

// Reads round `round` from each data dir in `dirs` (in any order), each
// opened read-only (CheckpointStore::OpenReadOnly), and returns the slices
// by shard id. Together they must be the whole round: one slice per shard
// of the count they record, each of the run `run` describes (run id, seed,
// block size, optimizer: IdentityMismatch, but for the shard and worker
// counts) and taken at the same clock. Errors name the dir: kIoError when
// it is missing or not a checkpoint store, kNotFound when it holds no
// complete copy of the round, kCorruption when that is damaged;
// kInvalidArgument for a slice of another run, two dirs holding the same
// shard's slice, or a shard's slice in none of them (naming the count).
// Fills *from, when given, with the dir each slice came from.
Result<std::vector<ShardSnapshot>> ReadRoundSlices(
    const std::vector<std::string>& dirs, int64_t round, const RunSettings& run,
    std::vector<std::string>* from = nullptr);

// ReadRoundSlices, MergeSlices (any problem is kInvalidArgument naming the
// first), then PartFor(shard_id, run.num_shards).
Result<ShardSnapshot> ReadRoundPart(const std::vector<std::string>& dirs,
                                    int64_t round, const RunSettings& run,
                                    int shard_id);

}  // namespace tether
