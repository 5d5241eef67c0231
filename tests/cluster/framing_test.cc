// Bad bytes from the network, sent over real sockets to real shards: each
// must get an Error frame that says why, then a close, while the shard keeps
// serving a healthy client that was connected before the bad one.
#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "schema/flags.h"
#include "schema/frame.h"
#include "tests/support/cluster.h"
#include "tests/support/raw_peer.h"
#include "worker/client.h"

namespace tether {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using testing::Bytes;
using testing::Cluster;
using testing::ClusterOptions;
using testing::ConnectObserver;
using testing::Contains;
using testing::ErrorReply;
using testing::ExpectAllRunning;
using testing::ExpectRefused;
using testing::ExpectServing;
using testing::GarbageFrame;
using testing::Header;
using testing::HelloFrame;
using testing::kReplyTimeoutMs;
using testing::ProcStatusKib;
using testing::RawPeer;
using testing::ReadError;
using testing::StatsRequestFrame;
using testing::TempDir;

// A one-shard cluster (one worker, so observers are welcomed at once) and
// an observer connected before any bad input arrives.
class Framing : public ::testing::Test {
 protected:
  void StartCluster(ClusterOptions options) {
    options.block_size = 16;
    lr_ = options.lr;
    auto cluster = Cluster::Start(options, dir_.path());
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    cluster_ = std::move(*cluster);
    healthy_ = ConnectObserver(cluster_->coordinator());
    ASSERT_NE(healthy_, nullptr);
  }

