// Reading a same-host worker's pushes from its memory (server/direct_read.h):
// the shard takes a process's offer only when that process holds the other
// end of the connection, and a push read so is the frame it stands for, or
// an error naming what could not be read.
#include "server/direct_read.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/request_cutter.h"

namespace tether {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// A loopback connection within this process: both ends are ours.
struct Loopback {
  asio::io_context io;
  tcp::acceptor acceptor{io,
                         tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
  tcp::socket client{io};
  tcp::socket server{io};

  Loopback() {
    client.connect(acceptor.local_endpoint());
    acceptor.accept(server);
  }
  // The ends as the accepting (shard's) side sees them.
  SocketEnds ServerEnds() const {
    return {server.local_endpoint(), server.remote_endpoint()};
  }
};

TEST(DirectRead, TheProcessHoldingThePeersSocketIsTakenAndNoOtherIs) {
  Loopback link;
  const SocketEnds ends = link.ServerEnds();
  EXPECT_TRUE(CheckPeerProcess(getpid(), ends).ok())
      << CheckPeerProcess(getpid(), ends).ToString();
  // Our parent does not hold it (nor does init).
  for (int other : {static_cast<int>(getppid()), 1}) {
    Status s = CheckPeerProcess(other, ends);
    EXPECT_EQ(s.code(), Code::kUnavailable) << other << ": " << s.ToString();
  }
  Status none = CheckPeerProcess(0, ends);
  EXPECT_EQ(none.code(), Code::kUnavailable) << none.ToString();
  // A connection that does not exist: the peer's port is off by one.
  SocketEnds wrong = ends;
  wrong.remote.port(static_cast<unsigned short>(ends.remote.port() + 1));
  Status s = CheckPeerProcess(getpid(), wrong);
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("not a socket of this host"), std::string::npos)
      << s.message();
}

// The push frame a client builds with `direct`, and the message in it.
struct BuiltPush {
  std::vector<uint8_t> bytes;
  const wire::Push& push() const {
    return *wire::GetSizePrefixedMessage(bytes.data())->body_as_Push();
  }
};

BuiltPush DirectPush(const std::vector<uint32_t>& blocks, uint32_t block_size,
                     std::span<const float> values) {
  OutFrame frame = client_internal::PushBlocksFrame(
      7, 3, 11, false, blocks, block_size, values, false, /*direct=*/true);
  return {frame->Flatten()};
}

// A push whose blocks `make(fbb)` builds.
template <typename Make>
BuiltPush PushWith(Make make) {
  auto fbb = MakeBuilder(256);
  auto blocks = fbb.CreateVector(make(fbb));
  wire::PushBuilder pb(fbb);
  pb.add_request_id(1);
  pb.add_blocks(blocks);
  return {FinishFrame(fbb, pb.Finish())->Flatten()};
}

TEST(DirectRead, APushReadFromThisProcessIsTheFrameItStandsFor) {
  std::vector<float> grad(10);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 0.25f * i - 1.0f;
  // Blocks of 4: the second and the last, shorter one.
  BuiltPush built = DirectPush({1, 2}, 4, grad);
  ASSERT_TRUE(IsDirectPush(built.push()));
  EXPECT_LT(built.bytes.size(), size_t{200}) << "floats carried, not named";
  auto frame = ReadDirectPush(getpid(), built.push(), size_t{1} << 20);
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  const wire::Push* push = frame->message()->body_as_Push();
  ASSERT_NE(push, nullptr);
  EXPECT_FALSE(IsDirectPush(*push));
  EXPECT_EQ(push->request_id(), 7u);
  EXPECT_EQ(push->tensor(), 3u);
  EXPECT_EQ(push->read_clock(), 11);
  ASSERT_EQ(push->blocks()->size(), 2u);
  const std::vector<std::vector<float>> want = {
      {grad[4], grad[5], grad[6], grad[7]}, {grad[8], grad[9]}};
  for (size_t k = 0; k < 2; ++k) {
    const wire::Block* b = push->blocks()->Get(k);
    EXPECT_EQ(b->index(), k + 1);
    ASSERT_NE(b->values(), nullptr);
    EXPECT_EQ(std::vector<float>(b->values()->begin(), b->values()->end()),
              want[k]);
  }
}

// ReadDirectPush of `built` from this process fails with `code`, saying
// `part`.
void ExpectRefused(const BuiltPush& built, size_t max_frame_bytes, Code code,
                   const std::string& part) {
  auto frame = ReadDirectPush(getpid(), built.push(), max_frame_bytes);
  EXPECT_EQ(frame.status().code(), code) << frame.status().ToString();
  EXPECT_NE(frame.status().message().find(part), std::string::npos)
      << frame.status().message();
}

TEST(DirectRead, WhatCannotBeReadIsAnErrorNamingIt) {
  std::vector<float> grad(8, 1.0f);
  // An address nothing is mapped at.
  {
    BuiltPush built = PushWith([](auto& fbb) {
      return std::vector{wire::CreateBlock(fbb, 0, 0, 0, /*address=*/0x10, 4)};
    });
    ExpectRefused(built, size_t{1} << 20, Code::kInvalidArgument,
                  "at 0x10 in worker process");
  }
  // A process that is not there: the worker should send its floats.
  {
    BuiltPush built = DirectPush({0}, 8, grad);
    auto frame = ReadDirectPush(0x3fffffff, built.push(), size_t{1} << 20);
    EXPECT_EQ(frame.status().code(), Code::kProtocol)
        << frame.status().ToString();
  }
  // More floats than a frame may hold: refused before anything is read.
  {
    BuiltPush built = PushWith([&](auto& fbb) {
      return std::vector{wire::CreateBlock(
          fbb, 0, 0, 0, reinterpret_cast<uintptr_t>(grad.data()), 1u << 30)};
    });
    ExpectRefused(built, size_t{64} << 20, Code::kInvalidArgument,
                  "past the frame limit");
  }
  // Some blocks named by address, one carried.
  {
    BuiltPush built = PushWith([&](auto& fbb) {
      auto first = wire::CreateBlock(
          fbb, 0, 0, 0, reinterpret_cast<uintptr_t>(grad.data()), 4);
      return std::vector{
          first, wire::CreateBlock(fbb, 1, fbb.CreateVector(grad.data(), 4))};
    });
    ASSERT_TRUE(IsDirectPush(built.push()));
    ExpectRefused(built, size_t{1} << 20, Code::kInvalidArgument,
                  "not of block 1");
  }
}

}  // namespace
}  // namespace tether
