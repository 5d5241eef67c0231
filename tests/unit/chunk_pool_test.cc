#include "server/chunk_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace tether {
namespace {

using Chunk = ChunkPool::Chunk;

ChunkPool Make(int workers, uint64_t rows, uint32_t chunk_rows, int epochs) {
  auto pool = ChunkPool::Create(workers, rows, chunk_rows, epochs, 7);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return std::move(pool).value();
}

// Next(rank), which must succeed and hand out a chunk.
Chunk Take(ChunkPool& pool, int rank) {
  auto next = pool.Next(rank);
  EXPECT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_TRUE(next.ok() && next->has_value()) << "rank " << rank << " idle";
  return next.ok() && next->has_value() ? **next : Chunk{-1, 0, 0, 0};
}

// True when Next(rank) succeeds and hands out nothing.
bool Idle(ChunkPool& pool, int rank) {
  auto next = pool.Next(rank);
  return next.ok() && !next->has_value();
}

// Checks that every epoch's chunks were each completed exactly once.
void ExpectAllRowsDoneOnce(const ChunkPool& pool, uint64_t rows, int epochs) {
  auto counts = pool.Counts();
  ASSERT_EQ(counts.size(), static_cast<size_t>(epochs));
  for (const auto& c : counts) {
    EXPECT_EQ(c.chunks_done, c.chunks_total) << "epoch " << c.epoch;
    EXPECT_EQ(c.rows_done, rows) << "epoch " << c.epoch;
    EXPECT_EQ(c.duplicates, 0u) << "epoch " << c.epoch;
  }
  EXPECT_TRUE(pool.Done());
}

TEST(ChunkPool, ChunksCoverEachRowOfEpochExactlyOnce) {
  const uint64_t rows = 103;
  ChunkPool pool = Make(1, rows, 10, 1);
  const auto order = ChunkPool::EpochOrder(rows, 7, 0);
  std::vector<Chunk> chunks;
  std::optional<Chunk> next;
  while ((next = *pool.Next(0))) chunks.push_back(*next);

  ASSERT_EQ(chunks.size(), 11u);  // ceil(103 / 10)
  EXPECT_EQ(pool.Counts()[0].chunks_total, 11u);
  uint64_t expected_first = 0;
  std::vector<int> seen(rows, 0);
  for (uint32_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].epoch, 0);
    EXPECT_EQ(chunks[i].index, i);
    EXPECT_EQ(chunks[i].first, expected_first) << "chunk " << i;
    EXPECT_EQ(chunks[i].count, i + 1 < chunks.size() ? 10u : 3u);
    expected_first += chunks[i].count;
    ASSERT_LE(expected_first, rows) << "chunk " << i << " runs past the end";
    for (uint64_t p = chunks[i].first; p < chunks[i].first + chunks[i].count;
         ++p) {
      ++seen[order[p]];
    }
  }
  EXPECT_EQ(expected_first, rows);
  for (uint64_t r = 0; r < rows; ++r) EXPECT_EQ(seen[r], 1) << "row " << r;
}

TEST(ChunkPool, EpochOrderIsDeterministicPermutation) {
  const auto a = ChunkPool::EpochOrder(1000, 7, 0);
  std::vector<uint32_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0u);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(a, identity) << "not shuffled";
  EXPECT_EQ(a, ChunkPool::EpochOrder(1000, 7, 0));
  EXPECT_NE(a, ChunkPool::EpochOrder(1000, 7, 1));
  EXPECT_NE(a, ChunkPool::EpochOrder(1000, 8, 0));
  EXPECT_TRUE(ChunkPool::EpochOrder(uint64_t{1} << 32, 7, 0).empty());
}

TEST(ChunkPool, EpochOrderPinnedAcrossStandardLibraries) {
  // mt19937_64 is fully specified by the standard and the draw is our own,
  // so these hold everywhere; a change here reorders every run's data. The
  // first equals WorkerShare(10, 0, 1, 1, 0) pinned in dataset_test.
  EXPECT_EQ(ChunkPool::EpochOrder(10, 1, 0),
            std::vector<uint32_t>({4, 0, 7, 5, 2, 8, 3, 1, 6, 9}));
  EXPECT_EQ(ChunkPool::EpochOrder(8, 42, 3),
            std::vector<uint32_t>({6, 3, 2, 7, 1, 0, 5, 4}));
}

