#include "server/clock_table.h"

#include <algorithm>
#include <limits>

namespace tether {

ClockTable::ClockTable(int num_workers)
    : clocks_(num_workers, 0), live_(num_workers, true) {}

int64_t ClockTable::min_clock() const {
  int64_t min = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < clocks_.size(); ++r) {
    if (live_[r]) min = std::min(min, clocks_[r]);
  }
  return min == std::numeric_limits<int64_t>::max() ? max_clock() : min;
}

int64_t ClockTable::max_clock() const {
  if (clocks_.empty()) return 0;
  return *std::max_element(clocks_.begin(), clocks_.end());
}

std::vector<ClockTable::Release> ClockTable::Advance(int rank, int64_t clock) {
  clocks_[rank] = clock;
  return Collect();
}

std::vector<ClockTable::Release> ClockTable::SetLive(int rank, bool live) {
  live_[rank] = live;
  return Collect();
}

bool ClockTable::Ready(int64_t clock, int staleness) const {
  return staleness < 0 || min_clock() >= clock - staleness;
}

void ClockTable::Wait(int64_t clock, int staleness, Release release) {
  waiting_.emplace(clock - staleness, std::move(release));
}

std::vector<ClockTable::Release> ClockTable::Collect() {
  std::vector<Release> released;
  const int64_t min = min_clock();
  auto end = waiting_.upper_bound(min);
  for (auto it = waiting_.begin(); it != end; ++it) {
    released.push_back(std::move(it->second));
  }
  waiting_.erase(waiting_.begin(), end);
  return released;
}

}  // namespace tether
