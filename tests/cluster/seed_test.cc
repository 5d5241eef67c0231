// Initial values depend on the run seed only: not on the number of shards,
// the block size or which shard holds what.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/support/cluster.h"
#include "tests/support/worker_pool.h"

namespace tether::testing {
namespace {

struct Initial {
  std::vector<float> uniform, normal, rows;
};

const std::vector<uint64_t> kKeys = {
    0, 1, 7, 12345, (uint64_t{1} << 40) + 7, ~uint64_t{0}};

Initial PullInitial(int shards, uint64_t seed, int block_size,
                    const std::string& dir) {
  ClusterOptions o;
  o.shards = shards;
  o.seed = seed;
  o.block_size = block_size;
  o.workers = 0;
  auto cluster = Cluster::Start(o, dir);
  EXPECT_TRUE(cluster.ok()) << cluster.status().ToString();
  if (!cluster.ok()) return {};
  auto c = ConnectObserver((*cluster)->coordinator());
  if (c == nullptr) return {};
  EXPECT_EQ(c->num_shards(), shards);
  Initial out;
  out.uniform.resize(10007);
  out.normal.resize(37 * 101);
  out.rows.resize(kKeys.size() * 8);
  EXPECT_TRUE(c->DefineTensor("u", {10007}, {InitKind::kUniform, 0.1f}).ok());
  EXPECT_TRUE(c->DefineTensor("n", {37, 101}, {InitKind::kNormal, 1.0f}).ok());
  EXPECT_TRUE(c->DefineTable("emb", 8, {InitKind::kNormal, 0.5f}).ok());
  EXPECT_TRUE(c->Pull("u", out.uniform).ok());
  EXPECT_TRUE(c->Pull("n", out.normal).ok());
  EXPECT_TRUE(c->PullRows("emb", kKeys, out.rows).ok());
  return out;
}

bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Seed, InitialValuesIndependentOfShardCount) {
  TempDir one, three;
  Initial a = PullInitial(1, 42, 1000, one.path());
  Initial b = PullInitial(3, 42, 333, three.path());
  ASSERT_EQ(a.uniform.size(), 10007u);
  EXPECT_TRUE(BitIdentical(a.uniform, b.uniform));
  EXPECT_TRUE(BitIdentical(a.normal, b.normal));
  EXPECT_TRUE(BitIdentical(a.rows, b.rows));
  // And they are real random values, not zeros.
  float max = 0;
  for (float v : a.uniform) max = std::max(max, std::abs(v));
  EXPECT_GT(max, 0.09f);
  EXPECT_LE(max, 0.1f);
}

TEST(Seed, OtherSeedGivesOtherValues) {
  TempDir d1, d2;
  Initial a = PullInitial(2, 42, 1000, d1.path());
  Initial b = PullInitial(2, 43, 1000, d2.path());
  ASSERT_EQ(a.uniform.size(), b.uniform.size());
  size_t same = 0;
  for (size_t i = 0; i < a.uniform.size(); ++i)
    same += a.uniform[i] == b.uniform[i];
  EXPECT_LT(same, 10u);
  EXPECT_FALSE(BitIdentical(a.rows, b.rows));
}

}  // namespace
}  // namespace tether::testing