TEST(ChunkPool, FasterWorkerGetsMoreChunksAndNoneTwice) {
  const uint64_t rows = 1000;
  const int epochs = 2;
  ChunkPool pool = Make(2, rows, 10, epochs);
  std::vector<std::vector<int>> given(epochs, std::vector<int>(100, 0));
  std::vector<int> chunks_of(2, 0);
  bool finished[2] = {false, false};
  while (!finished[0] || !finished[1]) {
    for (int rank : {0, 0, 0, 1}) {  // rank 0 asks three times as often
      if (finished[rank]) continue;
      auto next = pool.Next(rank);
      ASSERT_TRUE(next.ok());
      if (!next->has_value()) {
        finished[rank] = true;
        continue;
      }
      ++given[(*next)->epoch][(*next)->index];
      ++chunks_of[rank];
    }
  }
  EXPECT_EQ(chunks_of[0], 150);
  EXPECT_EQ(chunks_of[1], 50);
  EXPECT_EQ(pool.RowsDone(0), 1500u);
  EXPECT_EQ(pool.RowsDone(1), 500u);
  for (int e = 0; e < epochs; ++e) {
    for (int i = 0; i < 100; ++i) {
      EXPECT_EQ(given[e][i], 1) << "epoch " << e << " chunk " << i;
    }
  }
  EXPECT_EQ(pool.holders(), 0);
  ExpectAllRowsDoneOnce(pool, rows, epochs);
}

TEST(ChunkPool, DeadWorkersChunkGoesToAnotherWorkerNext) {
  const uint64_t rows = 100;
  ChunkPool pool = Make(3, rows, 10, 1);
  EXPECT_EQ(Take(pool, 0).index, 0u);
  EXPECT_EQ(Take(pool, 1).index, 1u);
  EXPECT_EQ(Take(pool, 2).index, 2u);
  EXPECT_EQ(pool.holders(), 3);

  pool.Release(1);
  EXPECT_EQ(pool.holders(), 2);
  EXPECT_EQ(pool.reassigned(), 1u);
  Chunk again = Take(pool, 0);
  EXPECT_EQ(again.epoch, 0);
  EXPECT_EQ(again.index, 1u) << "a returned chunk goes before chunk 3";
  EXPECT_EQ(Take(pool, 2).index, 3u);

  // Rank 0 takes chunks 4..9, then finds nothing left.
  for (uint32_t index = 4; index < 10; ++index) {
    EXPECT_EQ(Take(pool, 0).index, index);
  }
  EXPECT_TRUE(Idle(pool, 0));
  EXPECT_FALSE(pool.Done()) << "rank 2 still holds chunk 3";
  pool.Complete(2);
  EXPECT_EQ(pool.reassigned(), 1u);
  EXPECT_EQ(pool.RowsDone(1), 0u);
  EXPECT_EQ(pool.RowsDone(0) + pool.RowsDone(2), rows);
  ExpectAllRowsDoneOnce(pool, rows, 1);
}

TEST(ChunkPool, RestartedWorkerGetsWorkAgain) {
  ChunkPool pool = Make(2, 40, 10, 1);
  EXPECT_EQ(Take(pool, 0).index, 0u);
  EXPECT_EQ(Take(pool, 1).index, 1u);
  pool.Release(1);
  EXPECT_EQ(Take(pool, 1).index, 1u);
  EXPECT_EQ(pool.RowsDone(1), 0u) << "the released chunk was not completed";
  EXPECT_EQ(Take(pool, 1).index, 2u);
  EXPECT_EQ(pool.RowsDone(1), 10u);
  EXPECT_EQ(pool.reassigned(), 1u);
}

