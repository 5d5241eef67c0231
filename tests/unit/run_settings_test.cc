// A resumed run's settings: the round's, with flags given now either
// agreeing, overriding a tunable setting, or refused by name.
#include "server/run_settings.h"

#include <gtest/gtest.h>

namespace tether {
namespace {

RunSettings Round() {
  RunSettings r;
  r.run_id = "abc";
  r.seed = 21;
  r.num_shards = 2;
  r.num_workers = 4;
  r.block_size = 4096;
  r.max_staleness = 3;
  r.checkpoint_every = 60;
  r.optimizer.kind = OptimizerKind::kAdam;
  r.optimizer.lr = 0.001f;
  r.backup_workers = 1;
  r.staleness_lr = true;
  return r;
}

TEST(ResumedSettings, FlagsNotGivenComeFromTheRound) {
  RunSettings defaults;  // what flags left out hold
  auto s = ResumedSettings(Round(), defaults, {}, nullptr);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->seed, 21u);
  EXPECT_EQ(s->num_shards, 2);
  EXPECT_EQ(s->num_workers, 4);
  EXPECT_EQ(s->block_size, 4096u);
  EXPECT_EQ(s->max_staleness, 3);
  EXPECT_EQ(s->checkpoint_every, 60);
  EXPECT_EQ(s->optimizer.kind, OptimizerKind::kAdam);
  EXPECT_EQ(s->optimizer.lr, 0.001f);
  EXPECT_EQ(s->backup_workers, 1);
  EXPECT_TRUE(s->staleness_lr);
  EXPECT_EQ(s->run_id, "abc");
}

TEST(ResumedSettings, AGivenIdentityFlagThatDiffersIsRefusedNamingIt) {
  RunSettings now = Round();
  now.optimizer.kind = OptimizerKind::kSgd;
  auto s = ResumedSettings(Round(), now, {"optimizer"}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--optimizer adam in the round, sgd now"),
            std::string::npos)
      << s.status().message();

  now = Round();
  now.num_workers = 3;
  s = ResumedSettings(Round(), now, {"workers"}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--workers 4 in the round, 3 now"),
            std::string::npos)
      << s.status().message();

  // The same value given again is fine; a differing value not given is the
  // flag's default and does not count.
  now = Round();
  now.seed = 99;
  EXPECT_TRUE(
      ResumedSettings(Round(), Round(), {"seed", "workers"}, nullptr).ok());
  EXPECT_TRUE(ResumedSettings(Round(), now, {"workers"}, nullptr).ok());
}

TEST(ResumedSettings, AGivenTunableFlagOverridesTheRoundAndIsSaid) {
  RunSettings now;
  now.optimizer.lr = 0.0005f;
  now.max_staleness = 1;
  std::vector<std::string> said;
  auto s = ResumedSettings(Round(), now, {"lr", "max-staleness"}, &said);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->optimizer.lr, 0.0005f);
  EXPECT_EQ(s->max_staleness, 1);
  EXPECT_EQ(s->optimizer.kind, OptimizerKind::kAdam);  // from the round
  ASSERT_EQ(said.size(), 2u);
  EXPECT_EQ(said[0], "--lr 0.0005 now (0.001 in the round)");
  EXPECT_EQ(said[1], "--max-staleness 1 now (3 in the round)");
}

TEST(ResumedSettings, BackupWorkersMustStayBelowTheRoundsWorkers) {
  RunSettings now;
  now.backup_workers = 4;
  auto s = ResumedSettings(Round(), now, {"backup-workers"}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--backup-workers"), std::string::npos);
}

}  // namespace
}  // namespace tether
