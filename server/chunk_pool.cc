#include "server/chunk_pool.h"

#include <algorithm>
#include <limits>
#include <random>
#include <string>

#include "schema/shuffle.h"

namespace tether {

Result<ChunkPool> ChunkPool::Create(int workers, uint64_t rows,
                                    uint32_t chunk_rows, int epochs,
                                    uint64_t seed) {
  if (workers < 1) {
    return InvalidArgument("workers " + std::to_string(workers) +
                           ": need at least 1");
  }
  if (rows == 0) return InvalidArgument("rows 0: the training set is empty");
  if (rows > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgument("rows " + std::to_string(rows) +
                           ": above 4294967295 (row ids are uint32_t)");
  }
  if (chunk_rows == 0) return InvalidArgument("chunk_rows 0: need at least 1");
  if (epochs < 1) {
    return InvalidArgument("epochs " + std::to_string(epochs) +
                           ": need at least 1");
  }
  // The pool keeps a few bytes per chunk of every epoch: bound them, as a
  // request (from any worker) sizes it.
  const uint64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  if (chunks * static_cast<uint64_t>(epochs) > kMaxChunks) {
    return InvalidArgument(
        std::to_string(epochs) + " epochs of " + std::to_string(chunks) +
        " chunks are more than " + std::to_string(kMaxChunks) +
        " chunks in all: use bigger chunks (--chunk-rows) or fewer epochs");
  }
  return ChunkPool(workers, rows, chunk_rows, epochs, seed);
}

ChunkPool::ChunkPool(int workers, uint64_t rows, uint32_t chunk_rows,
                     int epochs, uint64_t seed)
    : workers_(workers),
      rows_(rows),
      chunk_rows_(chunk_rows),
      epochs_(epochs),
      seed_(seed),
      chunks_per_epoch_(
          static_cast<uint32_t>((rows + chunk_rows - 1) / chunk_rows)),
      held_(workers),
      rows_done_(workers, 0),
      done_(static_cast<uint64_t>(epochs) * chunks_per_epoch_, false) {
  for (int e = 0; e < epochs; ++e) {
    counts_.push_back({e, chunks_per_epoch_, 0, 0, 0});
  }
}

std::vector<uint32_t> ChunkPool::EpochOrder(uint64_t rows, uint64_t seed,
                                            int epoch) {
  if (rows > std::numeric_limits<uint32_t>::max()) return {};
  std::vector<uint32_t> order(rows);
  for (uint64_t i = 0; i < rows; ++i) order[i] = static_cast<uint32_t>(i);
  // As rank 0 of a one-worker static share, so one worker sees the same
  // order either way.
  Shuffle(order, seed, 0, epoch);
  return order;
}

Result<std::optional<ChunkPool::Chunk>> ChunkPool::Next(int rank) {
  if (!Valid(rank)) {
    return InvalidArgument("rank " + std::to_string(rank) + " out of [0, " +
                           std::to_string(workers_) + ")");
  }
  Complete(rank);
  if (!returned_.empty()) {
    auto [epoch, index] = *returned_.begin();
    returned_.erase(returned_.begin());
    held_[rank] = MakeChunk(epoch, index);
  } else if (next_epoch_ < epochs_) {
    held_[rank] = MakeChunk(next_epoch_, next_index_);
    if (++next_index_ == chunks_per_epoch_) {
      next_index_ = 0;
      ++next_epoch_;
    }
  }
  return held_[rank];
}

void ChunkPool::Complete(int rank) {
  if (!Valid(rank) || !held_[rank]) return;
  const Chunk c = *held_[rank];
  held_[rank].reset();
  EpochCount& count = counts_[c.epoch];
  const uint64_t slot =
      static_cast<uint64_t>(c.epoch) * chunks_per_epoch_ + c.index;
  if (done_[slot]) {
    ++count.duplicates;  // a bug: a completed chunk is never handed out
    return;
  }
  done_[slot] = true;
  ++completed_;
  ++count.chunks_done;
  count.rows_done += c.count;
  rows_done_[rank] += c.count;
}

void ChunkPool::Release(int rank) {
  if (!Valid(rank) || !held_[rank]) return;
  returned_.emplace(held_[rank]->epoch, held_[rank]->index);
  held_[rank].reset();
  ++reassigned_;
}

bool ChunkPool::Done() const { return completed_ == done_.size(); }

int ChunkPool::holders() const {
  return static_cast<int>(std::count_if(
      held_.begin(), held_.end(), [](const auto& c) { return c.has_value(); }));
}

uint64_t ChunkPool::RowsDone(int rank) const {
  return Valid(rank) ? rows_done_[rank] : 0;
}

ChunkPool::Chunk ChunkPool::MakeChunk(int epoch, uint32_t index) const {
  const uint64_t first = static_cast<uint64_t>(index) * chunk_rows_;
  const uint64_t count = std::min<uint64_t>(chunk_rows_, rows_ - first);
  return {epoch, index, first, static_cast<uint32_t>(count)};
}

}  // namespace tether