TEST(ChunkPool, NextEpochStartsOnlyWhenThisEpochIsHandedOut) {
  ChunkPool pool = Make(2, 30, 10, 2);  // three chunks per epoch
  Chunk a = Take(pool, 0);
  Chunk b = Take(pool, 1);
  Chunk c = Take(pool, 0);
  EXPECT_EQ(a.epoch, 0);
  EXPECT_EQ(b.epoch, 0);
  EXPECT_EQ(c.epoch, 0);
  EXPECT_EQ(c.index, 2u);
  // Rank 1 still trains on epoch 0's chunk 1; rank 0 moves on.
  Chunk d = Take(pool, 0);
  EXPECT_EQ(d.epoch, 1);
  EXPECT_EQ(d.index, 0u);
  EXPECT_EQ(pool.Counts()[0].chunks_done, 2u);

  pool.Release(1);  // epoch 0's chunk 1 comes back
  Chunk e = Take(pool, 0);
  EXPECT_EQ(e.epoch, 0) << "served before epoch 1's chunks";
  EXPECT_EQ(e.index, 1u);
  Chunk f = Take(pool, 1);
  EXPECT_EQ(f.epoch, 1);
  EXPECT_EQ(f.index, 1u);
}

TEST(ChunkPool, ReturnedChunksServedLowestEpochAndIndexFirst) {
  ChunkPool pool = Make(4, 20, 10, 2);  // two chunks per epoch
  EXPECT_EQ(Take(pool, 0).index, 0u);   // epoch 0
  EXPECT_EQ(Take(pool, 1).index, 1u);   // epoch 0
  EXPECT_EQ(Take(pool, 2).epoch, 1);    // epoch 1, chunk 0
  pool.Release(2);
  pool.Release(1);
  pool.Release(0);
  EXPECT_EQ(pool.reassigned(), 3u);
  Chunk first = Take(pool, 3);
  Chunk second = Take(pool, 3);
  Chunk third = Take(pool, 3);
  Chunk fourth = Take(pool, 3);
  EXPECT_EQ(first.epoch, 0);
  EXPECT_EQ(first.index, 0u);
  EXPECT_EQ(second.epoch, 0);
  EXPECT_EQ(second.index, 1u);
  EXPECT_EQ(third.epoch, 1);
  EXPECT_EQ(third.index, 0u);
  EXPECT_EQ(fourth.epoch, 1);
  EXPECT_EQ(fourth.index, 1u) << "never handed out before";
  EXPECT_TRUE(Idle(pool, 3));
  ExpectAllRowsDoneOnce(pool, 20, 2);
}

TEST(ChunkPool, DoneOnlyAfterEveryChunkCompleted) {
  ChunkPool pool = Make(2, 20, 10, 1);
  Take(pool, 0);
  Take(pool, 1);
  EXPECT_TRUE(Idle(pool, 0)) << "everything is handed out";
  EXPECT_FALSE(pool.Done()) << "rank 1 still holds chunk 1";
  EXPECT_EQ(pool.holders(), 1);
  pool.Complete(1);
  EXPECT_TRUE(pool.Done());
  EXPECT_EQ(pool.holders(), 0);
  pool.Complete(1);  // holds nothing: no-op
  EXPECT_EQ(pool.Counts()[0].duplicates, 0u);
  EXPECT_EQ(pool.RowsDone(1), 10u);
}

TEST(ChunkPool, LateReleaseAfterNulloptMakesChunkAvailableAgain) {
  ChunkPool pool = Make(2, 20, 10, 1);
  Take(pool, 0);
  Take(pool, 1);
  EXPECT_TRUE(Idle(pool, 0));
  pool.Release(1);
  EXPECT_FALSE(pool.Done());
  Chunk back = Take(pool, 0);  // the idle worker asks again
  EXPECT_EQ(back.index, 1u);
  EXPECT_FALSE(pool.Done());
  EXPECT_TRUE(Idle(pool, 0));
  EXPECT_TRUE(Idle(pool, 1));
  EXPECT_EQ(pool.RowsDone(0), 20u);
  ExpectAllRowsDoneOnce(pool, 20, 1);
}

// Workers stepping through clocks together (BSP): each trains `batch` rows
// of its chunk per clock and asks for the next chunk when it has none left.
// Counts, by epoch and position, the rows trained at clocks before `stop`
// (or until the pool is done when stop < 0). Returns the clock reached.
struct Sim {
  struct Worker {
    std::optional<Chunk> chunk;
    uint32_t trained = 0;  // rows of the chunk trained
  };
  uint32_t batch;
  std::vector<std::vector<int>>* seen;  // [epoch][position]

