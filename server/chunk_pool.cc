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
      done_(static_cast<uint64_t>(epochs) * chunks_per_epoch_, false),
      offset_(done_.size(), 0),
      training_(done_.size()) {
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

Result<std::optional<ChunkPool::Chunk>> ChunkPool::Next(int rank, int64_t clock,
                                                        uint32_t batch) {
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
  if (held_[rank]) {
    training_[Slot(held_[rank]->epoch, held_[rank]->index)] = {
        std::max<int64_t>(clock, 0), clock < 0 ? 0 : batch};
  }
  return held_[rank];
}

void ChunkPool::Complete(int rank) {
  if (!Valid(rank) || !held_[rank]) return;
  const Chunk c = *held_[rank];
  held_[rank].reset();
  EpochCount& count = counts_[c.epoch];
  const uint64_t slot = Slot(c.epoch, c.index);
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
  training_[Slot(held_[rank]->epoch, held_[rank]->index)] = {};
  held_[rank].reset();
  ++reassigned_;
}

uint64_t ChunkPool::RowsBefore(uint64_t slot, int64_t clock) const {
  const uint32_t full =
      FullCount(static_cast<uint32_t>(slot % chunks_per_epoch_));
  const Training& t = training_[slot];
  if (t.start < 0) return done_[slot] ? full : offset_[slot];
  const uint64_t rest = full - offset_[slot];
  uint64_t trained = 0;
  if (t.batch == 0) {
    trained = done_[slot] ? rest : 0;
  } else if (clock > t.start) {
    trained = std::min<uint64_t>(
        rest, static_cast<uint64_t>(clock - t.start) * t.batch);
  }
  return offset_[slot] + trained;
}

ChunkPool::Progress ChunkPool::Save(int64_t clock) const {
  Progress p;
  p.rows = rows_;
  p.chunk_rows = chunk_rows_;
  p.epochs = epochs_;
  p.done.resize(epochs_);
  p.partial.resize(epochs_);
  for (int e = 0; e < epochs_; ++e) {
    for (uint32_t i = 0; i < chunks_per_epoch_; ++i) {
      const uint64_t rows = RowsBefore(Slot(e, i), clock);
      if (rows == FullCount(i)) {
        p.done[e].push_back(i);
      } else if (rows > 0) {
        p.partial[e][i] = static_cast<uint32_t>(rows);
      }
    }
  }
  return p;
}

Result<ChunkPool> ChunkPool::Resume(int workers, const Progress& progress,
                                    uint64_t seed) {
  TETHER_ASSIGN_OR_RETURN(ChunkPool pool,
                          Create(workers, progress.rows, progress.chunk_rows,
                                 progress.epochs, seed));
  if (progress.done.size() > static_cast<size_t>(progress.epochs) ||
      progress.partial.size() > static_cast<size_t>(progress.epochs)) {
    return InvalidArgument("chunk progress for more epochs than the pool's " +
                           std::to_string(progress.epochs));
  }
  auto check = [&](size_t e, uint32_t index) -> Status {
    if (index >= pool.chunks_per_epoch_) {
      return InvalidArgument(
          "chunk " + std::to_string(index) + " of epoch " + std::to_string(e) +
          " is past " + std::to_string(pool.chunks_per_epoch_) + " chunks");
    }
    return Status::Ok();
  };
  // The first chunk never handed out: after the last one (partly) trained.
  uint64_t next = 0;
  for (size_t e = 0; e < progress.done.size(); ++e) {
    for (uint32_t index : progress.done[e]) {
      TETHER_RETURN_IF_ERROR(check(e, index));
      const uint64_t slot = pool.Slot(static_cast<int>(e), index);
      if (pool.done_[slot]) continue;
      pool.done_[slot] = true;
      ++pool.completed_;
      EpochCount& count = pool.counts_[e];
      ++count.chunks_done;
      count.rows_done += pool.FullCount(index);
      next = std::max(next, slot + 1);
    }
  }
  for (size_t e = 0; e < progress.partial.size(); ++e) {
    for (const auto& [index, rows] : progress.partial[e]) {
      TETHER_RETURN_IF_ERROR(check(e, index));
      const uint64_t slot = pool.Slot(static_cast<int>(e), index);
      if (rows == 0 || rows >= pool.FullCount(index) || pool.done_[slot]) {
        return InvalidArgument("chunk " + std::to_string(index) + " of epoch " +
                               std::to_string(e) + ": " + std::to_string(rows) +
                               " rows trained is not part of it");
      }
      pool.offset_[slot] = rows;
      pool.counts_[e].rows_done += rows;
      next = std::max(next, slot + 1);
    }
  }
  pool.next_epoch_ = static_cast<int>(next / pool.chunks_per_epoch_);
  pool.next_index_ = static_cast<uint32_t>(next % pool.chunks_per_epoch_);
  for (uint64_t slot = 0; slot < next; ++slot) {
    if (!pool.done_[slot]) {
      pool.returned_.emplace(
          static_cast<int>(slot / pool.chunks_per_epoch_),
          static_cast<uint32_t>(slot % pool.chunks_per_epoch_));
    }
  }
  return pool;
}

bool ChunkPool::Done() const { return completed_ == done_.size(); }

int ChunkPool::holders() const {
  return static_cast<int>(std::count_if(
      held_.begin(), held_.end(), [](const auto& c) { return c.has_value(); }));
}

uint64_t ChunkPool::RowsDone(int rank) const {
  return Valid(rank) ? rows_done_[rank] : 0;
}

uint32_t ChunkPool::FullCount(uint32_t index) const {
  const uint64_t first = static_cast<uint64_t>(index) * chunk_rows_;
  return static_cast<uint32_t>(std::min<uint64_t>(chunk_rows_, rows_ - first));
}

ChunkPool::Chunk ChunkPool::MakeChunk(int epoch, uint32_t index) const {
  const uint32_t offset = offset_[Slot(epoch, index)];
  return {epoch, index, static_cast<uint64_t>(index) * chunk_rows_ + offset,
          FullCount(index) - offset};
}

}  // namespace tether
