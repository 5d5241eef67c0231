#include "server/worker_table.h"

namespace tether {

WorkerTable::WorkerTable(int capacity)
    : connected_(capacity, false),
      conn_(capacity, nullptr),
      joined_(capacity, false),
      evicted_(capacity, false),
      moved_forward_(capacity, false),
      staleness_(capacity, -1),
      heard_ms_(std::make_unique<std::atomic<int64_t>[]>(capacity)) {}

void WorkerTable::SetConnected(int rank, bool connected) {
  if (connected_[rank] != connected) connected_count_ += connected ? 1 : -1;
  connected_[rank] = connected;
}

void WorkerTable::SetEvicted(int rank, bool evicted) {
  if (evicted_[rank] != evicted) evicted_count_ += evicted ? 1 : -1;
  evicted_[rank] = evicted;
}

bool WorkerTable::Connect(int rank, const Connection* conn, int staleness,
                          int64_t now_ms) {
  const bool was_evicted = evicted_[rank];
  conn_[rank] = conn;
  SetConnected(rank, true);
  staleness_[rank] = staleness;
  SetEvicted(rank, false);
  heard_ms_[rank].store(now_ms, std::memory_order_relaxed);
  return was_evicted;
}

bool WorkerTable::Leave(int rank, const Connection* conn, int staleness,
                        int64_t now_ms) {
  if (conn != nullptr && conn_[rank] != conn) return false;
  conn_[rank] = nullptr;
  SetConnected(rank, false);
  staleness_[rank] = staleness;
  heard_ms_[rank].store(now_ms, std::memory_order_relaxed);
  return true;
}

bool WorkerTable::Join(int rank) {
  const bool rejoin = joined_[rank];
  joined_[rank] = true;
  return rejoin;
}

void WorkerTable::Heard(int rank, int64_t now_ms) {
  if (!valid(rank)) return;
  heard_ms_[rank].store(now_ms, std::memory_order_relaxed);
}

bool WorkerTable::Unevict(int rank) {
  if (!evicted_[rank] || !connected_[rank]) return false;
  SetEvicted(rank, false);
  return true;
}

std::vector<WorkerTable::Evicted> WorkerTable::EvictSilent(
    int64_t now_ms, int64_t timeout_ms, const std::function<bool(int)>& live) {
  std::vector<Evicted> out;
  if (timeout_ms <= 0) return out;
  for (int r = 0; r < capacity(); ++r) {
    if (!connected_[r] || evicted_[r] || !live(r)) continue;
    const int64_t silent = now_ms - last_heard_ms(r);
    if (silent < timeout_ms) continue;
    SetEvicted(r, true);
    ++evictions_;
    out.push_back({r, silent});
  }
  return out;
}

}  // namespace tether