  int64_t Run(ChunkPool& pool, int workers, int64_t clock, int64_t stop) {
    std::vector<Worker> w(workers);
    for (; stop < 0 || clock < stop; ++clock) {
      bool any = false;
      for (int r = 0; r < workers; ++r) {
        Worker& k = w[r];
        if (!k.chunk || k.trained == k.chunk->count) {
          auto next = pool.Next(r, clock, batch);
          EXPECT_TRUE(next.ok());
          k.chunk = next.ok() ? *next : std::nullopt;
          k.trained = 0;
        }
        if (!k.chunk) continue;
        any = true;
        const uint32_t n = std::min(batch, k.chunk->count - k.trained);
        for (uint32_t i = 0; i < n; ++i) {
          ++(*seen)[k.chunk->epoch][k.chunk->first + k.trained + i];
        }
        k.trained += n;
      }
      if (!any && stop < 0) break;
    }
    return clock;
  }
};

TEST(ChunkPool, ResumedAtARoundClockTrainsEveryRowOnceWithOtherWorkers) {
  const uint64_t rows = 103;
  const int epochs = 2;
  for (int64_t kill : {1, 5, 17, 23, 40}) {
    SCOPED_TRACE("killed at clock " + std::to_string(kill));
    std::vector<std::vector<int>> seen(epochs, std::vector<int>(rows, 0));
    ChunkPool first = Make(2, rows, 10, epochs);
    Sim sim{3, &seen};
    // Killed at `kill`: what the workers held is lost with the run.
    sim.Run(first, 2, 0, kill);
    const ChunkPool::Progress saved = first.Save(kill);
    // The progress says how many rows the round holds; they are the ones
    // trained before the kill.
    uint64_t in_round = 0;
    for (int e = 0; e < epochs; ++e) {
      for (uint32_t i : saved.done[e])
        in_round += std::min<uint64_t>(10, rows - i * 10);
      for (const auto& [i, n] : saved.partial[e]) in_round += n;
    }
    uint64_t trained = 0;
    for (const auto& e : seen)
      trained += std::accumulate(e.begin(), e.end(), 0);
    EXPECT_EQ(in_round, trained);

    auto resumed = ChunkPool::Resume(3, saved, 7);
    ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
    sim.Run(*resumed, 3, kill, -1);
    for (int e = 0; e < epochs; ++e) {
      for (uint64_t p = 0; p < rows; ++p) {
        ASSERT_EQ(seen[e][p], 1) << "epoch " << e << " position " << p;
      }
    }
    ExpectAllRowsDoneOnce(*resumed, rows, epochs);
  }
}

