#include "server/data_progress.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/share_plan.h"

namespace tether {
namespace {

TEST(DataProgress, JsonRoundTripKeepsChunksPartsAndSharePlans) {
  DataProgress progress;
  ChunkPool::Progress chunks;
  chunks.rows = 103;
  chunks.chunk_rows = 10;
  chunks.epochs = 2;
  chunks.done = {{0, 1, 2, 5, 9, 10}, {}};
  chunks.partial = {{{3, 4}, {7, 1}}, {{0, 9}}};
  progress.chunks = chunks;
  progress.shares[0] = {{0, 1, 3}, {0, 0, 12}};
  progress.shares[1] = {{1, 3}, {40, -1}};
  progress.leftovers = {{0, 2, 3, 640}, {1, 0, 2, 0}};

  auto back = DataProgressFromJson(DataProgressToJson(progress));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->chunks.has_value());
  EXPECT_EQ(back->chunks->rows, 103u);
  EXPECT_EQ(back->chunks->chunk_rows, 10u);
  EXPECT_EQ(back->chunks->epochs, 2);
  EXPECT_EQ(back->chunks->done, chunks.done);
  EXPECT_EQ(back->chunks->partial, chunks.partial);
  ASSERT_EQ(back->shares.size(), 2u);
  EXPECT_EQ(back->shares[0].members, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(back->shares[0].started, (std::vector<int64_t>{0, 0, 12}));
  EXPECT_EQ(back->shares[1].members, (std::vector<int>{1, 3}));
  EXPECT_EQ(back->shares[1].started, (std::vector<int64_t>{40, -1}));
  EXPECT_EQ(back->leftovers, progress.leftovers);

  DataProgress none;  // a run that never asked for a chunk
  auto empty = DataProgressFromJson(DataProgressToJson(none));
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->chunks.has_value());
  EXPECT_TRUE(empty->shares.empty());
}

TEST(DataProgress, DamagedTextIsCorruptionNamingWhat) {
  for (const std::string& bad :
       {std::string("{"), std::string("[]"), std::string(R"({"shares": 3})"),
        std::string(R"({"shares": [{"epoch": 0, "members": [2, 1],
                        "started": [0, 0]}]})"),
        std::string(R"({"shares": [{"epoch": 0, "members": [1],
                        "started": []}]})"),
        std::string(R"({"chunks": {"rows": 10, "chunk_rows": 5, "epochs": 1,
                        "done": [[[3, 1]]]}, "shares": []})"),
        std::string(R"({"shares": [], "leftovers": [[0, 3, 3, 10]]})")}) {
    auto parsed = DataProgressFromJson(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), Code::kCorruption) << bad;
    EXPECT_NE(parsed.status().message().find("data progress"),
              std::string::npos)
        << parsed.status().message();
  }
}

TEST(SharePlans, MembersAreFixedWhenAnEpochIsPlanned) {
  SharePlans plans;
  auto a = plans.Ask(0, 0, 0, {0, 1});
  EXPECT_TRUE(a.decided);
  EXPECT_EQ(a.index, 0);
  EXPECT_EQ(a.members, 2);
  // Rank 2 joins during epoch 0: it sits epoch 0 out.
  auto late = plans.Ask(2, 0, 5, {0, 1, 2});
  EXPECT_TRUE(late.decided);
  EXPECT_EQ(late.index, -1);
  // Epoch 1 is not planned until a member of epoch 0 asks for it.
  EXPECT_FALSE(plans.Ask(2, 1, 6, {0, 1, 2}).decided);
  auto b = plans.Ask(1, 1, 30, {0, 1, 2});
  EXPECT_TRUE(b.decided);
  EXPECT_EQ(b.index, 1);
  EXPECT_EQ(b.members, 3);
  EXPECT_EQ(b.start_clock, 30);
  EXPECT_EQ(plans.Ask(2, 1, 31, {0, 1, 2}).index, 2);
  // Rank 0 left during epoch 1: epoch 2 is split between 1 and 2.
  auto c = plans.Ask(2, 2, 60, {1, 2});
  EXPECT_TRUE(c.decided);
  EXPECT_EQ(c.members, 2);
  EXPECT_EQ(c.index, 1);
}

TEST(SharePlans, AComingBackMemberKeepsItsStartClock) {
  SharePlans plans;
  EXPECT_EQ(plans.Ask(0, 0, 0, {0, 1}).start_clock, 0);
  EXPECT_EQ(plans.Ask(1, 0, 3, {0, 1}).start_clock, 3);
  // Rank 1 restarted, or the run resumed from the plans: same start.
  SharePlans resumed;
  resumed.Restore(plans.plans(), plans.leftovers());
  auto again = resumed.Ask(1, 0, 20, {0, 1});
  EXPECT_EQ(again.index, 1);
  EXPECT_EQ(again.start_clock, 3);
}

TEST(SharePlans, LeftoversAreTakenOnceLowestEpochFirstUpToTheAskedEpoch) {
  SharePlans plans;
  plans.AddLeftover({2, 1, 3, 500});
  plans.AddLeftover({1, 0, 2, 64});
  plans.AddLeftover({1, 1, 2, 0});
  EXPECT_FALSE(plans.TakeLeftover(0).has_value()) << "none of epoch 0";
  auto a = plans.TakeLeftover(2);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (SharePlans::Leftover{1, 0, 2, 64}));
  auto b = plans.TakeLeftover(1);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, (SharePlans::Leftover{1, 1, 2, 0}));
  EXPECT_FALSE(plans.TakeLeftover(1).has_value()) << "epoch 2's is later";
  EXPECT_EQ(plans.leftovers().size(), 1u);
  auto c = plans.TakeLeftover(5);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->epoch, 2);
  EXPECT_FALSE(plans.TakeLeftover(5).has_value()) << "each is taken once";
}

TEST(SharePlans, HandOffGivesSharesOfRanksBeyondTheWorkersToTheOthers) {
  SharePlans plans;
  plans.Ask(0, 0, 0, {0, 1, 2}, 100);
  plans.Ask(1, 0, 4, {0, 1, 2}, 50);
  plans.Ask(2, 0, 0, {0, 1, 2});     // batch not said
  plans.Ask(0, 1, 90, {0, 1}, 100);  // epoch 1: rank 1 has not asked
  // Resumed at clock 10 on 1 worker.
  EXPECT_EQ(plans.HandOff(1, 10), 2);
  auto a = plans.TakeLeftover(1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (SharePlans::Leftover{0, 1, 3, 300})) << "6 clocks of 50";
  auto b = plans.TakeLeftover(1);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, (SharePlans::Leftover{1, 1, 2, 0})) << "never started";
  EXPECT_FALSE(plans.TakeLeftover(1).has_value())
      << "rank 2's batch is not known: it keeps its share";
  // A handed-off rank that comes back sits the epoch out.
  EXPECT_EQ(plans.Ask(1, 0, 12, {0, 1}, 50).index, -1);
  EXPECT_EQ(plans.Ask(0, 0, 12, {0, 1}, 100).index, 0);
  EXPECT_EQ(plans.HandOff(1, 20), 0) << "once";
}

TEST(SharePlans, NoMemberOfThePreviousEpochLeftPlansTheNextForAnyone) {
  SharePlans plans;
  plans.Ask(0, 0, 0, {0});
  // Rank 0 left; rank 1 joined late and must not wait forever.
  auto a = plans.Ask(1, 1, 10, {1});
  EXPECT_TRUE(a.decided);
  EXPECT_EQ(a.index, 0);
  EXPECT_EQ(a.members, 1);
}

}  // namespace
}  // namespace tether
