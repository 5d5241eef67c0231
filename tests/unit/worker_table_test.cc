#include "server/worker_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace tether {
namespace {

// Stand-ins for connections: the table compares addresses only.
const Connection* Conn(int n) {
  static char slots[4];
  return reinterpret_cast<const Connection*>(&slots[n]);
}

bool AllLive(int) { return true; }

std::vector<int> Ranks(const std::vector<WorkerTable::Evicted>& evicted) {
  std::vector<int> ranks;
  for (const auto& e : evicted) ranks.push_back(e.rank);
  return ranks;
}

TEST(WorkerTable, StartsWithNobodyConnectedJoinedOrEvicted) {
  WorkerTable table(3);
  EXPECT_EQ(table.capacity(), 3);
  EXPECT_EQ(table.connected_count(), 0);
  EXPECT_FALSE(table.any_evicted());
  EXPECT_EQ(table.evictions(), 0u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(table.connected(r));
    EXPECT_FALSE(table.joined(r));
    EXPECT_FALSE(table.evicted(r));
    EXPECT_FALSE(table.moved_forward(r));
    EXPECT_EQ(table.staleness_bound(r), -1);
  }
}

TEST(WorkerTable, ValidRanksAreZeroToNumWorkers) {
  WorkerTable table(2);
  EXPECT_FALSE(table.valid(-1));
  EXPECT_TRUE(table.valid(0));
  EXPECT_TRUE(table.valid(1));
  EXPECT_FALSE(table.valid(2));
  table.Heard(-1, 5);  // ignored, not out of bounds
  table.Heard(2, 5);
}

TEST(WorkerTable, FirstJoinIsNotARejoinTheSecondIs) {
  WorkerTable table(2);
  EXPECT_FALSE(table.Connect(0, Conn(0), 1, 100));
  EXPECT_FALSE(table.Join(0));
  EXPECT_TRUE(table.joined(0));
  EXPECT_FALSE(table.joined(1));
  ASSERT_TRUE(table.Leave(0, Conn(0), 1, 200));
  EXPECT_TRUE(table.joined(0));  // leaving does not forget it joined
  EXPECT_FALSE(table.Connect(0, Conn(1), 1, 300));
  EXPECT_TRUE(table.Join(0));
}

TEST(WorkerTable, ConnectAndLeaveCountConnectedWorkersOnce) {
  WorkerTable table(3);
  table.Connect(0, Conn(0), 2, 10);
  table.Connect(1, Conn(1), 0, 10);
  table.Connect(1, Conn(2), 0, 20);  // reconnects before its old one ends
  EXPECT_EQ(table.connected_count(), 2);
  EXPECT_EQ(table.staleness_bound(0), 2);
  EXPECT_EQ(table.last_heard_ms(1), 20);
  ASSERT_TRUE(table.Leave(0, Conn(0), 2, 30));
  EXPECT_FALSE(table.connected(0));
  EXPECT_EQ(table.connected_count(), 1);
  EXPECT_EQ(table.last_heard_ms(0), 30);
}

TEST(WorkerTable, LeaveOfAReplacedConnectionChangesNothing) {
  WorkerTable table(1);
  table.Connect(0, Conn(0), 0, 10);
  table.Connect(0, Conn(1), 3, 20);
  EXPECT_FALSE(table.Leave(0, Conn(0), 0, 30));
  EXPECT_TRUE(table.connected(0));
  EXPECT_EQ(table.connected_count(), 1);
  EXPECT_EQ(table.staleness_bound(0), 3);
  EXPECT_EQ(table.last_heard_ms(0), 20);
  // Without a connection to compare, any leave counts.
  EXPECT_TRUE(table.Leave(0, nullptr, 3, 40));
  EXPECT_FALSE(table.connected(0));
  EXPECT_EQ(table.connected_count(), 0);
}

TEST(WorkerTable, EvictsAtTheTimeoutNotAMillisecondBefore) {
  WorkerTable table(2);
  table.Connect(0, Conn(0), 0, 1000);
  table.Connect(1, Conn(1), 0, 1000);
  table.Heard(1, 1400);
  EXPECT_TRUE(table.EvictSilent(1499, 500, AllLive).empty());
  auto evicted = table.EvictSilent(1500, 500, AllLive);
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].rank, 0);
  EXPECT_EQ(evicted[0].silent_ms, 500);
  EXPECT_TRUE(table.evicted(0));
  EXPECT_FALSE(table.evicted(1));
  EXPECT_TRUE(table.any_evicted());
  EXPECT_EQ(table.evictions(), 1u);
  // Still connected: eviction is about the clocks, not the connection.
  EXPECT_TRUE(table.connected(0));
}