TEST(ChunkPool, SaveCountsAChunkWithoutABatchOnlyWhenCompleted) {
  ChunkPool pool = Make(2, 40, 10, 1);
  ASSERT_TRUE(pool.Next(0, 0, 0).ok());  // chunk 0, batch not said
  ASSERT_TRUE(pool.Next(1, 0, 4).ok());  // chunk 1, 4 rows per clock
  ChunkPool::Progress p = pool.Save(2);
  EXPECT_TRUE(p.done[0].empty());
  ASSERT_EQ(p.partial[0].size(), 1u);
  EXPECT_EQ(p.partial[0].at(1), 8u) << "two clocks of 4 rows";
  EXPECT_EQ(pool.Save(5).done[0], std::vector<uint32_t>{1});
  ASSERT_TRUE(pool.Next(0, 3, 0).ok());  // completes chunk 0, takes chunk 2
  p = pool.Save(5);
  EXPECT_EQ(p.done[0], (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(p.partial[0].empty());

  // Resumed: the rest of nothing partial; chunk 2 (handed out, untrained)
  // and 3 come next.
  auto resumed = ChunkPool::Resume(1, p, 7);
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(Take(*resumed, 0).index, 2u);
  EXPECT_EQ(Take(*resumed, 0).index, 3u);
  EXPECT_TRUE(Idle(*resumed, 0));
  ExpectAllRowsDoneOnce(*resumed, 40, 1);
}

TEST(ChunkPool, ResumedPartChunkHandsOutOnlyItsRestFirst) {
  ChunkPool::Progress p;
  p.rows = 40;
  p.chunk_rows = 10;
  p.epochs = 1;
  p.done = {{0}};
  p.partial = {{{2, 6}}};
  auto pool = ChunkPool::Resume(2, p, 7);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(pool->Counts()[0].rows_done, 16u);
  Chunk rest = Take(*pool, 0);
  EXPECT_EQ(rest.index, 1u) << "handed out before, untrained";
  Chunk part = Take(*pool, 1);
  EXPECT_EQ(part.index, 2u);
  EXPECT_EQ(part.first, 26u);
  EXPECT_EQ(part.count, 4u);
  EXPECT_EQ(Take(*pool, 0).index, 3u);
  EXPECT_TRUE(Idle(*pool, 0));
  EXPECT_TRUE(Idle(*pool, 1));
  ExpectAllRowsDoneOnce(*pool, 40, 1);
}

TEST(ChunkPool, ResumeRefusesProgressThatDoesNotFitNamingIt) {
  ChunkPool::Progress p;
  p.rows = 40;
  p.chunk_rows = 10;
  p.epochs = 1;
  p.done = {{4}};
  auto bad = ChunkPool::Resume(2, p, 7);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("chunk 4 of epoch 0"),
            std::string::npos)
      << bad.status().message();
  p.done = {{}};
  p.partial = {{{1, 10}}};
  bad = ChunkPool::Resume(2, p, 7);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("10 rows trained"), std::string::npos)
      << bad.status().message();
  p.partial = {{}, {}};
  EXPECT_FALSE(ChunkPool::Resume(2, p, 7).ok()) << "two epochs of progress";
}

TEST(ChunkPool, RankOutOfRangeIsInvalidArgument) {
  ChunkPool pool = Make(2, 20, 10, 1);
  for (int rank : {-1, 2}) {
    auto next = pool.Next(rank);
    ASSERT_FALSE(next.ok()) << "rank " << rank;
    EXPECT_EQ(next.status().code(), Code::kInvalidArgument);
    EXPECT_NE(next.status().message().find("rank " + std::to_string(rank)),
              std::string::npos)
        << next.status().message();
    pool.Complete(rank);  // ignored
    pool.Release(rank);   // ignored
    EXPECT_EQ(pool.RowsDone(rank), 0u);
  }
  EXPECT_EQ(pool.holders(), 0);
  EXPECT_EQ(pool.reassigned(), 0u);
  EXPECT_EQ(Take(pool, 0).index, 0u) << "nothing was handed out";
}

TEST(ChunkPool, CreateRejectsBadArgumentsNamingThem) {
  struct Case {
    int workers;
    uint64_t rows;
    uint32_t chunk_rows;
    int epochs;
    std::string names;
  };
  for (const Case& c :
       {Case{0, 10, 5, 1, "workers 0"}, Case{-2, 10, 5, 1, "workers -2"},
        Case{2, 0, 5, 1, "rows 0"},
        Case{2, uint64_t{1} << 32, 5, 1, "rows 4294967296"},
        Case{2, 10, 0, 1, "chunk_rows 0"}, Case{2, 10, 5, 0, "epochs 0"},
        // Found by tools/fuzz (session): one request asked for a pool of
        // 2^26 epochs.
        Case{2, 60000, 2000, 1 << 26, "67108864 epochs of 30 chunks"},
        Case{2, 1u << 31, 1, 1, "1 epochs of 2147483648 chunks"}}) {
    auto pool = ChunkPool::Create(c.workers, c.rows, c.chunk_rows, c.epochs, 1);
    ASSERT_FALSE(pool.ok()) << c.names;
    EXPECT_EQ(pool.status().code(), Code::kInvalidArgument) << c.names;
    EXPECT_NE(pool.status().message().find(c.names), std::string::npos)
        << pool.status().message();
  }
  EXPECT_TRUE(ChunkPool::Create(1, 1, 1, 1, 1).ok());
  EXPECT_TRUE(ChunkPool::Create(1, ChunkPool::kMaxChunks, 1, 1, 1).ok());
}

}  // namespace
}  // namespace tether
