// Chunked data assignment: shard 0 hands chunks of the training set to
// workers on request, so a faster worker trains on more of each epoch; a
// dead worker's chunk goes back to the pool. No chunk is lost or done twice.
//
// Each epoch is cut into ceil(rows / chunk_rows) chunks; chunk i covers
// positions [i * chunk_rows, min(rows, (i + 1) * chunk_rows)) of
// EpochOrder(rows, seed, epoch), which workers compute themselves. Chunks
// are handed out lowest epoch first, ascending index within it; a chunk
// returned by Release() is handed out again before any chunk not yet given
// of its epoch and before any chunk of a later epoch. Epoch e + 1 starts
// once every chunk of e has been handed out, even while some are still
// being trained on.
//
// Not thread-safe: shard 0's coordinator serializes access.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "schema/status.h"

namespace tether {

class ChunkPool {
 public:
  struct Chunk {
    int epoch;
    uint32_t index;
    uint64_t first;  // position in the epoch's order
    uint32_t count;  // rows; only the epoch's last chunk may be short
  };
  struct EpochCount {
    int epoch;
    uint64_t chunks_total;
    uint64_t chunks_done;  // distinct chunks completed
    uint64_t rows_done;    // rows in those chunks
    uint64_t duplicates;   // completions of an already completed chunk
  };

  // At most this many chunks over all epochs.
  static constexpr uint64_t kMaxChunks = uint64_t{1} << 24;

  // Ranks 0..workers-1. InvalidArgument naming the value for workers < 1,
  // rows 0 or > UINT32_MAX (row ids are uint32_t), chunk_rows 0, epochs < 1,
  // or more than kMaxChunks chunks in all.
  static Result<ChunkPool> Create(int workers, uint64_t rows,
                                  uint32_t chunk_rows, int epochs,
                                  uint64_t seed);

  // The order of rows 0..rows-1 in `epoch`: a pure function of its
  // arguments, identical with every standard library (and equal to
  // WorkerShare(rows, 0, 1, seed, epoch)). Empty when rows > UINT32_MAX.
  static std::vector<uint32_t> EpochOrder(uint64_t rows, uint64_t seed,
                                          int epoch);

  // `rank` asks for work: the chunk it holds, if any, is completed first.
  // Returns the next chunk, or nullopt when none is left to hand out. A
  // rank that got nullopt may ask again: a chunk comes back if its holder
  // is released. `clock` is the rank's clock now and `batch` the rows it
  // trains per clock (0: not known): its batch k of the chunk is pushed at
  // clock + k, which is what Save() counts by. InvalidArgument for a rank
  // out of range.
  Result<std::optional<Chunk>> Next(int rank, int64_t clock = -1,
                                    uint32_t batch = 0);
  // `rank` finished its chunk and wants no other. These two are no-ops
  // when `rank` is out of range or holds no chunk.
  void Complete(int rank);
  // `rank` died or was evicted: its chunk, unfinished, goes back to the
  // pool. Call it before a restarted incarnation of the rank asks, or
  // Next() would complete the chunk the old one never finished.
  void Release(int rank);

  // What a checkpoint round keeps of the pool: its shape and, by epoch,
  // the chunks whose rows are all in the round (ascending indices) and the
  // chunks only a first part of which is (index -> rows: that many leading
  // rows of the chunk).
  struct Progress {
    uint64_t rows = 0;
    uint32_t chunk_rows = 0;
    int epochs = 0;
    std::vector<std::vector<uint32_t>> done;            // by epoch
    std::vector<std::map<uint32_t, uint32_t>> partial;  // by epoch
  };
  // The rows trained at clocks before `clock` (a round at that clock holds
  // exactly their updates under BSP): a chunk handed out at clock c with
  // batch b has min(rows, (clock - c) * b) of its rows in; one whose holder
  // gave no batch only when completed.
  Progress Save(int64_t clock) const;
  // A pool for `workers` ranks that goes on from `progress`: completed
  // chunks are not handed out again, the rest of a partly trained one is
  // (first), then the others, lowest epoch first. InvalidArgument as
  // Create, or for a chunk index or row count out of range.
  static Result<ChunkPool> Resume(int workers, const Progress& progress,
                                  uint64_t seed);

  std::vector<EpochCount> Counts() const { return counts_; }
  uint64_t reassigned() const { return reassigned_; }  // chunks Released
  bool Done() const;  // every chunk of every epoch completed
  int holders() const;
  uint64_t RowsDone(int rank) const;  // 0 for a rank out of range
  uint64_t seed() const { return seed_; }

 private:
  ChunkPool(int workers, uint64_t rows, uint32_t chunk_rows, int epochs,
            uint64_t seed);
  // The chunk's rows not trained before this pool (see offset_).
  Chunk MakeChunk(int epoch, uint32_t index) const;
  uint32_t FullCount(uint32_t index) const;
  uint64_t Slot(int epoch, uint32_t index) const {
    return static_cast<uint64_t>(epoch) * chunks_per_epoch_ + index;
  }
  // Rows of the chunk in `slot` trained before `clock`, offset included.
  uint64_t RowsBefore(uint64_t slot, int64_t clock) const;
  bool Valid(int rank) const { return rank >= 0 && rank < workers_; }
  // Constant after construction.
  int workers_;
  uint64_t rows_;
  uint32_t chunk_rows_;
  int epochs_;
  uint64_t seed_;
  uint32_t chunks_per_epoch_;

  int next_epoch_ = 0;  // (next_epoch_, next_index_): first never given
  uint32_t next_index_ = 0;
  std::set<std::pair<int, uint32_t>> returned_;  // (epoch, index)
  std::vector<std::optional<Chunk>> held_;       // by rank
  std::vector<uint64_t> rows_done_;              // by rank
  std::vector<bool> done_;                       // by Slot(epoch, index)
  // By slot: leading rows trained before this pool (Resume), and how the
  // chunk's holder trains it: from which clock, how many rows per clock
  // (start -1: not handed out, or given back).
  std::vector<uint32_t> offset_;
  struct Training {
    int64_t start = -1;
    uint32_t batch = 0;
  };
  std::vector<Training> training_;
  std::vector<EpochCount> counts_;  // by epoch
  uint64_t completed_ = 0;
  uint64_t reassigned_ = 0;
};

}  // namespace tether
