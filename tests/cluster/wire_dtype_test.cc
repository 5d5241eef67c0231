// bfloat16 and int8 on the wire (ClientOptions::wire_dtype, --wire-dtype):
// what such a client pushes is rounded once (int8: stochastically, within a
// step) and applied in f32 on the shards, what it pulls is the shards' f32
// weights rounded once, and it moves half (a quarter of) the bytes; workers
// trained so still reach the accuracy of an f32 run.
#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "schema/auth.h"
#include "schema/bf16.h"
#include "schema/int8.h"
#include "tests/support/cluster.h"
#include "tests/support/raw_peer.h"
#include "tests/support/temp_dir.h"
#include "tests/support/worker_pool.h"
#include "worker/client.h"
#include "worker/request_cutter.h"
#include "worker/shard_link.h"

namespace tether::testing {
namespace {

std::unique_ptr<Client> Observer(const std::string& coordinator,
                                 WireDtype dtype) {
  ClientOptions o;
  o.coordinator = coordinator;
  o.observer = true;
  o.name = dtype == WireDtype::kBf16   ? "bf16 observer"
           : dtype == WireDtype::kInt8 ? "int8 observer"
                                       : "f32 observer";
  o.wire_dtype = dtype;
  o.join_timeout_ms = 20000;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

float Rounded(float v) { return FromBf16(ToBf16(v)); }

// A cluster with no workers (SGD at rate 0.5), and three observers of it:
// one with bf16 on the wire, one with int8, one with f32.
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
    int8_ = Observer(cluster_->coordinator(), tether::WireDtype::kInt8);
    ASSERT_TRUE(bf16_ && f32_ && int8_);
  }

  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<Client> bf16_, f32_, int8_;
};

// The bytes and scales the shards answer an int8 pull of `values` with:
// each block of `block_size` quantized to nearest on its own.
std::vector<float> Int8Rounded(const std::vector<float>& values,
                               size_t block_size) {
  std::vector<float> out(values.size());
  for (size_t first = 0; first < values.size(); first += block_size) {
    const size_t n = std::min(block_size, values.size() - first);
    std::vector<int8_t> q(n);
    std::vector<float> scales(Int8Scales(n));
    ToInt8({values.data() + first, n}, q.data(), scales.data());
    FromInt8(q, scales.data(), out.data() + first);
  }
  return out;
}

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

// An int8 push lands within one step of the gradient (its group's largest
// magnitude / 127), without bias; an int8 pull is the shards' f32 weights
// rounded to nearest once, block by block.
TEST_F(WireDtype, Int8PushesAreWithinAStepAndPullsRoundedOnceShardsKeepF32) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 300));  // two blocks, two groups each
  Client* int8 = int8_.get();
  Client* f32 = f32_.get();
  constexpr int kN = 600;
  std::vector<float> grad(kN);
  for (int i = 0; i < kN; ++i) {
    grad[i] = std::sin(i * 0.7f) * (i % 7 == 0 ? 3.0f : 0.3f);
  }
  for (Client* c : {int8, f32}) {
    ASSERT_TRUE(c->DefineTensor("w", {kN}).ok());  // zeros
  }
  ASSERT_TRUE(int8->Push("w", grad).ok());
  std::vector<float> exact(kN);
  ASSERT_TRUE(f32->Pull("w", exact).ok());
  int differs = 0;
  double error_sum = 0;
  for (int i = 0; i < kN; ++i) {
    const int block = i / 300, first = block * 300 + (i % 300) / 256 * 256;
    const int last = std::min(block * 300 + 300, first + 256);
    float most = 0;
    for (int j = first; j < last; ++j)
      most = std::max(most, std::fabs(grad[j]));
    const float step = most / 127;
    // Applied in f32 at rate 0.5 to a gradient within one step.
    EXPECT_LE(std::fabs(exact[i] + 0.5f * grad[i]), 0.5f * step * 1.001f)
        << "element " << i;
    differs += exact[i] != -0.5f * grad[i];
    error_sum += (exact[i] + 0.5f * grad[i]) / (0.5f * step);
  }
  EXPECT_GT(differs, kN / 2) << "the gradient did not travel as int8";
  // Unbiased: the errors, in steps, average out (sd about 0.4 / sqrt(600)).
  EXPECT_LT(std::fabs(error_sum / kN), 0.1) << error_sum / kN;
  std::vector<float> narrow(kN);
  ASSERT_TRUE(int8->Pull("w", narrow).ok());
  EXPECT_EQ(narrow, Int8Rounded(exact, 300));

  // Sparse rows, a key repeated: within a step of the rows' largest.
  for (Client* c : {int8, f32}) {
    ASSERT_TRUE(c->DefineTable("t", 3).ok());  // zeros
  }
  const std::vector<uint64_t> keys = {5, 9, 5};
  const std::vector<float> rows = {0.1f, 0.2f, 0.3f, 1.1f, 1.2f,
                                   1.3f, 2.1f, 2.2f, 2.3f};
  ASSERT_TRUE(int8->PushRows("t", keys, rows).ok());
  std::vector<float> got(9), got_narrow(9);
  ASSERT_TRUE(f32->PullRows("t", keys, got).ok());
  const float step = 2.3f / 127;  // at most: each shard's part its own
  for (int d = 0; d < 3; ++d) {
    const float key5 = -0.5f * rows[d] - 0.5f * rows[6 + d];
    EXPECT_NEAR(got[d], key5, step) << "key 5, " << d;
    EXPECT_EQ(got[6 + d], got[d]) << "key 5 again, " << d;
    EXPECT_NEAR(got[3 + d], -0.5f * rows[3 + d], 0.5f * step) << "key 9, " << d;
  }
  ASSERT_TRUE(int8->PullRows("t", keys, got_narrow).ok());
  for (int i = 0; i < 9; ++i) {
    EXPECT_NEAR(got_narrow[i], got[i], 0.5f * step * 1.001f) << i;
  }
}

