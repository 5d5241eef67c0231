#include "server/share_plan.h"

#include <algorithm>

namespace tether {
namespace {

// The index of `rank` among `members` (ascending), or -1.
int IndexOf(const std::vector<int>& members, int rank) {
  auto it = std::lower_bound(members.begin(), members.end(), rank);
  return it != members.end() && *it == rank
             ? static_cast<int>(it - members.begin())
             : -1;
}

}  // namespace

SharePlans::Answer SharePlans::Ask(int rank, int epoch, int64_t clock,
                                   const std::vector<int>& in_run,
                                   uint32_t batch) {
  auto it = plans_.find(epoch);
  if (it == plans_.end()) {
    auto previous = plans_.find(epoch - 1);
    bool may_plan = epoch == 0 || previous == plans_.end();
    if (!may_plan) {
      const std::vector<int>& before = previous->second.members;
      may_plan = IndexOf(before, rank) >= 0 ||
                 std::none_of(in_run.begin(), in_run.end(),
                              [&](int r) { return IndexOf(before, r) >= 0; });
    }
    if (!may_plan) return {};
    Plan plan;
    plan.members = in_run;
    std::sort(plan.members.begin(), plan.members.end());
    plan.started.assign(plan.members.size(), -1);
    plan.batch.assign(plan.members.size(), 0);
    it = plans_.emplace(epoch, std::move(plan)).first;
  }
  Plan& plan = it->second;
  Answer answer;
  answer.decided = true;
  answer.members = static_cast<int>(plan.members.size());
  answer.index = IndexOf(plan.members, rank);
  if (answer.index >= 0 && plan.started[answer.index] == kHandedOff) {
    answer.index = -1;  // the others train its share
  }
  if (answer.index >= 0) {
    int64_t& started = plan.started[answer.index];
    if (started < 0) started = clock;
    answer.start_clock = started;
    plan.batch.resize(plan.members.size(), 0);
    if (batch > 0) plan.batch[answer.index] = batch;
  }
  return answer;
}

int SharePlans::HandOff(int workers, int64_t clock) {
  int handed = 0;
  for (auto& [epoch, plan] : plans_) {
    plan.batch.resize(plan.members.size(), 0);
    for (size_t i = 0; i < plan.members.size(); ++i) {
      int64_t& started = plan.started[i];
      if (plan.members[i] < workers || started == kHandedOff) continue;
      uint64_t done = 0;
      if (started >= 0) {
        if (plan.batch[i] == 0) continue;  // where it stands is not known
        done = static_cast<uint64_t>(std::max<int64_t>(0, clock - started)) *
               plan.batch[i];
      }
      AddLeftover({epoch, static_cast<int>(i),
                   static_cast<int>(plan.members.size()), done});
      started = kHandedOff;
      ++handed;
    }
  }
  return handed;
}

void SharePlans::AddLeftover(const Leftover& leftover) {
  auto at = std::upper_bound(
      leftovers_.begin(), leftovers_.end(), leftover,
      [](const Leftover& a, const Leftover& b) { return a.epoch < b.epoch; });
  leftovers_.insert(at, leftover);
}

std::optional<SharePlans::Leftover> SharePlans::TakeLeftover(int epoch) {
  if (leftovers_.empty() || leftovers_.front().epoch > epoch) {
    return std::nullopt;
  }
  Leftover first = leftovers_.front();
  leftovers_.erase(leftovers_.begin());
  return first;
}

}  // namespace tether
