#include "schema/frame.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace tether {
namespace {

// gtest's own substring predicate, so that the tests need no gmock.
#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, needle, haystack)

uint32_t ReadLe32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
         uint32_t{p[3]} << 24;
}

void WriteLe32(uint32_t n, uint8_t* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(n >> (8 * i));
}

// A received Frame holding `out`'s body, as a connection would read it.
Frame Receive(const OutFrame& out) {
  const uint32_t body_size =
      static_cast<uint32_t>(out->size() - kFrameHeaderBytes);
  Frame frame(body_size);
  std::memcpy(frame.body(), out->data() + kFrameHeaderBytes, body_size);
  return frame;
}

OutFrame MakeHello(int32_t rank, const std::string& client_name) {
  flatbuffers::FlatBufferBuilder fbb;
  auto name = fbb.CreateString(client_name);
  auto hello = wire::CreateHello(fbb, kProtocolVersion, wire::Role::Worker,
                                 rank, /*staleness=*/2, /*shard_id=*/-1,
                                 /*address=*/0, /*auth_proof=*/0, name);
  return FinishFrame(fbb, hello);
}

Result<uint32_t> ParseHeaderOf(uint32_t length, size_t max_frame_bytes) {
  uint8_t header[kFrameHeaderBytes];
  WriteLe32(length, header);
  return ParseFrameHeader(header, max_frame_bytes);
}

TEST(Frame, ConstructorWritesLittleEndianHeader) {
  Frame frame(0x01020304);
  EXPECT_EQ(frame.size(), kFrameHeaderBytes + 0x01020304);
  EXPECT_EQ(frame.body_size(), 0x01020304u);
  EXPECT_EQ(frame.data()[0], 0x04);
  EXPECT_EQ(frame.data()[1], 0x03);
  EXPECT_EQ(frame.data()[2], 0x02);
  EXPECT_EQ(frame.data()[3], 0x01);
  EXPECT_EQ(frame.body(), frame.data() + kFrameHeaderBytes);
}

TEST(Frame, HeaderIsLittleEndian) {
  const uint8_t header[kFrameHeaderBytes] = {0x01, 0x02, 0x03, 0x00};
  auto n = ParseFrameHeader(header, kDefaultMaxFrameBytes);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 0x030201u);
}

TEST(Frame, HeaderAtLimitAccepted) {
  auto n = ParseHeaderOf(1000, 1000);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 1000u);
}

TEST(Frame, HeaderOverLimitIsFrameTooLarge) {
  auto n = ParseHeaderOf(1001, 1000);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), Code::kFrameTooLarge);
  EXPECT_CONTAINS(n.status().message(), "1001");
  EXPECT_CONTAINS(n.status().message(), "1000");
}

TEST(Frame, MaximumHeaderOverDefaultLimitIsFrameTooLarge) {
  const uint8_t header[kFrameHeaderBytes] = {0xff, 0xff, 0xff, 0xff};
  auto n = ParseFrameHeader(header, kDefaultMaxFrameBytes);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), Code::kFrameTooLarge);
  EXPECT_CONTAINS(n.status().message(), "4294967295");
  EXPECT_CONTAINS(n.status().message(), std::to_string(kDefaultMaxFrameBytes));
}

TEST(Frame, HeaderTooShortIsBadFrame) {
  auto n = ParseHeaderOf(kMinFrameBodyBytes - 1, kDefaultMaxFrameBytes);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), Code::kBadFrame);
  EXPECT_EQ(n.status().message(),
            "frame length 7 is too short to hold a message");
}

TEST(Frame, ZeroLengthHeaderIsBadFrame) {
  auto n = ParseHeaderOf(0, kDefaultMaxFrameBytes);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), Code::kBadFrame);
}

TEST(Frame, HeaderAtMinimumBodyAccepted) {
  auto n = ParseHeaderOf(kMinFrameBodyBytes, kDefaultMaxFrameBytes);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, kMinFrameBodyBytes);
}

TEST(Frame, FinishFramePrefixIsBodyLength) {
  OutFrame out = MakeHello(3, "trainer");
  ASSERT_GT(out->size(), kFrameHeaderBytes + kMinFrameBodyBytes);
  EXPECT_EQ(ReadLe32(out->data()), out->size() - kFrameHeaderBytes);
  auto n = ParseFrameHeader(out->data(), kDefaultMaxFrameBytes);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, out->size() - kFrameHeaderBytes);
  EXPECT_EQ(std::memcmp(out->data() + kFrameHeaderBytes + 4, "TTHR", 4), 0);
}

