// Fixed data shares under changing membership. Each epoch's rows are split
// among the workers that are members of the run when the epoch is planned:
// member i of n trains rows r with r % n == i (WorkerShare). An epoch is
// planned when a member of the previous epoch first asks for it (or anyone,
// for epoch 0, for an epoch whose predecessor was never planned here, or
// when no member of the predecessor is still in the run), so workers that
// join mid-epoch start with the next epoch, and a worker that left is not
// given a share of the next one.
//
// Each member's start clock (its clock when it first asked) is kept, so a
// worker that comes back to its rank -- restarted, or a resumed run --
// skips the batches of its share its clocks already cover.
//
// A member that leaves mid-epoch leaves the rest of its share as a
// leftover; the next member to ask (having done its own share) trains it,
// so that every row of the epoch is still trained once.
//
// Not thread-safe: shard 0's coordinator serializes access.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace tether {

class SharePlans {
 public:
  // A member whose share was handed to the others (HandOff): it sits the
  // epoch out if it comes back.
  static constexpr int64_t kHandedOff = -2;
  struct Plan {
    std::vector<int> members;  // ranks, ascending
    // By member: its start clock; -1 not yet; kHandedOff.
    std::vector<int64_t> started;
    std::vector<uint32_t> batch;  // by member: rows per clock; 0 not known
  };
  struct Answer {
    bool decided = false;  // false: not planned yet; ask again later
    int index = -1;        // -1: not a member, it sits the epoch out
    int members = 0;
    int64_t start_clock = 0;
  };

  // Worker `rank`, at clock `clock`, training `batch` rows a clock (0: not
  // said), asks for its share of `epoch` (>= 0). `in_run` lists the ranks
  // in the run now (joined and not left), ascending; it becomes the epoch's
  // members when the epoch is planned now.
  Answer Ask(int rank, int epoch, int64_t clock, const std::vector<int>& in_run,
             uint32_t batch = 0);

  // A run resumed at `clock` on `workers` workers: the shares of members
  // with rank >= workers become leftovers for the others, from the rows
  // their clock covers (a member that never started: all of it; one whose
  // batch is not known keeps its share). Returns how many were handed off.
  int HandOff(int workers, int64_t clock);

  // The untrained rest of a share: rows `first_row` on of member `index`
  // of `members`' share of `epoch` (WorkerShare order).
  struct Leftover {
    int epoch = 0;
    int index = 0;
    int members = 0;
    uint64_t first_row = 0;
    bool operator==(const Leftover&) const = default;
  };
  void AddLeftover(const Leftover& leftover);
  // The leftover of the lowest epoch <= `epoch`, taken out; nullopt when
  // there is none.
  std::optional<Leftover> TakeLeftover(int epoch);

  // Every epoch planned so far, and the leftovers not taken: for
  // checkpoint rounds, and to restore them.
  const std::map<int, Plan>& plans() const { return plans_; }
  const std::vector<Leftover>& leftovers() const { return leftovers_; }
  void Restore(std::map<int, Plan> plans, std::vector<Leftover> leftovers) {
    plans_ = std::move(plans);
    leftovers_ = std::move(leftovers);
  }

 private:
  std::map<int, Plan> plans_;
  std::vector<Leftover> leftovers_;  // by epoch, then as added
};

}  // namespace tether
