// Checkpoints: one shard's slice of the parameters (weights, optimizer
// slots, update counts) and run state, written into the shard's own RocksDB
// under --data-dir, tagged with a round number. Shard 0 also records each
// round as complete -- with every worker's clock and data position, the
// seeds and the run configuration -- once every shard has written it; only
// complete rounds are ever resumed.
//
// CheckpointStore is thread-safe (RocksDB is); one per shard process.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "schema/status.h"
#include "server/initializer.h"
#include "server/run_settings.h"

namespace tether {

// A dense tensor's blocks held by one shard.
struct TensorSnapshot {
  uint32_t id = 0;
  std::string name;
  std::vector<uint64_t> shape;
  InitSpec init;
  struct Block {
    uint32_t index = 0;
    uint64_t step = 0;           // updates applied (Adam's t)
    std::vector<float> weights;  // the block's length
    std::vector<float> slots;    // slots_per_weight * length, slot-major
    // ParamStore::Snapshot and CheckpointStore::ReadShard fill these instead
    // of the copies above: buffers that nobody writes into while they are
    // shared (a store's update writes a new buffer and swaps it in). So
    // taking a snapshot copies nothing, and ParamStore::Restore of a round
    // read from disk takes the buffers it was read into as its own.
    struct Buffers {
      std::shared_ptr<float[]> weights;  // `len` floats
      std::shared_ptr<float[]> slots;    // `slots_len` floats (may be null)
    };
    std::shared_ptr<const Buffers> shared;
    std::span<const float> shared_weights;
    std::span<const float> shared_slots;

    // A block held in `weights` (`len` floats) and `slots`, shared.
    static Block Shared(uint32_t index, uint64_t step,
                        std::shared_ptr<float[]> weights, size_t len,
                        std::shared_ptr<float[]> slots, size_t slots_len);

    // The weights and slots, wherever they are held.
    std::span<const float> Weights() const {
      return shared ? shared_weights : std::span<const float>(weights);
    }
    std::span<const float> Slots() const {
      return shared ? shared_slots : std::span<const float>(slots);
    }
  };
  std::vector<Block> blocks;  // only blocks this shard has touched
};

// A sparse table's rows held by one shard.
struct TableSnapshot {
  uint32_t id = 0;
  std::string name;
  uint32_t dim = 0;
  InitSpec init;
  struct Row {
    uint64_t key = 0;
    uint64_t step = 0;
    std::vector<float> weights;  // dim
    std::vector<float> slots;    // slots_per_weight * dim, slot-major
  };
  std::vector<Row> rows;
};

// Where a worker is in its data when a round is taken.
struct WorkerPosition {
  int rank = 0;
  int64_t clock = 0;
  int epoch = 0;
  uint64_t samples = 0;  // samples processed so far
};

// Everything one shard writes for a round.
struct ShardSnapshot {
  int64_t round = 0;
  int shard_id = 0;
  int64_t min_clock = 0;               // the clock the round was taken at
  std::vector<int64_t> worker_clocks;  // by rank, on this shard
  // With --record: the events of the shard's recording before the round
  // (server/recording.h); 0 otherwise and in rounds written before it.
  uint64_t record_events = 0;
  RunSettings settings;
  std::vector<TensorSnapshot> tensors;
  std::vector<TableSnapshot> tables;
};

// What shard 0 records when every shard has written a round.
struct RoundRecord {
  int64_t round = 0;
  int64_t clock = 0;     // min clock the round was taken at
  int64_t unix_ms = 0;   // when it completed
  uint64_t bytes = 0;    // written by all shards together
  RunSettings settings;  // includes the seed and shard/worker counts
  std::vector<WorkerPosition> workers;
  // Shard 0's data assignment when the round completed (DataProgress as
  // JSON, server/data_progress.h); "" in rounds written before it was kept.
  std::string data;
  // The run manifest when the round completed (server/manifest.h); "" in
  // rounds written before it was kept.
  std::string manifest;
};

// "" when `snapshot` (a round read from a shard's data dir) belongs to shard
// `shard_id` of the run `run` describes: the same shard id and run id, and
// the settings SettingsMismatch compares (seed, shard count, block size,
// optimizer; not the worker count, which a resume may change). Else what
// differs, e.g. "shard id 0 in the round, 1 here; run id 6f1c... in the round,
// 92ab... here".
std::string IdentityMismatch(const ShardSnapshot& snapshot, int shard_id,
                             const RunSettings& run);

class CheckpointStore {
 public:
  // What Open may do with the directory.
  enum class OpenMode {
    kCreate,    // a missing or empty directory gets a new store
    kExisting,  // the store must already be there (resuming)
  };
  // Opens the RocksDB at `dir`. A store is created only in a missing or
  // empty directory, and only with kCreate: a non-empty directory without
  // RocksDB's CURRENT file is refused (RocksDB would otherwise start a new
  // database over the old files and delete them), with a message naming
  // the missing file and how to recover it. A store that is there is first
  // opened read-only, so an open that fails has changed nothing on disk.
  // kNotFound when kExisting finds no store (nothing is created);
  // kCorruption naming `dir` when RocksDB finds its files damaged; kIoError
  // naming `dir` when it cannot be created or opened otherwise (permissions,
  // a file in the way, another process holding it, missing metadata).
  static Result<std::unique_ptr<CheckpointStore>> Open(
      const std::string& dir, OpenMode mode = OpenMode::kCreate);
  // Opens an existing store for reading only (tools), without taking the
  // lock, so a shard process holding it keeps running undisturbed. Write
  // methods return kInvalidArgument. kIoError naming `dir` when it is
  // missing or not a checkpoint store; kCorruption when it is damaged.
  static Result<std::unique_ptr<CheckpointStore>> OpenReadOnly(
      const std::string& dir);
  ~CheckpointStore();

