// Reading a same-host worker's pushes from its memory and writing its pulls
// into it (server/direct_read.h): the shard takes a process's offer only
// when that process holds the other end of the connection, a push read so
// is the frame it stands for, a pull's values land one block after another
// and the client puts them where they belong, and what cannot be read or
// written is an error naming it.
#include "server/direct_read.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <memory>
#include <span>
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
      7, 3, 11, client_internal::PushKind::kGradient, blocks, block_size,
      values, WireDtype::kF32,
      /*direct=*/true);
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

// A reply of `blocks` (index, count) landed, as a shard builds it.
std::vector<uint8_t> LandedReply(
    const std::vector<std::pair<uint32_t, uint32_t>>& blocks) {
  auto fbb = MakeBuilder(256);
  std::vector<flatbuffers::Offset<wire::Block>> out;
  out.reserve(blocks.size());
  for (auto [index, count] : blocks) {
    out.push_back(wire::CreateBlock(fbb, index, 0, 0, 0, count, true));
  }
  auto offset = fbb.CreateVector(out);
  wire::PullReplyBuilder b(fbb);
  b.add_request_id(9);
  b.add_blocks(offset);
  return FinishFrame(fbb, b.Finish())->Flatten();
}

TEST(DirectRead, APullsValuesLandOneBlockAfterAnotherAndGoWhereTheyBelong) {
  // Blocks 2 and 0 of a 10-float tensor in blocks of 4, from the store.
  auto block2 =
      std::make_shared<std::vector<float>>(std::vector<float>{8.5f, -9.25f});
  auto block0 =
      std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  std::vector<float> landing(6, -1.0f);
  Landing l;
  l.pid = getpid();
  l.request_id = 9;
  l.address = reinterpret_cast<uintptr_t>(landing.data());
  l.pieces = {{block2, *block2}, {block0, *block0}};
  const std::vector<uint8_t> reply = LandedReply({{2, 2}, {0, 4}});
  auto fbb = MakeBuilder(64);
  const OutFrame ack = FinishFrame(fbb, wire::CreateAck(fbb));
  EXPECT_EQ(WriteLanding(l, ack), ack) << "the reply itself, not an Error";
  EXPECT_EQ(landing, (std::vector<float>{8.5f, -9.25f, 1, 2, 3, 4}));
  std::vector<float> out(10, 0.0f);
  const auto* message = wire::GetSizePrefixedMessage(reply.data());
  Status copied = client_internal::CopyPulledBlocks(
      *message->body_as_PullReply(), 4, out, landing);
  ASSERT_TRUE(copied.ok()) << copied.ToString();
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4, 0, 0, 0, 0, 8.5f, -9.25f}));
  // A landing shorter than the blocks it is said to hold.
  Status past = client_internal::CopyPulledBlocks(
      *message->body_as_PullReply(), 4, out,
      std::span<const float>(landing).first(5));
  EXPECT_EQ(past.code(), Code::kProtocol) << past.ToString();
}

// The Error a failed WriteLanding answers with, read back.
Status WriteFailure(const Landing& l) {
  auto fbb = MakeBuilder(64);
  OutFrame answer = WriteLanding(l, FinishFrame(fbb, wire::CreateAck(fbb)));
  const std::vector<uint8_t> bytes = answer->Flatten();
  const auto* error =
      wire::GetSizePrefixedMessage(bytes.data())->body_as_Error();
  if (error == nullptr) return Status::Ok();
  return StatusFromError(*error, "shard");
}

TEST(DirectRead, WhatCannotBeWrittenIsAnErrorNamingIt) {
  auto values = std::make_shared<std::vector<float>>(4, 1.0f);
  Landing l;
  l.pid = getpid();
  l.request_id = 5;
  l.address = 0x10;  // nothing mapped there
  l.pieces = {{values, *values}};
  Status unmapped = WriteFailure(l);
  EXPECT_EQ(unmapped.code(), Code::kInvalidArgument) << unmapped.ToString();
  EXPECT_NE(unmapped.message().find("at 0x10 in worker process"),
            std::string::npos)
      << unmapped.message();
  std::vector<float> landing(4);
  l.address = reinterpret_cast<uintptr_t>(landing.data());
  l.pid = 0x3fffffff;  // no such process: the worker pulls again without
  Status gone = WriteFailure(l);
  EXPECT_EQ(gone.code(), Code::kProtocol) << gone.ToString();
}

}  // namespace
}  // namespace tether
