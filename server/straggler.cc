#include "server/straggler.h"

#include <algorithm>
#include <limits>

namespace tether {

StragglerWatch::StragglerWatch(int num_workers, StragglerOptions options)
    : options_(options), workers_(std::max(0, num_workers)) {}

std::vector<StragglerWatch::Verdict> StragglerWatch::Sample(
    double t, const std::vector<Worker>& workers, bool all_joined) {
  // Workers that joined beyond the first ones start with no history.
  if (workers.size() > workers_.size()) workers_.resize(workers.size());
  const size_t n = workers.size();
  std::vector<Verdict> verdicts(workers.size());
  if (!all_joined) {
    all_joined_since_.reset();
  } else if (!all_joined_since_) {
    all_joined_since_ = t;
  }
  int64_t fastest = std::numeric_limits<int64_t>::min();
  for (size_t i = 0; i < n; ++i) {
    if (workers[i].running) fastest = std::max(fastest, workers[i].clock);
  }
  for (size_t i = 0; i < n; ++i) {
    History& h = workers_[i];
    if (!workers[i].running) {
      h = History{};
      continue;
    }
    if (!h.running_since) h.running_since = t;
    bool held_back = false;
    for (size_t j = 0; j < n && !held_back; ++j) {
      const Worker& ahead = workers[j];
      held_back = j != i && ahead.running && ahead.bound >= 0 &&
                  ahead.clock - workers[i].clock > ahead.bound;
    }
    h.window.push_back({t, workers[i].clock, held_back});
    while (h.window.front().t < t - options_.window_s) h.window.pop_front();
  }

  // Whose evidence spans the whole window.
  auto full = [&](size_t i) {
    return all_joined_since_ && t - *all_joined_since_ >= options_.window_s &&
           workers_[i].running_since &&
           t - *workers_[i].running_since >= options_.window_s;
  };
  auto advance = [&](size_t i) {
    return workers[i].clock - workers_[i].window.front().clock;
  };
  int64_t fastest_advance = 0;
  for (size_t i = 0; i < n; ++i) {
    if (workers[i].running && full(i)) {
      fastest_advance = std::max(fastest_advance, advance(i));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!workers[i].running) continue;
    const std::deque<Seen>& window = workers_[i].window;
    Verdict& v = verdicts[i];
    v.behind = fastest - workers[i].clock;
    v.held_back_share = static_cast<double>(std::count_if(
                            window.begin(), window.end(),
                            [](const Seen& s) { return s.held_back; })) /
                        static_cast<double>(window.size());
    v.advance = advance(i);
    v.fastest_advance = fastest_advance;
    const bool fell_behind = fastest_advance >= options_.min_advance &&
                             2 * v.advance < fastest_advance;
    v.straggling =
        full(i) && v.behind >= 1 && (v.held_back_share >= 0.5 || fell_behind);
  }
  return verdicts;
}

}  // namespace tether
