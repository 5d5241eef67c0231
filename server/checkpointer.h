// Writes a shard's checkpoint snapshots on a thread of its own, so a round
// costs training only the copy taken under the shard's lock. One write at a
// time: a periodic round that arrives while the previous one is still being
// written is dropped (and logged) rather than queued, bounding memory to one
// copy; a requested round (the dashboard's, a stop's, another shard's
// TakeRound) waits for the write in progress, so at most two copies exist.
//
// Thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "schema/mutex.h"
#include "server/checkpoint.h"

namespace tether {

class Checkpointer {
 public:
  // Called on the writer thread after each write: the bytes written, or
  // the error (a full disk, say), and how long the write took.
  using Done = std::function<void(int64_t round, const Result<uint64_t>&,
                                  double seconds)>;

  // `store` must outlive the Checkpointer.
  Checkpointer(CheckpointStore* store, Done done);
  // Finishes the write in progress, then stops.
  ~Checkpointer();

  // What Submit does with a snapshot that comes while a write is in
  // progress.
  enum class IfBusy {
    kDrop,   // a periodic round: the next one comes soon enough
    kQueue,  // a requested round: written after the one in progress
  };

  // Hands `snapshot` to the writer; false (dropping it) when a write is in
  // progress and `if_busy` is kDrop, when another snapshot already waits,
  // or when the writer is stopping. A round taken already is not written
  // twice: one being written or waiting is true at once; the last round
  // written is reported again through `done` (seconds 0), for a
  // coordinator that forgot it when another shard failed it. A round whose
  // write failed is written again.
  bool Submit(ShardSnapshot snapshot, IfBusy if_busy) TETHER_EXCLUDES(mu_);

 private:
  void Loop() TETHER_EXCLUDES(mu_);

  CheckpointStore* const store_;
  const Done done_;

  Mutex mu_;
  CondVar cv_;
  std::optional<ShardSnapshot> pending_ TETHER_GUARDED_BY(mu_);
  // A round is being written or its `done` runs.
  bool busy_ TETHER_GUARDED_BY(mu_) = false;
  // The round being written (-1: none); it is reset before `done` runs.
  int64_t writing_ TETHER_GUARDED_BY(mu_) = -1;
  // The last round written, with its bytes.
  std::optional<std::pair<int64_t, uint64_t>> written_ TETHER_GUARDED_BY(mu_);
  // A round written already, to report again.
  std::optional<int64_t> report_ TETHER_GUARDED_BY(mu_);
  bool stopping_ TETHER_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace tether
