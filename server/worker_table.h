// The workers one shard counts: which are connected, and on which
// connection; which have ever joined (a second join is a rejoin); which were
// evicted for being silent; whose clock the shard moved ahead; each one's
// staleness bound; and when each was last heard from. The clocks themselves
// live in ClockTable; this table decides who is in and out, and the Shard
// turns that into ClockTable::SetLive and Advance calls.
//
// Times are steady-clock milliseconds passed in by the caller, so the
// eviction rule is testable without sleeping.
//
// Not thread-safe: the owning Shard calls every method under its mutex,
// except the three marked "any thread" (Heard, any_evicted,
// connected_count). Those are atomics, because every frame from a worker
// stamps Heard, and a frame should take the shard's lock only when some
// worker is evicted and might be coming back.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace tether {

class Connection;  // compared by address only

class WorkerTable {
 public:
  // Ranks 0..capacity-1 (the most a run may have: RankCapacity), none
  // connected, joined or evicted. Fixed, so that Heard needs no lock.
  explicit WorkerTable(int capacity);

  int capacity() const { return static_cast<int>(connected_.size()); }
  // True for 0 <= rank < capacity(); other methods expect a valid rank.
  bool valid(int rank) const { return rank >= 0 && rank < capacity(); }

  // `rank` connected on `conn` with staleness bound `staleness` at `now_ms`:
  // it is connected, heard from now and no longer evicted. Returns true
  // when it was evicted until now (its return is worth a log line). The
  // caller then Joins it.
  bool Connect(int rank, const Connection* conn, int staleness, int64_t now_ms);
  // `rank`'s connection `conn` ended at `now_ms` (nullptr: whichever it
  // has). Returns false, changing nothing, when `conn` is no longer its
  // current connection (the worker reconnected since). An evicted worker
  // stays evicted, so its return is noticed whichever connection brings it.
  bool Leave(int rank, const Connection* conn, int staleness, int64_t now_ms);
  // Marks `rank` joined. Returns true when it had joined before: a rejoin,
  // which takes the others' clock rather than its own.
  bool Join(int rank);

  // Any thread: a frame from `rank` arrived at `now_ms`. Ignores a bad rank.
  void Heard(int rank, int64_t now_ms);
  // An evicted, connected `rank` that was heard from again is back: no
  // longer evicted. Returns true when that happened (the caller rejoins it).
  bool Unevict(int rank);

  // Evicts every connected worker, not already evicted and for which
  // `live(rank)` holds, that has not been heard from for `timeout_ms` or
  // more at `now_ms`. Returns those evicted now, in rank order, with how
  // long each was silent. Does nothing when timeout_ms <= 0.
  struct Evicted {
    int rank = 0;
    int64_t silent_ms = 0;
  };
  std::vector<Evicted> EvictSilent(int64_t now_ms, int64_t timeout_ms,
                                   const std::function<bool(int)>& live);

  // The shard set `rank`'s clock ahead of where the worker put it (a
  // rejoin, or backup workers closing a clock without it); cleared when the
  // worker clocks on its own.
  void SetMovedForward(int rank, bool moved) { moved_forward_[rank] = moved; }
  bool moved_forward(int rank) const { return moved_forward_[rank]; }

  bool connected(int rank) const { return connected_[rank]; }
  bool joined(int rank) const { return joined_[rank]; }
  bool evicted(int rank) const { return evicted_[rank]; }
  // The bound its last Connect or Leave gave; -1 before any.
  int staleness_bound(int rank) const { return staleness_[rank]; }
  int64_t last_heard_ms(int rank) const {
    return heard_ms_[rank].load(std::memory_order_relaxed);
  }
  // Evictions since construction.
  uint64_t evictions() const { return evictions_; }
  // Any thread.
  bool any_evicted() const {
    return evicted_count_.load(std::memory_order_relaxed) > 0;
  }
  // Any thread: how many are connected (a worker waiting for the rest to
  // join hears this in every heartbeat's answer).
  int connected_count() const {
    return connected_count_.load(std::memory_order_relaxed);
  }

 private:
  void SetConnected(int rank, bool connected);
  void SetEvicted(int rank, bool evicted);

  std::vector<bool> connected_;
  std::vector<const Connection*> conn_;  // the current one, by rank
  std::vector<bool> joined_;             // ever joined
  std::vector<bool> evicted_;            // connected but silent too long
  std::vector<bool> moved_forward_;
  std::vector<int> staleness_;
  std::unique_ptr<std::atomic<int64_t>[]> heard_ms_;
  uint64_t evictions_ = 0;
  // Written under the owner's lock, read from any thread.
  std::atomic<int> evicted_count_{0};
  std::atomic<int> connected_count_{0};
};

}  // namespace tether
