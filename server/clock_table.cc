#include "server/clock_table.h"

#include <algorithm>
#include <cassert>
#include <functional>
#include <limits>

namespace tether {

ClockTable::ClockTable(int num_workers, int backup)
    : backup_(backup), clocks_(num_workers, 0), live_(num_workers, true) {}

void ClockTable::Grow(int num_workers) {
  if (num_workers <= this->num_workers()) return;
  const int64_t at = min_clock();
  clocks_.resize(num_workers, at);
  live_.resize(num_workers, false);
}

void ClockTable::Restart(int64_t clock) {
  assert(waiting_.empty());
  clocks_.assign(clocks_.size(), clock);
  live_.assign(live_.size(), true);
}

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

int64_t ClockTable::closed_clock() const {
  if (backup_ <= 0) return min_clock();
  std::vector<int64_t>& live = scratch_;  // no allocation per pull
  live.clear();
  for (size_t r = 0; r < clocks_.size(); ++r) {
    if (live_[r]) live.push_back(clocks_[r]);
  }
  if (live.empty()) return max_clock();
  // The (live - backup)-th highest clock: that many workers reached it.
  const size_t quorum =
      live.size() > size_t(backup_) ? live.size() - backup_ : 1;
  std::nth_element(live.begin(), live.begin() + (quorum - 1), live.end(),
                   std::greater<int64_t>());
  return live[quorum - 1];
}

int64_t ClockTable::JoinClock(int rank) const {
  int64_t others = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < clocks_.size(); ++r) {
    if (live_[r] && static_cast<int>(r) != rank) {
      others = std::min(others, clocks_[r]);
    }
  }
  if (others == std::numeric_limits<int64_t>::max()) return clocks_[rank];
  return std::max(clocks_[rank], others);
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
  return staleness < 0 || closed_clock() >= clock - staleness;
}

void ClockTable::Wait(int64_t clock, int staleness, Release release) {
  waiting_.emplace(clock - staleness, std::move(release));
}

std::vector<ClockTable::Release> ClockTable::Collect() {
  std::vector<Release> released;
  const int64_t closed = closed_clock();
  auto end = waiting_.upper_bound(closed);
  for (auto it = waiting_.begin(); it != end; ++it) {
    released.push_back(std::move(it->second));
  }
  waiting_.erase(waiting_.begin(), end);
  return released;
}

}  // namespace tether