  void ExpectStillServing(const std::string& tensor) {
    ExpectAllRunning(*cluster_);
    ExpectServing(*healthy_, tensor, lr_);
    auto stats = healthy_->Stats();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    ASSERT_EQ(stats->size(), static_cast<size_t>(cluster_->num_shards()));
    // The tensor spans every shard, so each one served its part.
    for (const ShardStats& shard : *stats) {
      EXPECT_GT(shard.dense_blocks, 0u) << "shard " << shard.shard_id;
      EXPECT_GE(shard.pushes, 1u) << "shard " << shard.shard_id;
    }
  }

  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<Client> healthy_;
  float lr_ = 0;
};

TEST_F(Framing, OversizedFrameRefusedBeforeAllocation) {
  ASSERT_NO_FATAL_FAILURE(StartCluster({}));
  const int64_t peak_before = ProcStatusKib(cluster_->shard(0).pid(), "VmPeak");
  // Only the header: were the shard to allocate and wait for the body, no
  // Error would come back.
  ErrorReply reply;
  ASSERT_NO_FATAL_FAILURE(
      ExpectRefused(cluster_->coordinator(), Header(1u << 30), false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::FrameTooLarge);
  EXPECT_TRUE(Contains(reply.message, "1073741824"));
  EXPECT_TRUE(Contains(reply.message, "67108864"));
  const int64_t peak_after = ProcStatusKib(cluster_->shard(0).pid(), "VmPeak");
  ASSERT_GT(peak_before, 0);
  EXPECT_LT(peak_after - peak_before, 512 * 1024)
      << "VmPeak grew from " << peak_before << " to " << peak_after << " KiB";
  EXPECT_TRUE(cluster_->shard(0)
                  .WaitForLine("exceeds the limit", kReplyTimeoutMs)
                  .ok());
  ExpectStillServing("after_oversized");
}

TEST_F(Framing, OversizedFrameRefusedUnderConfiguredLimit) {
  ClusterOptions options;
  options.extra_flags = {"--max-frame-bytes", "4096"};
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  // A well-formed Hello, made too long by its client name.
  std::vector<uint8_t> hello =
      HelloFrame(kProtocolVersion, std::string(8000, 'n'));
  ASSERT_GT(hello.size(), 8000u);
  ErrorReply reply;
  ASSERT_NO_FATAL_FAILURE(
      ExpectRefused(cluster_->coordinator(), hello, false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::FrameTooLarge);
  EXPECT_TRUE(Contains(reply.message,
                       std::to_string(hello.size() - kFrameHeaderBytes)));
  EXPECT_TRUE(Contains(reply.message, "4096"));
  ExpectStillServing("after_configured_limit");
}

TEST_F(Framing, TruncatedFrameReported) {
  ASSERT_NO_FATAL_FAILURE(StartCluster({}));
  std::vector<uint8_t> bytes = GarbageFrame(11, 50);
  std::memcpy(bytes.data(), Header(100).data(), kFrameHeaderBytes);
  ErrorReply reply;
  ASSERT_NO_FATAL_FAILURE(
      ExpectRefused(cluster_->coordinator(), bytes, true, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::BadFrame);
  EXPECT_TRUE(Contains(reply.message, "truncated"));
  EXPECT_TRUE(Contains(reply.message, "50 of 100"));
  ExpectStillServing("after_truncated");
}

TEST_F(Framing, TruncatedHeaderReported) {
  ASSERT_NO_FATAL_FAILURE(StartCluster({}));
  std::vector<uint8_t> bytes = {0x10, 0x00};
  ErrorReply reply;
  ASSERT_NO_FATAL_FAILURE(
      ExpectRefused(cluster_->coordinator(), bytes, true, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::BadFrame);
  EXPECT_TRUE(Contains(reply.message, "truncated frame header"));
  EXPECT_TRUE(Contains(reply.message, "2 of 4"));
  ExpectStillServing("after_truncated_header");
}

TEST_F(Framing, GarbageBytesRefused) {
  ASSERT_NO_FATAL_FAILURE(StartCluster({}));
  // Pure noise of a plausible length fails on the identifier.
  ErrorReply reply;
  ASSERT_NO_FATAL_FAILURE(ExpectRefused(cluster_->coordinator(),
                                        GarbageFrame(42, 200), false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::BadFrame);
  EXPECT_TRUE(Contains(reply.message, "wrong file identifier"));

  // Noise behind the right identifier must fail the verifier, not crash.
  std::vector<uint8_t> disguised = GarbageFrame(43, 200);
  std::memcpy(disguised.data() + kFrameHeaderBytes + 4, "TTHR", 4);
  ASSERT_NO_FATAL_FAILURE(
      ExpectRefused(cluster_->coordinator(), disguised, false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::BadFrame);
  EXPECT_TRUE(Contains(reply.message, "verification"));

  // A length too short to hold any message is refused from the header.
  ASSERT_NO_FATAL_FAILURE(ExpectRefused(cluster_->coordinator(),
                                        GarbageFrame(44, 3), false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::BadFrame);
  EXPECT_TRUE(Contains(reply.message, "too short"));
  ExpectStillServing("after_garbage");
}

TEST_F(Framing, WrongIdentifierRefused) {
  ASSERT_NO_FATAL_FAILURE(StartCluster({}));
  std::vector<uint8_t> hello = HelloFrame(kProtocolVersion);
  ASSERT_EQ(std::memcmp(hello.data() + kFrameHeaderBytes + 4, "TTHR", 4), 0);
  std::memcpy(hello.data() + kFrameHeaderBytes + 4, "XXXX", 4);
  ErrorReply reply;
  ASSERT_NO_FATAL_FAILURE(
      ExpectRefused(cluster_->coordinator(), hello, false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::BadFrame);
  EXPECT_TRUE(Contains(reply.message, "identifier"));
  EXPECT_TRUE(Contains(reply.message, "'XXXX'"));
  EXPECT_TRUE(Contains(reply.message, "'TTHR'"));
  ExpectStillServing("after_identifier");
}

TEST_F(Framing, WrongVersionRefused) {
  ASSERT_NO_FATAL_FAILURE(StartCluster({}));
  ErrorReply reply;
  ASSERT_NO_FATAL_FAILURE(
      ExpectRefused(cluster_->coordinator(), HelloFrame(99), false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::VersionMismatch);
  EXPECT_TRUE(Contains(reply.message, "99"));
  EXPECT_TRUE(
      Contains(reply.message, "version " + std::to_string(kProtocolVersion)));
  ExpectStillServing("after_version");
}

TEST_F(Framing, HelloRequiredFirst) {
  ASSERT_NO_FATAL_FAILURE(StartCluster({}));
  ErrorReply reply;
  ASSERT_NO_FATAL_FAILURE(ExpectRefused(cluster_->coordinator(),
                                        StatsRequestFrame(), false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::HelloRequired);
  EXPECT_TRUE(Contains(reply.message, "Hello"));
  EXPECT_TRUE(Contains(reply.message, "StatsRequest"));
  ExpectStillServing("after_hello_required");
}

TEST_F(Framing, ManyBadClientsDoNotStopShard) {
  ASSERT_NO_FATAL_FAILURE(StartCluster({}));
  constexpr int kBadClients = 50;
  std::vector<std::unique_ptr<RawPeer>> peers;
  for (int i = 0; i < kBadClients; ++i) {
    auto peer = RawPeer::Connect(cluster_->coordinator());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    std::vector<uint8_t> bytes;
    switch (i % 5) {
      case 0:
        bytes = GarbageFrame(1000 + i, 64 + i);
        break;
      case 1:
        bytes = GarbageFrame(1000 + i, 40);
        break;  // mid-frame
      case 2:
        bytes = {0x20};
        break;  // mid-header
      case 3:
        bytes = HelloFrame(1000 + i);
        break;
      case 4:
        bytes = StatsRequestFrame();
        break;
    }
    if (i % 5 == 1) std::memcpy(bytes.data(), Header(4000).data(), 4);
    // The shard may already have closed; a failed send is fine here.
    (void)(*peer)->Send(bytes);
    peers.push_back(std::move(*peer));
  }
  // Every complete bad frame is answered with an Error, then a close.
  for (int i = 0; i < kBadClients; ++i) {
    if (i % 5 == 1 || i % 5 == 2) continue;
    auto error = ReadError(*peers[i]);
    EXPECT_TRUE(error.ok())
        << "client " << i << ": " << error.status().ToString();
    EXPECT_TRUE(peers[i]->WaitForClose(kReplyTimeoutMs).ok()) << "client " << i;
  }
  // The rest hang up mid-frame, abruptly.
  for (auto& peer : peers) peer->Close();
  peers.clear();
  ExpectStillServing("after_many_bad_clients");
  // The shard still accepts a fresh, well-behaved client too.
  auto late = ConnectObserver(cluster_->coordinator());
  ASSERT_NE(late, nullptr);
  ExpectServing(*late, "after_many_bad_clients_late", lr_);
}

TEST_F(Framing, PeerThatNeverFinishesItsHelloIsClosedAtTheTimeout) {
  ClusterOptions options;
  options.extra_flags = {"--handshake-timeout-ms", "500"};
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  auto silent = RawPeer::Connect(cluster_->coordinator());
  ASSERT_TRUE(silent.ok());
  auto dribbling = RawPeer::Connect(cluster_->coordinator());
  ASSERT_TRUE(dribbling.ok());
  std::vector<uint8_t> hello = HelloFrame(kProtocolVersion);
  ASSERT_FALSE((*dribbling)->Send(std::span(hello).first(3)));  // never more
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE((*silent)->WaitForClose(kReplyTimeoutMs).ok());
  EXPECT_TRUE((*dribbling)->WaitForClose(kReplyTimeoutMs).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(400));
  EXPECT_TRUE(
      cluster_->shard(0)
          .WaitForLine(
              "handshake not done within 500 ms (--handshake-timeout-ms)", 1000)
          .ok());
  ExpectStillServing("after_silent_peers");
}

TEST_F(Framing, IdleConnectionIsClosedButHeartbeatingWorkersStay) {
  ClusterOptions options;
  options.extra_flags = {"--idle-timeout-ms", "1000", "--heartbeat-ms", "200"};
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  auto idle = RawPeer::Connect(cluster_->coordinator());
  ASSERT_TRUE(idle.ok());
  ASSERT_FALSE((*idle)->Send(HelloFrame(kProtocolVersion)));
  auto welcome = (*idle)->ReadFrame(kReplyTimeoutMs);
  ASSERT_TRUE(welcome.ok()) << welcome.status().ToString();
  EXPECT_TRUE((*idle)->WaitForClose(kReplyTimeoutMs).ok());
  EXPECT_TRUE(cluster_->shard(0).WaitForLine("(--idle-timeout-ms)", 1000).ok());
  // The healthy observer was idle too and is gone; a worker, which sends
  // heartbeats, outlives the timeout.
  ClientOptions o;
  o.coordinator = cluster_->coordinator();
  auto worker = Client::Connect(o);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  std::this_thread::sleep_for(std::chrono::milliseconds(1800));
  EXPECT_TRUE((*worker)->Clock().ok());
}

TEST_F(Framing, ConnectionsOverTheCapAreRefused) {
  ClusterOptions options;
  options.extra_flags = {"--max-connections", "4"};
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));  // the observer holds one
  std::vector<std::unique_ptr<RawPeer>> held;
  for (int i = 0; i < 3; ++i) {
    auto peer = RawPeer::Connect(cluster_->coordinator());
    ASSERT_TRUE(peer.ok());
    held.push_back(std::move(*peer));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto refused = RawPeer::Connect(cluster_->coordinator());
  ASSERT_TRUE(refused.ok());
  auto error = ReadError(**refused);
  ASSERT_TRUE(error.ok()) << error.status().ToString();
  EXPECT_TRUE(Contains(error->message, "--max-connections"));
  EXPECT_TRUE((*refused)->WaitForClose(kReplyTimeoutMs).ok());
  ExpectStillServing("at_the_cap");
  held.clear();  // places freed are taken again
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto late = ConnectObserver(cluster_->coordinator());
  ASSERT_NE(late, nullptr);
}

TEST_F(Framing, RequestsWithTooManyKeysAreRefused) {
  ClusterOptions options;
  options.extra_flags = {"--max-keys", "100"};
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  ASSERT_TRUE(healthy_->DefineTable("t", 2).ok());
  std::vector<uint64_t> keys(101);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  std::vector<float> rows(keys.size() * 2);
  Status too_many = healthy_->PullRows("t", keys, rows);
  EXPECT_FALSE(too_many.ok());
  EXPECT_TRUE(Contains(too_many.message(), "--max-keys"));
  Status pushed = healthy_->PushRows("t", keys, rows);
  EXPECT_TRUE(Contains(pushed.message(), "--max-keys"));
  keys.pop_back();
  rows.resize(keys.size() * 2);
  EXPECT_TRUE(healthy_->PullRows("t", keys, rows).ok());
}

TEST_F(Framing, ManyHostileClientsDoNotGrowTheShardsMemory) {
  ASSERT_NO_FATAL_FAILURE(StartCluster({}));
  ExpectServing(*healthy_, "warm_up", lr_);
  // One wave of hostile peers: frames that announce 60 MB and stop,
  // garbage, and bad Hellos, 50 connections at once.
  auto hostile_wave = [&](int round) {
    std::vector<std::unique_ptr<RawPeer>> peers;
    for (int i = 0; i < 50; ++i) {
      auto peer = RawPeer::Connect(cluster_->coordinator());
      ASSERT_TRUE(peer.ok());
      std::vector<uint8_t> bytes =
          i % 3 == 0 ? Header(60u << 20)
                     : (i % 3 == 1 ? GarbageFrame(round * 100 + i, 512)
                                   : HelloFrame(99));
      (void)(*peer)->Send(bytes);
      peers.push_back(std::move(*peer));
    }
    for (auto& peer : peers) peer->Close();
  };
  // The first wave pays what any 50 connections cost once (the allocator's
  // arenas, under TSan its shadow pages); the waves after it must not add.
  ASSERT_NO_FATAL_FAILURE(hostile_wave(0));
  ExpectStillServing("after_first_wave");
  const int64_t before = ProcStatusKib(cluster_->shard(0).pid(), "VmRSS");
  for (int round = 1; round <= 6; ++round) {
    ASSERT_NO_FATAL_FAILURE(hostile_wave(round));
  }
  ExpectStillServing("after_hostile_rounds");
  const int64_t after = ProcStatusKib(cluster_->shard(0).pid(), "VmRSS");
  // A shard that allocated what a frame announces would hold 1 GB per wave.
  EXPECT_LT(after, before + 32 * 1024)
      << "RSS " << before << " KiB -> " << after << " KiB";
}

// Two shards; the bad bytes go to shard 1 (not the coordinator), whose
// address only its ready file tells. The observer talks to both shards.
TEST_F(Framing, BadFramesToSecondShardLeaveItServing) {
  ClusterOptions options;
  options.shards = 2;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  const std::string shard1 = cluster_->address(1);
  ASSERT_FALSE(shard1.empty());
  ASSERT_NE(shard1, cluster_->coordinator());

  ErrorReply reply;
  ASSERT_NO_FATAL_FAILURE(
      ExpectRefused(shard1, Header(1u << 30), false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::FrameTooLarge);
  EXPECT_TRUE(Contains(reply.message, "1073741824"));

  ASSERT_NO_FATAL_FAILURE(
      ExpectRefused(shard1, GarbageFrame(7, 120), false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::BadFrame);
  EXPECT_TRUE(Contains(reply.message, "identifier"));

  ASSERT_NO_FATAL_FAILURE(ExpectRefused(shard1, HelloFrame(99), false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::VersionMismatch);
  EXPECT_TRUE(Contains(reply.message, "99"));

  ASSERT_NO_FATAL_FAILURE(
      ExpectRefused(shard1, StatsRequestFrame(), false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::HelloRequired);
  EXPECT_TRUE(Contains(reply.message, "Hello"));
  ExpectStillServing("after_shard1_bad_frames");
}

}  // namespace
}  // namespace tether

namespace tether::testing {
namespace {

TEST(PullLimits, ReplyLargerThanFrameLimitRefused) {
  TempDir dir;
  ClusterOptions options;
  options.extra_flags = {"--max-frame-bytes", "65536"};
  auto cluster = Cluster::Start(options, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  ClientOptions o;
  o.coordinator = (*cluster)->coordinator();
  o.observer = true;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE((*client)->DefineTensor("big", {100000}).ok());
  std::vector<float> big(100000);
  Status s = (*client)->Pull("big", big);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("over the frame limit of 65536"),
            std::string::npos)
      << s.message();
  // A pull that fits is still answered on the same connection.
  ASSERT_TRUE((*client)->DefineTensor("small", {1000}).ok());
  std::vector<float> small(1000);
  EXPECT_TRUE((*client)->Pull("small", small).ok());
}

}  // namespace
}  // namespace tether::testing
