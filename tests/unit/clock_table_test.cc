#include "server/clock_table.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tether {
namespace {

// Runs every released waiter, as the owning Shard does.
void RunAll(std::vector<ClockTable::Release> released) {
  for (auto& release : released) release();
}

TEST(ClockTable, StartsWithEveryWorkerLiveAtClockZero) {
  ClockTable table(3);
  EXPECT_EQ(table.num_workers(), 3);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(table.live(rank));
    EXPECT_EQ(table.clock(rank), 0);
  }
  EXPECT_EQ(table.min_clock(), 0);
  EXPECT_EQ(table.max_clock(), 0);
  EXPECT_EQ(table.waiting(), 0u);
}

TEST(ClockTable, MinAndMaxTrackSlowestAndFastestWorker) {
  ClockTable table(3);
  EXPECT_TRUE(table.Advance(0, 5).empty());
  EXPECT_TRUE(table.Advance(1, 3).empty());
  EXPECT_TRUE(table.Advance(2, 4).empty());
  EXPECT_EQ(table.clock(1), 3);
  EXPECT_EQ(table.min_clock(), 3);
  EXPECT_EQ(table.max_clock(), 5);
}

TEST(ClockTable, PullReadyWhenSlowestWithinBound) {
  ClockTable table(3);
  RunAll(table.Advance(0, 5));
  RunAll(table.Advance(1, 3));
  RunAll(table.Advance(2, 4));
  // min_clock is 3: a pull at clock 5 needs min >= 5 - s.
  EXPECT_TRUE(table.Ready(5, 2));
  EXPECT_TRUE(table.Ready(5, 3));
  EXPECT_FALSE(table.Ready(5, 1));
  EXPECT_FALSE(table.Ready(5, 0));
  EXPECT_TRUE(table.Ready(4, 1));
  EXPECT_TRUE(table.Ready(3, 0));
}

TEST(ClockTable, WaitingPullReleasedWhenSlowestClocks) {
  ClockTable table(2);
  RunAll(table.Advance(0, 3));
  // Worker 0 pulls at clock 3 with bound 1: it needs min_clock >= 2.
  ASSERT_FALSE(table.Ready(3, 1));
  int answered = 0;
  table.Wait(3, 1, [&answered] { ++answered; });
  EXPECT_EQ(table.waiting(), 1u);

  auto released = table.Advance(1, 1);
  EXPECT_TRUE(released.empty()) << "released at min_clock 1, needs 2";
  EXPECT_EQ(table.waiting(), 1u);
  EXPECT_FALSE(table.Ready(3, 1));

  released = table.Advance(1, 2);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(table.waiting(), 0u);
  EXPECT_EQ(answered, 0) << "the table must leave running waiters to callers";
  RunAll(std::move(released));
  EXPECT_EQ(answered, 1);
}

TEST(ClockTable, AdvancingFasterWorkerDoesNotReleasePull) {
  ClockTable table(2);
  RunAll(table.Advance(0, 2));
  table.Wait(2, 0, [] {});
  EXPECT_TRUE(table.Advance(0, 3).empty());
  EXPECT_TRUE(table.Advance(0, 10).empty());
  EXPECT_EQ(table.waiting(), 1u);
  EXPECT_EQ(table.Advance(1, 2).size(), 1u);
}

TEST(ClockTable, ZeroStalenessIsLockStep) {
  ClockTable table(2);
  RunAll(table.Advance(0, 1));
  // With s = 0, worker 0 at clock 1 must see worker 1 finish clock 1 too.
  EXPECT_FALSE(table.Ready(1, 0));
  bool answered = false;
  table.Wait(1, 0, [&answered] { answered = true; });
  RunAll(table.Advance(1, 1));
  EXPECT_TRUE(answered);
  EXPECT_TRUE(table.Ready(1, 0));
  EXPECT_FALSE(table.Ready(2, 0));
}

TEST(ClockTable, NegativeStalenessNeverWaits) {
  ClockTable table(2);
  RunAll(table.Advance(0, 1000));
  EXPECT_EQ(table.min_clock(), 0);
  EXPECT_TRUE(table.Ready(1000, -1));
  EXPECT_TRUE(table.Ready(std::numeric_limits<int64_t>::max(), -1));
  EXPECT_TRUE(table.Ready(1000, -5));
}

TEST(ClockTable, DeadWorkerDoesNotHoldBackMin) {
  ClockTable table(3);
  RunAll(table.Advance(0, 5));
  RunAll(table.Advance(1, 5));
  // Worker 2 is stuck at clock 0.
  bool answered = false;
  table.Wait(5, 0, [&answered] { answered = true; });
  EXPECT_EQ(table.min_clock(), 0);

  auto released = table.SetLive(2, false);
  EXPECT_FALSE(table.live(2));
  EXPECT_EQ(table.min_clock(), 5);
  ASSERT_EQ(released.size(), 1u);
  RunAll(std::move(released));
  EXPECT_TRUE(answered);
  EXPECT_EQ(table.waiting(), 0u);
}

TEST(ClockTable, RevivedWorkerHoldsBackMinAgain) {
  ClockTable table(2);
  RunAll(table.Advance(0, 4));
  RunAll(table.SetLive(1, false));
  EXPECT_EQ(table.min_clock(), 4);
  EXPECT_TRUE(table.Ready(4, 0));

  EXPECT_TRUE(table.SetLive(1, true).empty());
  EXPECT_TRUE(table.live(1));
  EXPECT_EQ(table.min_clock(), 0);
  EXPECT_FALSE(table.Ready(4, 0));
}