// Half the bytes: a 1M-float tensor pushed and pulled each way, counted by
// the shards (blocks of the default 65536 floats).
TEST_F(WireDtype, Bf16MovesHalfTheBytesAndInt8AQuarter) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 65536));
  Client* bf16 = bf16_.get();
  Client* f32 = f32_.get();
  Client* int8 = int8_.get();
  constexpr uint64_t kBig = 1 << 20;
  for (Client* c : {bf16, f32, int8}) {
    ASSERT_TRUE(c->DefineTensor("big", {kBig}).ok());
  }
  std::vector<float> big(kBig, 1e-3f);
  auto traffic = [&] { return ShardTraffic(*f32); };
  std::pair<uint64_t, uint64_t> moved[3];
  Client* clients[3] = {f32, bf16, int8};
  for (int k = 0; k < 3; ++k) {
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
  // A byte a value and 4 bytes a 256: 0.254 of f32's.
  const auto [int8_in, int8_out] = moved[2];
  EXPECT_LT(int8_in, f32_in * 0.27) << f32_in;
  EXPECT_GT(int8_in, f32_in * 0.24) << f32_in;
  EXPECT_LT(int8_out, f32_out * 0.27) << f32_out;
  EXPECT_GT(int8_out, f32_out * 0.24) << f32_out;
}

// A bf16 or int8 push is checked after it is widened, as an f32 one: an
// infinity in it is refused, naming the element, and changes nothing.
TEST_F(WireDtype, NonFiniteNarrowPushIsRefusedNamingTheElement) {
  ASSERT_NO_FATAL_FAILURE(Start(1, 4));
  for (Client* c : {bf16_.get(), int8_.get()}) {
    const std::string name = c == bf16_.get() ? "w" : "v";
    ASSERT_TRUE(c->DefineTensor(name, {6}).ok());
    std::vector<float> grad(6, 1.0f);
    grad[5] = std::numeric_limits<float>::infinity();
    Status s = c->Push(name, grad);
    EXPECT_EQ(s.code(), Code::kNonFinite) << s.ToString();
    EXPECT_NE(s.message().find("element 5"), std::string::npos) << s.message();
    std::vector<float> w(6);
    ASSERT_TRUE(c->Pull(name, w).ok());
    EXPECT_EQ(w, std::vector<float>(6, 0.0f)) << name;
  }
}