TEST(WorkerTable, EvictsEachSilentWorkerOnceAndInRankOrder) {
  WorkerTable table(3);
  for (int r = 0; r < 3; ++r) table.Connect(r, Conn(r), 0, 0);
  EXPECT_EQ(Ranks(table.EvictSilent(100, 50, AllLive)),
            (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(table.EvictSilent(200, 50, AllLive).empty());
  EXPECT_EQ(table.evictions(), 3u);
}

TEST(WorkerTable, NoTimeoutEvictsNobody) {
  WorkerTable table(1);
  table.Connect(0, Conn(0), 0, 0);
  EXPECT_TRUE(table.EvictSilent(1'000'000, 0, AllLive).empty());
  EXPECT_TRUE(table.EvictSilent(1'000'000, -1, AllLive).empty());
  EXPECT_FALSE(table.evicted(0));
}

TEST(WorkerTable, OnlyConnectedLiveWorkersAreEvicted) {
  WorkerTable table(3);
  table.Connect(0, Conn(0), 0, 0);
  table.Connect(1, Conn(1), 0, 0);
  // Rank 2 never connected; rank 1 is not live (its clock counts for
  // nothing already); rank 0 left.
  ASSERT_TRUE(table.Leave(0, Conn(0), 0, 0));
  EXPECT_TRUE(
      table.EvictSilent(1000, 10, [](int rank) { return rank != 1; }).empty());
  EXPECT_FALSE(table.any_evicted());
}

TEST(WorkerTable, HeardFromAgainAnEvictedWorkerIsBack) {
  WorkerTable table(2);
  table.Connect(0, Conn(0), 0, 0);
  ASSERT_EQ(Ranks(table.EvictSilent(100, 50, AllLive)), std::vector<int>{0});
  EXPECT_FALSE(table.Unevict(1));  // never evicted
  table.Heard(0, 150);
  EXPECT_EQ(table.last_heard_ms(0), 150);
  EXPECT_TRUE(table.Unevict(0));
  EXPECT_FALSE(table.evicted(0));
  EXPECT_FALSE(table.any_evicted());
  EXPECT_FALSE(table.Unevict(0));  // only once
  // Heard at 150: silent again only from 200.
  EXPECT_TRUE(table.EvictSilent(199, 50, AllLive).empty());
  EXPECT_EQ(Ranks(table.EvictSilent(200, 50, AllLive)), std::vector<int>{0});
  EXPECT_EQ(table.evictions(), 2u);
}

TEST(WorkerTable, AnEvictedWorkerThatLeftStaysEvictedUntilItReconnects) {
  WorkerTable table(1);
  table.Connect(0, Conn(0), 0, 0);
  ASSERT_EQ(table.EvictSilent(100, 50, AllLive).size(), 1u);
  ASSERT_TRUE(table.Leave(0, Conn(0), 0, 120));
  EXPECT_TRUE(table.evicted(0));
  EXPECT_TRUE(table.any_evicted());
  // Not connected: a stray frame does not bring it back.
  EXPECT_FALSE(table.Unevict(0));
  // Its new connection does, and says it was evicted.
  EXPECT_TRUE(table.Connect(0, Conn(1), 0, 130));
  EXPECT_FALSE(table.evicted(0));
  EXPECT_FALSE(table.any_evicted());
  EXPECT_FALSE(table.Connect(0, Conn(2), 0, 140));
}

TEST(WorkerTable, MovedForwardIsSetAndClearedByTheCaller) {
  WorkerTable table(2);
  table.SetMovedForward(1, true);
  EXPECT_TRUE(table.moved_forward(1));
  EXPECT_FALSE(table.moved_forward(0));
  table.SetMovedForward(1, false);
  EXPECT_FALSE(table.moved_forward(1));
}

}  // namespace
}  // namespace tether