TEST(ClockTable, DeadWorkerStillCountsForMaxClock) {
  ClockTable table(2);
  RunAll(table.Advance(1, 7));
  RunAll(table.SetLive(1, false));
  EXPECT_EQ(table.min_clock(), 0);
  EXPECT_EQ(table.max_clock(), 7);
}

TEST(ClockTable, MinClockWithNoLiveWorkerIsMaxClock) {
  ClockTable table(2);
  RunAll(table.Advance(0, 3));
  RunAll(table.Advance(1, 6));
  RunAll(table.SetLive(0, false));
  RunAll(table.SetLive(1, false));
  EXPECT_EQ(table.min_clock(), 6);
}

TEST(ClockTable, LastWorkerDyingReleasesPullsUpToMaxClock) {
  ClockTable table(2);
  RunAll(table.Advance(0, 3));
  RunAll(table.SetLive(0, false));
  int answered = 0;
  table.Wait(3, 0, [&answered] { ++answered; });  // needs min >= 3
  table.Wait(9, 0, [&answered] { ++answered; });  // needs min >= 9
  RunAll(table.SetLive(1, false));
  EXPECT_EQ(answered, 1);
  EXPECT_EQ(table.waiting(), 1u);
}

TEST(ClockTable, ReleasesInClockOrder) {
  ClockTable table(2);
  RunAll(table.Advance(0, 10));
  std::vector<std::string> order;
  // Needs, in order of queuing: 3, 1, 2, 1.
  table.Wait(3, 0, [&order] { order.push_back("needs3"); });
  table.Wait(2, 1, [&order] { order.push_back("needs1-first"); });
  table.Wait(4, 2, [&order] { order.push_back("needs2"); });
  table.Wait(1, 0, [&order] { order.push_back("needs1-second"); });
  ASSERT_EQ(table.waiting(), 4u);

  RunAll(table.Advance(1, 3));
  EXPECT_EQ(order, (std::vector<std::string>{"needs1-first", "needs1-second",
                                             "needs2", "needs3"}));
  EXPECT_EQ(table.waiting(), 0u);
}

TEST(ClockTable, ReleasesOnlyPullsTheNewMinSatisfies) {
  ClockTable table(2);
  RunAll(table.Advance(0, 10));
  std::vector<int> answered;
  for (int need = 1; need <= 4; ++need) {
    table.Wait(need, 0, [&answered, need] { answered.push_back(need); });
  }
  RunAll(table.Advance(1, 2));
  EXPECT_EQ(answered, (std::vector<int>{1, 2}));
  EXPECT_EQ(table.waiting(), 2u);
  RunAll(table.Advance(1, 4));
  EXPECT_EQ(answered, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(table.waiting(), 0u);
}

TEST(ClockTable, ReleasedPullIsNotReleasedTwice) {
  ClockTable table(2);
  RunAll(table.Advance(0, 2));
  int answered = 0;
  table.Wait(2, 0, [&answered] { ++answered; });
  RunAll(table.Advance(1, 2));
  RunAll(table.Advance(1, 3));
  RunAll(table.SetLive(1, false));
  EXPECT_EQ(answered, 1);
}

TEST(ClockTable, BackupWorkersCloseAClockWithoutTheSlowest) {
  ClockTable table(4, /*backup=*/1);
  RunAll(table.Advance(0, 5));
  RunAll(table.Advance(1, 5));
  RunAll(table.Advance(2, 4));
  // Rank 3 is stuck at 0: with one backup worker, the clock three of the
  // four have reached (4) is closed; the minimum is still 0.
  EXPECT_EQ(table.min_clock(), 0);
  EXPECT_EQ(table.closed_clock(), 4);
  EXPECT_TRUE(table.Ready(4, 0));
  EXPECT_FALSE(table.Ready(5, 0));
  int answered = 0;
  table.Wait(5, 0, [&answered] { ++answered; });
  RunAll(table.Advance(3, 7));  // the slow one does not close clock 5 alone
  EXPECT_EQ(table.closed_clock(), 5);
  EXPECT_EQ(answered, 1);
}

TEST(ClockTable, WithoutBackupWorkersClosedIsTheMinimum) {
  ClockTable table(3);
  RunAll(table.Advance(0, 5));
  RunAll(table.Advance(1, 2));
  EXPECT_EQ(table.closed_clock(), table.min_clock());
  EXPECT_EQ(table.closed_clock(), 0);
}

TEST(ClockTable, BackupCountIgnoresWorkersThatAreNotLive) {
  ClockTable table(3, /*backup=*/1);
  RunAll(table.Advance(0, 6));
  RunAll(table.Advance(1, 2));
  RunAll(table.SetLive(2, false));
  // Two live workers, one backup: the faster one alone closes clocks.
  EXPECT_EQ(table.closed_clock(), 6);
  RunAll(table.SetLive(0, false));
  RunAll(table.SetLive(1, false));
  EXPECT_EQ(table.closed_clock(), table.max_clock());
}

TEST(ClockTable, JoinClockIsTheOthersMinimumWhenLater) {
  ClockTable table(3);
  RunAll(table.Advance(0, 7));
  RunAll(table.Advance(1, 5));
  RunAll(table.Advance(2, 2));
  RunAll(table.SetLive(2, false));
  EXPECT_EQ(table.JoinClock(2), 5);  // behind: joins at the others' minimum
  RunAll(table.Advance(2, 9));
  EXPECT_EQ(table.JoinClock(2), 9);  // ahead: keeps its own
  RunAll(table.SetLive(0, false));
  RunAll(table.SetLive(1, false));
  EXPECT_EQ(table.JoinClock(2), 9);  // nobody else live: its own
}

}  // namespace
}  // namespace tether