  // Writes this shard's slice for snapshot.round. The round becomes
  // visible to ShardRounds/ReadShard only once every key is durably
  // written (a marker written last, with sync), so a crash mid-write
  // leaves no half round that could be read. Returns the bytes written,
  // or kIoError with RocksDB's message (e.g. "No space left on device")
  // naming the directory and round; a failed write leaves earlier rounds
  // intact.
  Result<uint64_t> WriteShard(const ShardSnapshot& snapshot);
  // How ReadShard reads: a round of at least 2 * part_bytes is cut into
  // key ranges of about part_bytes, read on up to `threads` threads (0: two
  // per core, up to 8). The result is the same however it was read.
  struct ReadOptions {
    size_t threads = 0;
    uint64_t part_bytes = uint64_t{32} << 20;
  };
  // kNotFound when this shard has no complete copy of `round`; kCorruption
  // naming the round and key when stored values do not decode or fail
  // RocksDB's checksums; kIoError when they cannot be read. Blocks come in
  // the buffers they were read into (TensorSnapshot::Block::shared), which
  // ParamStore::Restore takes without copying.
  Result<ShardSnapshot> ReadShard(int64_t round,
                                  const ReadOptions& options) const;
  Result<ShardSnapshot> ReadShard(int64_t round) const {
    return ReadShard(round, ReadOptions{});
  }
  // Rounds this shard has completely written, ascending.
  Result<std::vector<int64_t>> ShardRounds() const;

  // Shard 0: records `record` as a complete round (sync).
  Status MarkComplete(const RoundRecord& record);
  // Shard 0: complete rounds, ascending by round. kCorruption naming the
  // record when one does not decode.
  Result<std::vector<RoundRecord>> CompleteRounds() const;

  // Deletes every round older than the newest `keep` complete ones (their
  // shard slices and records), and any incomplete round older than the
  // newest complete one. `newest_complete` is the newest complete round
  // as shard 0 knows it (other shards have no records); -1 for none.
  // Each call's `newest_complete` is remembered: that is how a shard
  // without records learns which rounds completed, so call it once per
  // completed round. A shard that knows fewer than `keep` complete rounds
  // deletes only rounds it never finished writing. kInvalidArgument for
  // keep < 1; kIoError naming the directory.
  Status Prune(int keep, int64_t newest_complete);

  const std::string& dir() const { return dir_; }

 private:
  struct Impl;
  CheckpointStore(std::string dir, std::unique_ptr<Impl> impl);
  std::string dir_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tether