TEST(Frame, RoundTripVerifies) {
  Frame frame = Receive(MakeHello(3, "trainer"));
  Status s = frame.Verify();
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(frame.message()->body_type(), wire::Body::Hello);
  const wire::Hello* hello = frame.message()->body_as_Hello();
  ASSERT_NE(hello, nullptr);
  EXPECT_EQ(hello->protocol_version(), kProtocolVersion);
  EXPECT_EQ(hello->role(), wire::Role::Worker);
  EXPECT_EQ(hello->rank(), 3);
  EXPECT_EQ(hello->staleness(), 2);
  EXPECT_EQ(hello->shard_id(), -1);
  EXPECT_EQ(hello->address(), nullptr);
  ASSERT_NE(hello->client_name(), nullptr);
  EXPECT_EQ(hello->client_name()->str(), "trainer");
}

TEST(Frame, AdoptedBuilderIsTheFrameWithoutACopy) {
  // Large enough for the pool, as a push read from a worker is.
  auto fbb = MakeBuilder(size_t{256} << 10);
  std::vector<float> values(50000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * i;
  auto floats = fbb.CreateVector(values);
  auto block = wire::CreateBlock(fbb, 7, floats);
  auto blocks = fbb.CreateVector(&block, 1);
  wire::PushBuilder pb(fbb);
  pb.add_request_id(42);
  pb.add_tensor(3);
  pb.add_blocks(blocks);
  wire::FinishSizePrefixedMessageBuffer(
      fbb, wire::CreateMessage(fbb, wire::Body::Push, pb.Finish().Union()));
  const uint8_t* built = fbb.GetBufferPointer();
  const size_t built_size = fbb.GetSize();

  Frame frame = Frame::Adopt(fbb);
  EXPECT_EQ(frame.data(), built);  // the builder's own bytes
  EXPECT_EQ(frame.size(), built_size);
  EXPECT_EQ(ReadLe32(frame.data()), frame.body_size());
  EXPECT_EQ(frame.body(), frame.data() + kFrameHeaderBytes);
  EXPECT_EQ(fbb.GetSize(), 0u);
  Status s = frame.Verify();
  ASSERT_TRUE(s.ok()) << s.ToString();
  const wire::Push* push = frame.message()->body_as_Push();
  ASSERT_NE(push, nullptr);
  EXPECT_EQ(push->request_id(), 42u);
  EXPECT_EQ(push->tensor(), 3u);
  ASSERT_EQ(push->blocks()->size(), 1u);
  const auto* got = push->blocks()->Get(0)->values();
  ASSERT_EQ(got->size(), values.size());
  EXPECT_EQ(got->Get(49999), 0.5f * 49999);
  // Moved, the frame keeps its bytes where they were.
  Frame moved = std::move(frame);
  EXPECT_EQ(moved.data(), built);
  EXPECT_TRUE(moved.Verify().ok());
}

TEST(Frame, BodyTooShortIsBadFrame) {
  Frame frame(kMinFrameBodyBytes - 1);
  std::memset(frame.body(), 0, kMinFrameBodyBytes - 1);
  Status s = frame.Verify();
  EXPECT_EQ(s.code(), Code::kBadFrame);
  EXPECT_EQ(s.message(),
            "frame body of 7 bytes is too short to hold a message");
}

TEST(Frame, WrongIdentifierNamed) {
  OutFrame out = MakeHello(0, "w");
  Frame frame = Receive(out);
  std::memcpy(frame.body() + 4, "ABCD", 4);
  Status s = frame.Verify();
  EXPECT_EQ(s.code(), Code::kBadFrame);
  EXPECT_EQ(s.message(), "wrong file identifier 'ABCD' (expected 'TTHR')");
}

TEST(Frame, UnprintableIdentifierBytesMasked) {
  Frame frame = Receive(MakeHello(0, "w"));
  const uint8_t bad[4] = {'T', 0x00, 0x7f, 0xff};
  std::memcpy(frame.body() + 4, bad, 4);
  Status s = frame.Verify();
  EXPECT_EQ(s.code(), Code::kBadFrame);
  EXPECT_EQ(s.message(), "wrong file identifier 'T\?\?\?' (expected 'TTHR')");
}

TEST(Frame, CorruptedOffsetFailsVerification) {
  Frame frame = Receive(MakeHello(0, "w"));
  // The root offset now points far past the end of the body.
  WriteLe32(0x7ffffff0, frame.body());
  Status s = frame.Verify();
  EXPECT_EQ(s.code(), Code::kBadFrame);
  EXPECT_EQ(s.message(), "frame failed FlatBuffers verification");
}

TEST(Frame, CorruptedStringLengthFailsVerification) {
  const std::string name = "a-client-name-that-is-long-enough";
  OutFrame out = MakeHello(0, name);
  Frame frame = Receive(out);
  // Find the string and make its length run past the end of the frame.
  uint8_t* body = frame.body();
  const size_t body_size = frame.body_size();
  size_t at = 0;
  for (; at + name.size() <= body_size; ++at) {
    if (std::memcmp(body + at, name.data(), name.size()) == 0) break;
  }
  ASSERT_GE(at, 4u);
  ASSERT_LE(at + name.size(), body_size);
  ASSERT_EQ(ReadLe32(body + at - 4), name.size());
  WriteLe32(0x00ffffff, body + at - 4);
  Status s = frame.Verify();
  EXPECT_EQ(s.code(), Code::kBadFrame);
  EXPECT_EQ(s.message(), "frame failed FlatBuffers verification");
}

TEST(Frame, TruncatedFrameFailsVerification) {
  OutFrame out = MakeHello(0, "a-client-name-to-cut-off");
  const uint32_t full = static_cast<uint32_t>(out->size() - kFrameHeaderBytes);
  // A consistent header for fewer bytes than the message needs.
  const uint32_t cut = full - 8;
  Frame frame(cut);
  std::memcpy(frame.body(), out->data() + kFrameHeaderBytes, cut);
  Status s = frame.Verify();
  EXPECT_EQ(s.code(), Code::kBadFrame);
  EXPECT_EQ(s.message(), "frame failed FlatBuffers verification");
}

TEST(Frame, MessageWithoutBodyRejected) {
  flatbuffers::FlatBufferBuilder fbb;
  auto message = wire::CreateMessage(fbb);
  wire::FinishSizePrefixedMessageBuffer(fbb, message);
  auto out = std::make_shared<const OutBuffer>(
      fbb.Release(), std::vector<OutBuffer::Splice>{},
      std::vector<std::shared_ptr<const void>>{});
  Frame frame = Receive(out);
  Status s = frame.Verify();
  EXPECT_EQ(s.code(), Code::kBadFrame);
  EXPECT_EQ(s.message(), "message has no body");
}

// Found by tools/fuzz (session): a type with no value made the shard read
// a null DefineTensor.
TEST(Frame, MessageWithTypeButNoBodyRejected) {
  flatbuffers::FlatBufferBuilder fbb;
  wire::MessageBuilder b(fbb);
  b.add_body_type(wire::Body::DefineTensor);
  wire::FinishSizePrefixedMessageBuffer(fbb, b.Finish());
  auto out = std::make_shared<const OutBuffer>(
      fbb.Release(), std::vector<OutBuffer::Splice>{},
      std::vector<std::shared_ptr<const void>>{});
  Frame frame = Receive(out);
  ASSERT_EQ(frame.message()->body_type(), wire::Body::DefineTensor);
  Status s = frame.Verify();
  EXPECT_EQ(s.code(), Code::kBadFrame);
  EXPECT_EQ(s.message(), "message has no body");
}

TEST(Frame, PooledBuilderFrameRoundTrips) {
  // Large enough that both the builder and the received frame are pooled.
  const std::string name(BufferPool::kMinPooledBytes + 1000, 'n');
  OutFrame out;
  {
    flatbuffers::FlatBufferBuilder fbb = MakeBuilder(name.size() + 256);
    auto hello = wire::CreateHello(fbb, kProtocolVersion, wire::Role::Observer,
                                   -1, 0, -1, 0, 0, fbb.CreateString(name));
    out = FinishFrame(fbb, hello);
  }  // The frame outlives its builder.
  EXPECT_EQ(ReadLe32(out->data()), out->size() - kFrameHeaderBytes);
  for (int i = 0; i < 3; ++i) {  // Reuses recycled buffers.
    Frame frame = Receive(out);
    Status s = frame.Verify();
    ASSERT_TRUE(s.ok()) << s.ToString();
    const wire::Hello* hello = frame.message()->body_as_Hello();
    ASSERT_NE(hello, nullptr);
    EXPECT_EQ(hello->role(), wire::Role::Observer);
    EXPECT_EQ(hello->client_name()->str(), name);
  }
}

// A pooled buffer goes back to the pool when it goes, and the next of
// its size class is that same memory (no fresh pages); a small one is
// plain heap memory, still writable to its end.
TEST(BufferPool, PooledFloatsGoBackToThePoolAndServeTheNextOfTheirClass) {
  BufferPool& pool = BufferPool::Default();
  const size_t n = BufferPool::kMinPooledBytes;  // 4x the smallest class
  const float* first = nullptr;
  const size_t idle_before = pool.idle_bytes();
  {
    PooledFloats values(n);
    ASSERT_EQ(values.size(), n);
    ASSERT_EQ(values.span().size(), n);
    for (size_t i = 0; i < n; ++i) values.data()[i] = 0.25f * i;
    EXPECT_EQ(values.span()[n - 1], 0.25f * (n - 1));
    first = values.data();
  }
  EXPECT_GE(pool.idle_bytes(), idle_before + n * sizeof(float));
  PooledFloats again(n - 100);  // the same class
  EXPECT_EQ(again.data(), first);
  PooledFloats moved = std::move(again);
  EXPECT_EQ(moved.data(), first);
  EXPECT_EQ(moved.size(), n - 100);
  PooledFloats small(3);
  for (size_t i = 0; i < 3; ++i) small.data()[i] = 1.0f;
  EXPECT_EQ(small.span()[2], 1.0f);
  EXPECT_EQ(PooledFloats().size(), 0u);
}

TEST(Frame, SplicedPayloadSendsSameBytesAsCopied) {
  std::vector<float> a(1000), b(70000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * i;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -1.0f * i;
  auto build = [&](bool splice) {
    auto fbb = MakeBuilder(512);  // small: forces the builder to grow
    FrameSplicer splicer(fbb);
    std::vector<flatbuffers::Offset<wire::Block>> blocks;
    for (auto* v : {&a, &b}) {
      auto values = splice ? splicer.AddFloats(*v) : fbb.CreateVector(*v);
      blocks.push_back(wire::CreateBlock(fbb, blocks.size(), values));
    }
    auto offset = fbb.CreateVector(blocks);
    wire::PushBuilder pb(fbb);
    pb.add_request_id(9);
    pb.add_blocks(offset);
    return splice ? splicer.Finish(pb.Finish()) : FinishFrame(fbb, pb.Finish());
  };
  OutFrame spliced = build(true);
  OutFrame copied = build(false);
  EXPECT_EQ(spliced->splices().size(), 2u);
  EXPECT_TRUE(copied->splices().empty());
  EXPECT_EQ(spliced->Flatten(), copied->Flatten());
}

TEST(Frame, EmptyFrameFailsVerification) {
  Frame empty;
  EXPECT_EQ(empty.body_size(), 0u);
  EXPECT_EQ(empty.Verify().code(), Code::kBadFrame);
}

TEST(Frame, MovedFrameKeepsBytes) {
  Frame source = Receive(MakeHello(5, "w"));
  Frame moved = std::move(source);
  ASSERT_TRUE(moved.Verify().ok());
  EXPECT_EQ(moved.message()->body_as_Hello()->rank(), 5);
}

TEST(Frame, ErrorFrameRoundTrip) {
  OutFrame out =
      MakeErrorFrame(42, Status(Code::kNotFound, "no tensor named 'w1'"));
  Frame frame = Receive(out);
  Status verified = frame.Verify();
  ASSERT_TRUE(verified.ok()) << verified.ToString();
  ASSERT_EQ(frame.message()->body_type(), wire::Body::Error);
  const wire::Error* error = frame.message()->body_as_Error();
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(error->request_id(), 42u);
  EXPECT_EQ(error->code(), wire::ErrorCode::UnknownTensor);

  Status s = StatusFromError(*error, "shard 1 (10.0.0.2:7000)");
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.message(), "shard 1 (10.0.0.2:7000): no tensor named 'w1'");
}

TEST(Frame, ErrorFramePreservesLongMessage) {
  const std::string text(10000, 'x');
  Frame frame = Receive(MakeErrorFrame(0, Status(Code::kInternal, text)));
  ASSERT_TRUE(frame.Verify().ok());
  const wire::Error* error = frame.message()->body_as_Error();
  EXPECT_EQ(error->request_id(), 0u);
  Status s = StatusFromError(*error, "peer");
  EXPECT_EQ(s.code(), Code::kInternal);
  EXPECT_EQ(s.message(), "peer: " + text);
}

TEST(Frame, ErrorWithNoneCodeBecomesInternal) {
  Frame frame = Receive(MakeErrorFrame(7, Status::Ok()));
  ASSERT_TRUE(frame.Verify().ok());
  const wire::Error* error = frame.message()->body_as_Error();
  EXPECT_EQ(error->code(), wire::ErrorCode::None);
  Status s = StatusFromError(*error, "peer");
  EXPECT_FALSE(s.ok()) << "an Error message is never OK";
  EXPECT_EQ(s.code(), Code::kInternal);
}

TEST(Frame, ErrorWithoutMessageSaysSo) {
  flatbuffers::FlatBufferBuilder fbb;
  auto error = wire::CreateError(fbb, 9, wire::ErrorCode::StalePush);
  Frame frame = Receive(FinishFrame(fbb, error));
  ASSERT_TRUE(frame.Verify().ok());
  Status s = StatusFromError(*frame.message()->body_as_Error(), "worker 3");
  EXPECT_EQ(s.code(), Code::kStalePush);
  EXPECT_EQ(s.message(), "worker 3: no message");
}

TEST(WireCode, MappedCodesRoundTrip) {
  for (Code code :
       {Code::kOk, Code::kBadFrame, Code::kFrameTooLarge,
        Code::kVersionMismatch, Code::kProtocol, Code::kInvalidArgument,
        Code::kNotFound, Code::kShapeMismatch, Code::kStalePush,
        Code::kUnavailable, Code::kInternal, Code::kTimeout, Code::kIoError,
        Code::kCorruption}) {
    EXPECT_EQ(FromWireCode(ToWireCode(code)), code) << CodeName(code);
  }
}

TEST(WireCode, SpecificWireCodes) {
  EXPECT_EQ(ToWireCode(Code::kOk), wire::ErrorCode::None);
  EXPECT_EQ(ToWireCode(Code::kBadFrame), wire::ErrorCode::BadFrame);
  EXPECT_EQ(ToWireCode(Code::kFrameTooLarge), wire::ErrorCode::FrameTooLarge);
  EXPECT_EQ(ToWireCode(Code::kInvalidArgument), wire::ErrorCode::BadRequest);
  EXPECT_EQ(ToWireCode(Code::kNotFound), wire::ErrorCode::UnknownTensor);
  EXPECT_EQ(ToWireCode(Code::kStalePush), wire::ErrorCode::StalePush);
  EXPECT_EQ(ToWireCode(Code::kUnavailable), wire::ErrorCode::Unavailable);
}

TEST(WireCode, EveryCodeHasItsOwnWireCode) {
  EXPECT_EQ(ToWireCode(Code::kProtocol), wire::ErrorCode::Protocol);
  EXPECT_EQ(ToWireCode(Code::kTimeout), wire::ErrorCode::Timeout);
  EXPECT_EQ(ToWireCode(Code::kIoError), wire::ErrorCode::IoError);
  EXPECT_EQ(ToWireCode(Code::kInternal), wire::ErrorCode::Internal);
  EXPECT_EQ(ToWireCode(Code::kCorruption), wire::ErrorCode::Corruption);
  EXPECT_STREQ(CodeName(Code::kCorruption), "corruption");
}

TEST(WireCode, AuthFailedRoundTrips) {
  EXPECT_EQ(FromWireCode(wire::ErrorCode::AuthFailed), Code::kAuthFailed);
  EXPECT_EQ(ToWireCode(Code::kAuthFailed), wire::ErrorCode::AuthFailed);
  EXPECT_EQ(FromWireCode(wire::ErrorCode::HelloRequired), Code::kProtocol);
}

TEST(WireCode, UnknownWireCodeIsInternal) {
  EXPECT_EQ(FromWireCode(static_cast<wire::ErrorCode>(999)), Code::kInternal);
}

}  // namespace
}  // namespace tether
