// Reading a checkpoint round back (CheckpointStore::ReadShard): the data
// keys decoded and checked against the round's header into a ShardSnapshot,
// a large round in key ranges read on several threads. Internal to
// server/checkpoint.cc and its tests; the key layout is described there.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/slice.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "schema/status.h"
#include "server/checkpoint.h"
#include "server/checkpoint_codec.h"
#include "server/checkpoint_keys.h"

namespace tether::checkpoint {

inline std::string Hex(const rocksdb::Slice& s) {
  return s.ToString(/*hex=*/true);
}

inline uint64_t FloatBytes(size_t n) { return uint64_t{n} * sizeof(float); }

// The geometry of a dense tensor, from its shape and the block size.
struct DenseLayout {
  uint64_t numel = 0;
  uint64_t num_blocks = 0;
  uint32_t block_size = 0;

  uint32_t BlockLen(uint32_t block) const {
    return static_cast<uint32_t>(
        std::min<uint64_t>(numel - uint64_t{block} * block_size, block_size));
  }
};

// Empty string when `shape` is usable with `block_size`, else the problem.
std::string MakeLayout(const std::vector<uint64_t>& shape, uint32_t block_size,
                       DenseLayout* layout);

// The one place RocksDB's statuses become tether's: kCorruption for damage
// RocksDB detects (a checksum mismatch, a damaged file), else kIoError.
Status IoError(const std::string& where, const std::string& doing,
               const rocksdb::Status& s);
// Damage tether's own checks find: a value that does not decode, a key
// missing or out of place.
Status Corrupt(const std::string& where, const std::string& problem);

// Fills a round's snapshot from its data keys, in key order, checking each
// against the header: it names a block or row the header defines, and its
// weights and slots have the lengths the shape (or dim) and the optimizer
// call for. Every failure is kCorruption naming the round and key.
class SliceReader {
 public:
  SliceReader(std::string where, ShardHeader header)
      : where_(std::move(where)),
        snap_(std::move(header.snapshot)),
        blocks_(std::move(header.blocks)),
        rows_(std::move(header.rows)) {}

  // Indexes the header's tensors and tables; refuses an unusable shape.
  Status Start();

  // What one range of keys held, in key order: ranges are read on threads
  // of their own, each into its Part, and put together by Merge.
  struct Part {
    std::vector<std::pair<size_t, TensorSnapshot::Block>> blocks;  // tensor
    std::vector<std::pair<size_t, TableSnapshot::Row>> rows;       // table
    uint64_t keys = 0;
  };
  // Keys that cut round `round`'s data into ranges of about as many bytes
  // (by the header's promised blocks), at most `max_parts` and none under
  // `part_bytes`: one more key than ranges, the first the round's first
  // key, the last the next round's.
  std::vector<std::string> Bounds(int64_t round, size_t max_parts,
                                  uint64_t part_bytes) const;
  // Adds the block or row at `key`, whose weights value is `value`, to
  // `part`; when the optimizer has slots, takes them from `slots`, an
  // iterator over the slots family at the same key, and moves it on.
  Status Add(const rocksdb::Slice& key, const rocksdb::Slice& value,
             rocksdb::Iterator* slots, Part* part) const;
  // The parts, in key order.
  void Merge(std::vector<Part>&& parts);
  // After the last key: the keys read match the marker's count, and the
  // blocks and rows the header's.
  Status Finish(uint64_t marker_keys);
  ShardSnapshot Take() && { return std::move(snap_); }

 private:
  // Where a key's block or row goes, and its length in weights.
  struct Target {
    size_t index = 0;  // into snap_.tensors, or snap_.tables for a row
    uint64_t len = 0;
    std::string what;  // e.g. "tensor 'w' block 1 (key 00...)"
  };
  Result<Target> Locate(const DataKey& key, const std::string& at) const;
  Result<std::shared_ptr<float[]>> TakeSlots(const rocksdb::Slice& key,
                                             const Target& target,
                                             rocksdb::Iterator* slots,
                                             Part* part) const;

  const std::string where_;
  ShardSnapshot snap_;
  std::map<uint32_t, uint64_t> blocks_;              // promised, by tensor id
  std::map<uint32_t, uint64_t> rows_;                // promised, by table id
  std::map<uint32_t, size_t> tensor_of_, table_of_;  // id -> index
  std::vector<DenseLayout> layouts_;                 // by tensor index
  size_t slots_per_weight_ = 0;
  uint64_t keys_ = 1;  // the header's
};

// Every data key of `round` (the weights and slots families of `db`) into
// `reader`; a round of at least 2 * part_bytes in key ranges read on up to
// `max_threads` threads (0: two per core, since each waits on the disk
// about as long as it copies; up to 8).
Status ReadRoundData(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* weights,
                     rocksdb::ColumnFamilyHandle* slots,
                     const std::string& where, int64_t round,
                     size_t max_threads, uint64_t part_bytes,
                     SliceReader* reader);

}  // namespace tether::checkpoint
