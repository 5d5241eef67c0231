// bfloat16 on the wire (ClientOptions::wire_dtype, --wire-dtype): what a
// bf16 client pushes is rounded once and applied in f32 on the shards, what
// it pulls is the shards' f32 weights rounded once, and it moves half the
// bytes; workers trained so still reach the accuracy of an f32 run.
#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "schema/bf16.h"
#include "tests/support/cluster.h"
#include "tests/support/raw_peer.h"
#include "tests/support/temp_dir.h"
#include "tests/support/worker_pool.h"
#include "worker/client.h"

namespace tether::testing {
namespace {

std::unique_ptr<Client> Observer(const std::string& coordinator,
                                 WireDtype dtype) {
  ClientOptions o;
  o.coordinator = coordinator;
  o.observer = true;
  o.name = dtype == WireDtype::kBf16 ? "bf16 observer" : "f32 observer";
  o.wire_dtype = dtype;
  o.join_timeout_ms = 20000;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

float Rounded(float v) { return FromBf16(ToBf16(v)); }

// A cluster with no workers (SGD at rate 0.5), and two observers of it:
// one with bf16 on the wire, one with f32.
class WireDtype : public ::testing::Test {
 protected:
  void Start(int shards, int block_size) {
    ClusterOptions options;
    options.shards = shards;
    options.workers = 0;
    options.block_size = block_size;
    options.optimizer = "sgd";
    options.lr = 0.5f;
    auto cluster = Cluster::Start(options, dir_.path());
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    cluster_ = std::move(*cluster);
    bf16_ = Observer(cluster_->coordinator(), tether::WireDtype::kBf16);
    f32_ = Observer(cluster_->coordinator(), tether::WireDtype::kF32);
    ASSERT_TRUE(bf16_ && f32_);
  }

  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<Client> bf16_, f32_;
};

TEST_F(WireDtype, Bf16PushesAndPullsAreRoundedOnceAndShardsKeepF32) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 4));  // the tensor's blocks on both
  Client* bf16 = bf16_.get();
  Client* f32 = f32_.get();

  // Dense: 10 values, none of them a bfloat16 (8 bits of mantissa).
  constexpr int kN = 10;
  std::vector<float> grad(kN);
  for (int i = 0; i < kN; ++i)
    grad[i] = 1.0f + 0.001f * (i + 1) - 2.0f * (i % 3);
  for (Client* c : {bf16, f32}) {
    ASSERT_TRUE(c->DefineTensor("w", {kN}).ok());  // zeros
  }
  ASSERT_TRUE(bf16->Push("w", grad).ok());
  std::vector<float> exact(kN), half(kN);
  ASSERT_TRUE(f32->Pull("w", exact).ok());
  int differs = 0;
  for (int i = 0; i < kN; ++i) {
    // Applied in f32 to the rounded gradient: 0 - 0.5 * bf16(g), exactly.
    EXPECT_EQ(exact[i], -0.5f * Rounded(grad[i])) << "element " << i;
    differs += exact[i] != -0.5f * grad[i];
  }
  EXPECT_EQ(differs, kN) << "the gradient did not travel as bfloat16";
  // A second push lands on f32 weights: -0.5 bf16(g) - 0.5 bf16(g) would
  // be the same in bf16 arithmetic only by chance; checked exactly in f32.
  ASSERT_TRUE(bf16->Push("w", grad).ok());
  ASSERT_TRUE(f32->Pull("w", exact).ok());
  for (int i = 0; i < kN; ++i) {
    const float once = -0.5f * Rounded(grad[i]);
    EXPECT_EQ(exact[i], once - 0.5f * Rounded(grad[i])) << "element " << i;
  }
  ASSERT_TRUE(bf16->Pull("w", half).ok());
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(half[i], Rounded(exact[i])) << "element " << i;
  }

  // Sparse rows, a key repeated.
  for (Client* c : {bf16, f32}) {
    ASSERT_TRUE(c->DefineTable("t", 3).ok());  // zeros
  }
  const std::vector<uint64_t> keys = {5, 9, 5};
  const std::vector<float> rows = {0.1f, 0.2f, 0.3f, 1.1f, 1.2f,
                                   1.3f, 2.1f, 2.2f, 2.3f};
  ASSERT_TRUE(bf16->PushRows("t", keys, rows).ok());
  std::vector<float> got(9), got_half(9);
  ASSERT_TRUE(f32->PullRows("t", keys, got).ok());
  for (int d = 0; d < 3; ++d) {
    const float key5 = -0.5f * Rounded(rows[d]) - 0.5f * Rounded(rows[6 + d]);
    EXPECT_EQ(got[d], key5) << "key 5, " << d;
    EXPECT_EQ(got[6 + d], key5) << "key 5 again, " << d;
    EXPECT_EQ(got[3 + d], -0.5f * Rounded(rows[3 + d])) << "key 9, " << d;
  }
  ASSERT_TRUE(bf16->PullRows("t", keys, got_half).ok());
  for (int i = 0; i < 9; ++i) EXPECT_EQ(got_half[i], Rounded(got[i])) << i;
}