// int8 values that come without their scales are refused, naming the
// block, and change nothing; a pull for a dtype the protocol does not have
// (a newer client's, or garbage) is refused, naming it; the connection and
// the shard serve on.
TEST_F(WireDtype, MalformedNarrowRequestsAreRefusedNamingWhatIsWrong) {
  ASSERT_NO_FATAL_FAILURE(Start(1, 4));
  ASSERT_TRUE(f32_->DefineTensor("w", {8}).ok());
  auto peer = RawPeer::Connect(cluster_->coordinator());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  RawPeer& raw = **peer;
  HelloFields hello;
  hello.name = "raw observer";
  ASSERT_FALSE(raw.Send(Bytes(*MakeHelloFrame(hello))));
  auto welcome = raw.ReadFrame(kReplyTimeoutMs);
  ASSERT_TRUE(welcome.ok()) << welcome.status().ToString();
  ASSERT_NE(welcome->message()->body_as_Welcome(), nullptr);
  ASSERT_FALSE(raw.Send(
      Bytes(*client_internal::DefineFrame(1, "w", false, {8}, 0, Init{}))));
  auto defined = raw.ReadFrame(kReplyTimeoutMs);
  ASSERT_TRUE(defined.ok()) << defined.status().ToString();
  ASSERT_NE(defined->message()->body_as_DefineAck(), nullptr);
  const uint32_t id = defined->message()->body_as_DefineAck()->id();
  flatbuffers::FlatBufferBuilder fbb(256);
  const std::vector<int8_t> q = {1, 2, 3, 4};
  std::vector<flatbuffers::Offset<wire::Block>> blocks = {wire::CreateBlock(
      fbb, 1, 0, 0, 0, 0, false, fbb.CreateVector(q))};  // no q8_scale
  auto blocks_offset = fbb.CreateVector(blocks);
  wire::PushBuilder pb(fbb);
  pb.add_request_id(2);
  pb.add_tensor(id);
  pb.add_blocks(blocks_offset);
  ASSERT_FALSE(raw.Send(Bytes(*FinishFrame(fbb, pb.Finish()))));
  auto answer = raw.ReadFrame(kReplyTimeoutMs);
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  const wire::Error* error = answer->message()->body_as_Error();
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(error->request_id(), 2u);
  EXPECT_EQ(error->message()->str(),
            "push block 1 carries 4 int8 values with 0 scales, not 1");
  std::vector<float> w(8, -1.0f);
  ASSERT_TRUE(f32_->Pull("w", w).ok());
  EXPECT_EQ(w, std::vector<float>(8, 0.0f));

  flatbuffers::FlatBufferBuilder pull(128);
  auto block0 = pull.CreateVector(std::vector<uint32_t>{0});
  wire::PullBuilder unknown(pull);
  unknown.add_request_id(3);
  unknown.add_tensor(id);
  unknown.add_blocks(block0);
  unknown.add_dtype(static_cast<wire::Dtype>(7));
  ASSERT_FALSE(raw.Send(Bytes(*FinishFrame(pull, unknown.Finish()))));
  auto refused = raw.ReadFrame(kReplyTimeoutMs);
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  const wire::Error* bad_dtype = refused->message()->body_as_Error();
  ASSERT_NE(bad_dtype, nullptr);
  EXPECT_EQ(bad_dtype->request_id(), 3u);
  EXPECT_EQ(bad_dtype->message()->str(),
            "pull: dtype 7: expected 0 (f32), 1 (bf16) or 2 (int8)");
  ASSERT_FALSE(raw.Send(Bytes(*client_internal::PullBlocksFrame(
      4, id, {0}, tether::WireDtype::kBf16))));
  auto answered = raw.ReadFrame(kReplyTimeoutMs);
  ASSERT_TRUE(answered.ok()) << answered.status().ToString();
  const wire::PullReply* reply = answered->message()->body_as_PullReply();
  ASSERT_NE(reply, nullptr)
      << wire::EnumNameBody(answered->message()->body_type());
  EXPECT_EQ(reply->request_id(), 4u);
  ASSERT_NE(reply->blocks(), nullptr);
  ASSERT_EQ(reply->blocks()->size(), 1u);
  EXPECT_NE(reply->blocks()->Get(0)->bf16(), nullptr);
  ExpectAllRunning(*cluster_);
}

// tether-up --wire-dtype bf16 or int8: every worker is started pushing and
// pulling so, and the run reaches the accuracy an f32 run is held to
// (Training.LauncherRunReachesStatedAccuracyOnFashionMnist), in as many
// epochs (three: after two, the final weights once measured 81.4% on a
// loaded CI machine, 82% a few clocks before), with the same straggler.
class NarrowWireRun : public ::testing::TestWithParam<std::string> {};

TEST_P(NarrowWireRun, WorkersReachTheTargetAccuracy) {
  const std::string dtype = GetParam();
  TempDir dir;
  const std::string summary_file = dir.path() + "/summary.json";
  auto up = Process::Start(
      {TETHER_UP_BIN, "--http",         "127.0.0.1:0", "--shards",
       "2",           "--workers",      "3",           "--slow",
       "1",           "--slowdown",     kSlowdown,     "--staleness",
       "2",           "--epochs",       "3",           "--target-accuracy",
       "0.82",        "--wire-dtype",   dtype,         "--log-dir",
       dir.path(),    "--summary-file", summary_file},
      dir.path() + "/up.out");
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  // While they train, each worker's command line asks for `dtype`.
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
        CommandLineHas(w.at("pid").to_number<int>(), {"--wire-dtype", dtype});
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

INSTANTIATE_TEST_SUITE_P(Dtypes, NarrowWireRun,
                         ::testing::Values("bf16", "int8"),
                         [](const auto& info) { return info.param; });

// A bad --wire-dtype is refused by each program, naming the flag.
TEST(WireDtypeRun, UnknownWireDtypeIsRefusedNamingTheFlag) {
  std::string output;
  auto code = RunToExit({TETHER_WORKER_BIN, "--coordinator", "127.0.0.1:1",
                         "--wire-dtype", "fp8", "--check"},
                        &output, 10000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 2) << output;
  EXPECT_NE(output.find("--wire-dtype: f32, bf16 or int8, not 'fp8'"),
            std::string::npos)
      << output;
  code = RunToExit({TETHER_UP_BIN, "--wire-dtype", "fp16"}, &output, 10000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 2) << output;
  EXPECT_NE(output.find("--wire-dtype: f32, bf16 or int8, not 'fp16'"),
            std::string::npos)
      << output;
}

}  // namespace
}  // namespace tether::testing