// Half the bytes: a 1M-float tensor pushed and pulled each way, counted by
// the shards (blocks of the default 65536 floats).
TEST_F(WireDtype, Bf16MovesHalfTheBytes) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 65536));
  Client* bf16 = bf16_.get();
  Client* f32 = f32_.get();
  constexpr uint64_t kBig = 1 << 20;
  for (Client* c : {bf16, f32}) {
    ASSERT_TRUE(c->DefineTensor("big", {kBig}).ok());
  }
  std::vector<float> big(kBig, 1e-3f);
  auto traffic = [&] { return ShardTraffic(*f32); };
  std::pair<uint64_t, uint64_t> moved[2];
  Client* clients[2] = {f32, bf16};
  for (int k = 0; k < 2; ++k) {
    const auto before = traffic();
    ASSERT_TRUE(clients[k]->Push("big", big).ok());
    ASSERT_TRUE(clients[k]->Pull("big", big).ok());
    const auto after = traffic();
    moved[k] = {after.first - before.first, after.second - before.second};
  }
  const auto [f32_in, f32_out] = moved[0];
  const auto [bf16_in, bf16_out] = moved[1];
  EXPECT_GT(f32_in, kBig * 4);
  EXPECT_GT(f32_out, kBig * 4);
  EXPECT_LT(bf16_in, f32_in * 0.52) << f32_in;
  EXPECT_GT(bf16_in, f32_in * 0.48) << f32_in;
  EXPECT_LT(bf16_out, f32_out * 0.52) << f32_out;
  EXPECT_GT(bf16_out, f32_out * 0.48) << f32_out;
}

// A bf16 push is checked after it is widened, as an f32 one: an infinity
// in it is refused, naming the element, and changes nothing.
TEST_F(WireDtype, NonFiniteBf16PushIsRefusedNamingTheElement) {
  ASSERT_NO_FATAL_FAILURE(Start(1, 4));
  Client* bf16 = bf16_.get();
  ASSERT_TRUE(bf16->DefineTensor("w", {6}).ok());
  // Non-finite values are refused after widening, as in f32.
  std::vector<float> grad(6, 1.0f);
  grad[5] = std::numeric_limits<float>::infinity();
  Status s = bf16->Push("w", grad);
  EXPECT_EQ(s.code(), Code::kNonFinite) << s.ToString();
  EXPECT_NE(s.message().find("element 5"), std::string::npos) << s.message();
  std::vector<float> w(6);
  ASSERT_TRUE(bf16->Pull("w", w).ok());
  EXPECT_EQ(w, std::vector<float>(6, 0.0f));
}

// tether-up --wire-dtype bf16: every worker is started pushing and pulling
// bfloat16, and the run reaches the accuracy an f32 run is held to
// (Training.LauncherRunReachesStatedAccuracyOnFashionMnist), in as many
// epochs (three: after two, the final weights once measured 81.4% on a
// loaded CI machine, 82% a few clocks before).
TEST(WireDtypeRun, Bf16WorkersReachTheTargetAccuracy) {
  TempDir dir;
  const std::string summary_file = dir.path() + "/summary.json";
  auto up = Process::Start(
      {TETHER_UP_BIN, "--http",         "127.0.0.1:0", "--shards",
       "2",           "--workers",      "3",           "--slow",
       "1",           "--slowdown",     "3",           "--staleness",
       "2",           "--epochs",       "3",           "--target-accuracy",
       "0.82",        "--wire-dtype",   "bf16",        "--log-dir",
       dir.path(),    "--summary-file", summary_file},
      dir.path() + "/up.out");
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  // While they train, each worker's command line asks for bf16.
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  boost::json::value summary;
  ASSERT_TRUE(Eventually(
      [&] {
        boost::system::error_code ec;
        summary = boost::json::parse(read(summary_file), ec);
        return !ec && summary.is_object() && summary.at("state") == "running";
      },
      30000))
      << (*up)->Log();
  int asked = 0;
  for (const auto& w : summary.at("workers").as_array()) {
    asked +=
        CommandLineHas(w.at("pid").to_number<int>(), {"--wire-dtype", "bf16"});
  }
  EXPECT_EQ(asked, 3) << summary;
  auto code = (*up)->Wait(240000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  const std::string out = (*up)->Log();
  EXPECT_EQ(*code, 0) << out;
  EXPECT_NE(out.find("reached the 82% target"), std::string::npos) << out;
  boost::system::error_code ec;
  summary = boost::json::parse(read(summary_file), ec);
  ASSERT_FALSE(ec) << summary_file;
  EXPECT_GE(summary.at("result").at("accuracy").to_number<double>(), 0.82);
}

// A bad --wire-dtype is refused by each program, naming the flag.
TEST(WireDtypeRun, UnknownWireDtypeIsRefusedNamingTheFlag) {
  std::string output;
  auto code = RunToExit({TETHER_WORKER_BIN, "--coordinator", "127.0.0.1:1",
                         "--wire-dtype", "fp8", "--check"},
                        &output, 10000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 2) << output;
  EXPECT_NE(output.find("--wire-dtype: f32 or bf16, not 'fp8'"),
            std::string::npos)
      << output;
  code = RunToExit({TETHER_UP_BIN, "--wire-dtype", "fp16"}, &output, 10000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 2) << output;
  EXPECT_NE(output.find("--wire-dtype fp16: f32 or bf16"), std::string::npos)
      << output;
}

}  // namespace
}  // namespace tether::testing
