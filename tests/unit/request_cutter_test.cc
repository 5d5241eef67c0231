// The client's request cutting on its own: which blocks and rows go to
// which shard in which frame, and how replies are put back, without a
// network.
#include "worker/request_cutter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "schema/bf16.h"
#include "schema/frame.h"

namespace tether::client_internal {
namespace {

// Blocks and rows round-robin by index or key, for predictable parts.
Slicer RoundRobin() {
  Slicer s;
  s.dense = [](uint32_t, uint32_t block, int n) {
    return static_cast<int>(block % n);
  };
  s.sparse = [](uint32_t, uint64_t key, int n) {
    return static_cast<int>(key % n);
  };
  return s;
}

Slicer Outside() {
  Slicer s;
  s.dense = [](uint32_t, uint32_t, int n) { return n; };
  s.sparse = [](uint32_t, uint64_t, int) { return -1; };
  return s;
}

// A frame as a connection would receive it (splices included).
Frame Receive(const OutFrame& out) {
  std::vector<uint8_t> bytes = out->Flatten();
  const uint32_t body_size =
      static_cast<uint32_t>(bytes.size() - kFrameHeaderBytes);
  Frame frame(body_size);
  std::memcpy(frame.body(), bytes.data() + kFrameHeaderBytes, body_size);
  return frame;
}

// A PullReply holding `blocks` (index, values).
std::vector<uint8_t> BlocksReply(
    const std::vector<std::pair<uint32_t, std::vector<float>>>& blocks) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::Block>> offsets;
  for (const auto& [index, values] : blocks) {
    offsets.push_back(wire::CreateBlock(fbb, index, fbb.CreateVector(values)));
  }
  fbb.Finish(wire::CreatePullReply(fbb, 1, fbb.CreateVector(offsets)));
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

std::vector<uint8_t> RowsReply(const std::vector<float>& rows) {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(wire::CreatePullReply(fbb, 1, 0, fbb.CreateVector(rows)));
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

const wire::PullReply& AsReply(const std::vector<uint8_t>& bytes) {
  return *flatbuffers::GetRoot<wire::PullReply>(bytes.data());
}

TEST(RequestCutter, BlocksGoToTheSlicersShardsInOrder) {
  // 10 floats in blocks of 4: blocks 0, 1, 2 (the last of 2 floats).
  auto parts = CutBlocks(RoundRobin(), 7, 10, 4, 2, 1 << 20);
  ASSERT_TRUE(parts.ok()) << parts.status().message();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].shard, 0);
  EXPECT_EQ((*parts)[0].blocks, (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ((*parts)[1].shard, 1);
  EXPECT_EQ((*parts)[1].blocks, (std::vector<uint32_t>{1}));
}

TEST(RequestCutter, ShardsWithoutBlocksGetNoPart) {
  auto parts = CutBlocks(RoundRobin(), 0, 4, 4, 3, 1 << 20);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 1u);
  EXPECT_EQ((*parts)[0].shard, 0);
}

TEST(RequestCutter, FramesHoldAtMostChunkBytesOfBlocks) {
  // Blocks of 256 floats (1 KiB), 2 KiB a frame: 5 blocks as 2 + 2 + 1.
  auto parts = CutBlocks(RoundRobin(), 0, 5 * 256, 256, 1, 2048);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ((*parts)[0].blocks, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ((*parts)[1].blocks, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ((*parts)[2].blocks, (std::vector<uint32_t>{4}));
}

TEST(RequestCutter, ABlockLargerThanAChunkStillGoesAlone) {
  auto parts = CutBlocks(RoundRobin(), 0, 3 * 1024, 1024, 1, 1024);
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(parts->size(), 3u);
}

TEST(RequestCutter, ASlicerOutsideTheShardsIsInvalidArgument) {
  auto blocks = CutBlocks(Outside(), 0, 8, 4, 2, 1 << 20);
  ASSERT_FALSE(blocks.ok());
  EXPECT_EQ(blocks.status().code(), Code::kInvalidArgument);
  EXPECT_NE(blocks.status().message().find("outside 0..1"), std::string::npos)
      << blocks.status().message();
  const uint64_t keys[] = {5};
  auto rows = CutKeys(Outside(), 0, keys, 4, 2, 1 << 20);
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), Code::kInvalidArgument);
  EXPECT_NE(rows.status().message().find("key 5 on shard -1"),
            std::string::npos)
      << rows.status().message();
}

TEST(RequestCutter, KeysKeepTheirPositionsRepeatsIncluded) {
  const uint64_t keys[] = {4, 3, 4, 6, 1};
  auto parts = CutKeys(RoundRobin(), 0, keys, 8, 2, 1 << 20);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].shard, 0);
  EXPECT_EQ((*parts)[0].keys, (std::vector<uint64_t>{4, 4, 6}));
  EXPECT_EQ((*parts)[0].positions, (std::vector<size_t>{0, 2, 3}));
  EXPECT_EQ((*parts)[1].shard, 1);
  EXPECT_EQ((*parts)[1].keys, (std::vector<uint64_t>{3, 1}));
  EXPECT_EQ((*parts)[1].positions, (std::vector<size_t>{1, 4}));
}

TEST(RequestCutter, RowFramesHoldAtMostChunkBytesOfRows) {
  // Rows of 254 floats + an 8-byte key: 1 KiB each, 2 a frame.
  std::vector<uint64_t> keys(5);
  std::iota(keys.begin(), keys.end(), 0);
  auto parts = CutKeys(RoundRobin(), 0, keys, 254, 1, 2048);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ((*parts)[2].positions, (std::vector<size_t>{4}));
}

TEST(RequestCutter, PushFrameCarriesEachBlocksSliceOfTheGradient) {
  std::vector<float> grad(10);
  std::iota(grad.begin(), grad.end(), 0.0f);
  OutFrame out = PushBlocksFrame(9, 7, 3, PushKind::kGradient, {0, 2}, 4, grad);
  Frame frame = Receive(out);
  const wire::Push* push = frame.message()->body_as_Push();
  ASSERT_NE(push, nullptr);
  EXPECT_EQ(push->request_id(), 9u);
  EXPECT_EQ(push->tensor(), 7u);
  EXPECT_EQ(push->read_clock(), 3);
  ASSERT_EQ(push->blocks()->size(), 2u);
  const wire::Block* last = push->blocks()->Get(1);
  EXPECT_EQ(last->index(), 2u);
  EXPECT_EQ(std::vector<float>(last->values()->begin(), last->values()->end()),
            (std::vector<float>{8, 9}));
}

TEST(RequestCutter, RowPushFrameGathersRowsFromTheirPositions) {
  const std::vector<float> values = {0, 1, 10, 11, 20, 21};  // 3 rows of 2
  KeyPart part{0, {7, 9}, {2, 0}};
  Frame frame = Receive(PushRowsFrame(1, 0, -1, true, part, 2, values));
  const wire::Push* push = frame.message()->body_as_Push();
  ASSERT_NE(push, nullptr);
  EXPECT_TRUE(push->provide());
  EXPECT_EQ(std::vector<float>(push->rows()->begin(), push->rows()->end()),
            (std::vector<float>{20, 21, 0, 1}));
}

TEST(RequestCutter, PulledBlocksLandAtTheirOffsets) {
  auto bytes = BlocksReply({{2, {8, 9}}, {0, {0, 1, 2, 3}}});
  std::vector<float> out(10, -1);
  Status s = CopyPulledBlocks(AsReply(bytes), 4, out);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(out, (std::vector<float>{0, 1, 2, 3, -1, -1, -1, -1, 8, 9}));
}

TEST(RequestCutter, APulledBlockThatDoesNotFitIsAProtocolError) {
  std::vector<float> out(10);
  // The last block is 2 floats long, not 4.
  Status s =
      CopyPulledBlocks(AsReply(BlocksReply({{2, {1, 2, 3, 4}}})), 4, out);
  EXPECT_EQ(s.code(), Code::kProtocol);
  EXPECT_EQ(s.message(), "pull reply block 2 does not fit the tensor");
  s = CopyPulledBlocks(AsReply(BlocksReply({{3, {1, 2}}})), 4, out);
  EXPECT_EQ(s.code(), Code::kProtocol);
  s = CopyPulledBlocks(AsReply(RowsReply({1})), 4, out);
  EXPECT_EQ(s.code(), Code::kProtocol);
  EXPECT_EQ(s.message(), "pull answered without blocks");
}

TEST(RequestCutter, PulledRowsGoBackToTheirPositions) {
  std::vector<float> out(6, -1);
  const size_t positions[] = {2, 0};
  Status s =
      CopyPulledRows(AsReply(RowsReply({20, 21, 0, 1})), positions, 2, out);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(out, (std::vector<float>{0, 1, -1, -1, 20, 21}));
  s = CopyPulledRows(AsReply(RowsReply({1, 2, 3})), positions, 2, out);
  EXPECT_EQ(s.code(), Code::kProtocol);
  EXPECT_EQ(s.message(), "row pull answered with the wrong rows");
}

}  // namespace
}  // namespace tether::client_internal

// --- bfloat16 on the wire ----------------------------------------------------

namespace tether::client_internal {
namespace {

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

float FromBits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

TEST(Bf16, RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FromBf16(0x3f80), 1.0f);
  EXPECT_EQ(ToBf16(-2.5f), 0xc020);
  // Below half an ulp rounds down, above it up, a tie to the even one.
  EXPECT_EQ(ToBf16(FromBits(0x3f807fff)), 0x3f80);
  EXPECT_EQ(ToBf16(FromBits(0x3f808001)), 0x3f81);
  EXPECT_EQ(ToBf16(FromBits(0x3f808000)), 0x3f80);  // tie, 0x3f80 even
  EXPECT_EQ(ToBf16(FromBits(0x3f818000)), 0x3f82);  // tie, up to even
  EXPECT_EQ(ToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(ToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  // A NaN whose payload is all in the low half stays a NaN.
  EXPECT_TRUE(std::isnan(FromBf16(ToBf16(FromBits(0x7f800001)))));
  EXPECT_TRUE(std::isnan(FromBf16(ToBf16(std::nanf("")))));
  // The largest floats round past bf16's largest to infinity.
  EXPECT_EQ(ToBf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(ToBf16(0.0f), 0);
  EXPECT_EQ(ToBf16(-0.0f), 0x8000);
  // The span forms agree with the scalar ones, and a round trip moves a
  // value by at most half an ulp of bf16 (8 significant bits: 2^-8
  // relative).
  std::vector<float> in(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = std::sin(i * 0.37f) * 1e3f;
  std::vector<uint16_t> half(in.size());
  std::vector<float> back(in.size());
  ToBf16(in, half.data());
  FromBf16(half, back.data());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(half[i], ToBf16(in[i])) << i;
    EXPECT_LE(std::fabs(back[i] - in[i]), std::fabs(in[i]) / 256) << i;
    EXPECT_EQ(Bits(back[i]) & 0xffff, 0u) << i;
  }
}

// The span forms run the CPU's widest clone (AVX-512 or AVX2 where there
// is one), the scalar forms this file's baseline code: the same bits for
// every exponent and sign, the rounding cases of the low half (ties,
// NaN payloads, carries into the exponent), every length's tail and an
// unaligned start.
TEST(Bf16, SpanFormsGiveTheScalarBitsForEveryValue) {
  std::vector<uint16_t> all(65536);
  std::iota(all.begin(), all.end(), uint16_t{0});
  std::vector<float> wide(all.size() + 1);
  FromBf16(all, wide.data() + 1);
  for (uint32_t h = 0; h < all.size(); ++h) {
    ASSERT_EQ(Bits(wide[h + 1]), Bits(FromBf16(static_cast<uint16_t>(h)))) << h;
  }
  std::vector<float> in;
  in.reserve(7 * 65536);
  for (uint32_t low :
       {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xc000u, 0xffffu}) {
    for (uint32_t high = 0; high < 65536; ++high) {
      in.push_back(FromBits(high << 16 | low));
    }
  }
  std::vector<uint16_t> half(in.size());
  ToBf16(std::span<const float>(in).subspan(1), half.data() + 1);
  for (size_t i = 1; i < in.size(); ++i) {
    ASSERT_EQ(half[i], ToBf16(in[i])) << std::hex << Bits(in[i]);
  }
  for (size_t n = 0; n <= 70; ++n) {
    std::vector<uint16_t> out(n + 1, 0x1234);
    ToBf16(std::span<const float>(in).subspan(3 * 65536 + 12345, n),
           out.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], ToBf16(in[3 * 65536 + 12345 + i])) << n << " " << i;
    }
    EXPECT_EQ(out[n], 0x1234) << "wrote past " << n;
    std::vector<float> back(n + 1, 7.0f);
    FromBf16(std::span<const uint16_t>(out).first(n), back.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bits(back[i]), Bits(FromBf16(out[i]))) << n << " " << i;
    }
    EXPECT_EQ(back[n], 7.0f) << "wrote past " << n;
  }
}

// A push of `grad` (4 blocks of 1024) as `dtype`, as received, and its size
// as a fraction of the same push in f32.
std::pair<Frame, double> FourBlockPush(const std::vector<float>& grad,
                                       WireDtype dtype) {
  const std::vector<uint32_t> blocks = {0, 1, 2, 3};
  const size_t f32 =
      PushBlocksFrame(1, 7, 3, PushKind::kGradient, blocks, 1024, grad)->size();
  OutFrame out =
      PushBlocksFrame(1, 7, 3, PushKind::kGradient, blocks, 1024, grad, dtype);
  const double fraction = static_cast<double>(out->size()) / f32;
  return {Receive(out), fraction};
}

// Two rows of 2 (keys 7 and 9, from positions 1 and 0 of kTwoRows), pushed
// as `dtype`, as received: the frame holds them in request order.
const std::vector<float> kTwoRows = {0.1f, 0.2f, 1.1f, 1.2f};
const KeyPart kTwoRowsPart{0, {7, 9}, {1, 0}};

Frame TwoRowPush(WireDtype dtype, bool provide = false) {
  return Receive(
      PushRowsFrame(1, 0, -1, provide, kTwoRowsPart, 2, kTwoRows, dtype));
}

TEST(RequestCutter, Bf16PushFrameCarriesHalfTheBytes) {
  std::vector<float> grad(4096);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 1.0f + i * 1e-4f;
  const auto [frame, fraction] = FourBlockPush(grad, WireDtype::kBf16);
  EXPECT_LT(fraction, 0.55);
  const wire::Block* b2 = frame.message()->body_as_Push()->blocks()->Get(2);
  EXPECT_EQ(b2->values(), nullptr);
  ASSERT_NE(b2->bf16(), nullptr);
  ASSERT_EQ(b2->bf16()->size(), 1024u);
  for (int i = 0; i < 1024; ++i) {
    ASSERT_EQ(b2->bf16()->Get(i), ToBf16(grad[2048 + i])) << i;
  }
  // Rows too.
  Frame rows = TwoRowPush(WireDtype::kBf16);
  const wire::Push* row_push = rows.message()->body_as_Push();
  EXPECT_EQ(row_push->rows(), nullptr);
  ASSERT_NE(row_push->rows_bf16(), nullptr);
  EXPECT_EQ(std::vector<uint16_t>(row_push->rows_bf16()->begin(),
                                  row_push->rows_bf16()->end()),
            (std::vector<uint16_t>{ToBf16(1.1f), ToBf16(1.2f), ToBf16(0.1f),
                                   ToBf16(0.2f)}));
  Frame pull = Receive(PullRowsFrame(2, 0, kTwoRowsPart, WireDtype::kBf16));
  EXPECT_EQ(pull.message()->body_as_Pull()->dtype(), wire::Dtype::Bf16);
  const std::vector<uint32_t> blocks = {0, 1, 2, 3};
  Frame dense_pull = Receive(PullBlocksFrame(2, 7, blocks, WireDtype::kBf16));
  EXPECT_EQ(dense_pull.message()->body_as_Pull()->dtype(), wire::Dtype::Bf16);
  EXPECT_EQ(
      Receive(PullBlocksFrame(2, 7, blocks)).message()->body_as_Pull()->dtype(),
      wire::Dtype::F32);
}

// int8: a byte a value and a scale per 256, rounded stochastically
// (within one step of the gradient).
TEST(RequestCutter, Int8PushFrameCarriesAboutAQuarterOfTheBytes) {
  std::vector<float> grad(4096);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = std::sin(i * 0.01f);
  const auto [frame, fraction] = FourBlockPush(grad, WireDtype::kInt8);
  EXPECT_LT(fraction, 0.27);
  const wire::Block* b2 = frame.message()->body_as_Push()->blocks()->Get(2);
  EXPECT_EQ(b2->values(), nullptr);
  EXPECT_EQ(b2->bf16(), nullptr);
  ASSERT_NE(b2->q8(), nullptr);
  ASSERT_EQ(b2->q8()->size(), 1024u);
  ASSERT_NE(b2->q8_scale(), nullptr);
  ASSERT_EQ(b2->q8_scale()->size(), 4u);
  for (int i = 0; i < 1024; ++i) {
    const float step = b2->q8_scale()->Get(i / 256);
    ASSERT_NEAR(b2->q8()->Get(i) * step, grad[2048 + i], step) << i;
  }
  // Rows: gathered in request order, then one set of groups.
  Frame rows = TwoRowPush(WireDtype::kInt8);
  const wire::Push* row_push = rows.message()->body_as_Push();
  EXPECT_EQ(row_push->rows(), nullptr);
  ASSERT_NE(row_push->rows_q8(), nullptr);
  ASSERT_EQ(row_push->rows_q8_scale()->size(), 1u);
  const float step = row_push->rows_q8_scale()->Get(0);
  EXPECT_FLOAT_EQ(step, 1.2f / 127);
  const float want[] = {1.1f, 1.2f, 0.1f, 0.2f};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(row_push->rows_q8()->Get(i) * step, want[i], step) << i;
  }
  EXPECT_EQ(Receive(PullRowsFrame(2, 0, kTwoRowsPart, WireDtype::kInt8))
                .message()
                ->body_as_Pull()
                ->dtype(),
            wire::Dtype::Int8);
  const std::vector<uint32_t> blocks = {0, 1, 2, 3};
  Frame dense_pull = Receive(PullBlocksFrame(2, 7, blocks, WireDtype::kInt8));
  EXPECT_EQ(dense_pull.message()->body_as_Pull()->dtype(), wire::Dtype::Int8);
}

// Values (initial ones, a provide, or assigned ones) travel exact whatever
// the client's wire dtype, dense and sparse, flagged as what they are.
TEST(RequestCutter, ValuesTravelExactWhateverTheWireDtype) {
  std::vector<float> grad(2048);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 1.0f + i * 1e-4f;
  for (WireDtype dtype : {WireDtype::kBf16, WireDtype::kInt8}) {
    for (PushKind kind : {PushKind::kProvide, PushKind::kAssign}) {
      Frame dense =
          Receive(PushBlocksFrame(1, 7, -1, kind, {0, 1}, 1024, grad, dtype));
      const wire::Push* push = dense.message()->body_as_Push();
      EXPECT_EQ(push->provide(), kind == PushKind::kProvide);
      EXPECT_EQ(push->assign(), kind == PushKind::kAssign);
      const wire::Block* b1 = push->blocks()->Get(1);
      EXPECT_EQ(b1->bf16(), nullptr);
      EXPECT_EQ(b1->q8(), nullptr);
      ASSERT_NE(b1->values(), nullptr);
      EXPECT_EQ(std::vector<float>(b1->values()->begin(), b1->values()->end()),
                std::vector<float>(grad.begin() + 1024, grad.end()));
    }
    Frame rows = TwoRowPush(dtype, /*provide=*/true);
    const wire::Push* row_push = rows.message()->body_as_Push();
    EXPECT_EQ(row_push->rows_bf16(), nullptr);
    EXPECT_EQ(row_push->rows_q8(), nullptr);
    ASSERT_NE(row_push->rows(), nullptr);
    EXPECT_EQ(
        std::vector<float>(row_push->rows()->begin(), row_push->rows()->end()),
        (std::vector<float>{1.1f, 1.2f, 0.1f, 0.2f}));
  }
}

// An int8 reply widens into place; one whose scales are missing is a
// protocol error naming the block or the rows.
TEST(RequestCutter, Int8RepliesAreWidenedIntoPlaceAndNeedTheirScales) {
  const std::vector<int8_t> q = {127, -64, 0, 1};
  const std::vector<float> scale = {0.5f};
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::Block>> offsets = {wire::CreateBlock(
      fbb, 1, 0, 0, 0, 0, false, fbb.CreateVector(q), fbb.CreateVector(scale))};
  fbb.Finish(wire::CreatePullReply(fbb, 1, fbb.CreateVector(offsets)));
  std::vector<uint8_t> bytes(fbb.GetBufferPointer(),
                             fbb.GetBufferPointer() + fbb.GetSize());
  std::vector<float> out(8, -1);
  Status s = CopyPulledBlocks(AsReply(bytes), 4, out);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(out, (std::vector<float>{-1, -1, -1, -1, 63.5f, -32, 0, 0.5f}));

  flatbuffers::FlatBufferBuilder bad;
  offsets = {wire::CreateBlock(bad, 1, 0, 0, 0, 0, false, bad.CreateVector(q))};
  bad.Finish(wire::CreatePullReply(bad, 1, bad.CreateVector(offsets)));
  bytes.assign(bad.GetBufferPointer(), bad.GetBufferPointer() + bad.GetSize());
  s = CopyPulledBlocks(AsReply(bytes), 4, out);
  EXPECT_EQ(s.code(), Code::kProtocol);
  EXPECT_EQ(s.message(),
            "pull reply block 1 carries 4 int8 values with 0 scales, not 1");

  flatbuffers::FlatBufferBuilder rows;
  auto q_offset = rows.CreateVector(q);
  auto scale_offset = rows.CreateVector(scale);
  wire::PullReplyBuilder rb(rows);
  rb.add_request_id(1);
  rb.add_rows_q8(q_offset);
  rb.add_rows_q8_scale(scale_offset);
  rows.Finish(rb.Finish());
  bytes.assign(rows.GetBufferPointer(),
               rows.GetBufferPointer() + rows.GetSize());
  std::vector<float> row_out(6, -1);
  const size_t positions[] = {2, 0};
  s = CopyPulledRows(AsReply(bytes), positions, 2, row_out);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(row_out, (std::vector<float>{0, 0.5f, -1, -1, 63.5f, -32}));
}

TEST(RequestCutter, Bf16RepliesAreWidenedIntoPlace) {
  flatbuffers::FlatBufferBuilder fbb;
  const std::vector<uint16_t> b0 = {ToBf16(1.5f), ToBf16(-2.0f), ToBf16(3.25f),
                                    ToBf16(4.0f)};
  const std::vector<uint16_t> b2 = {ToBf16(8.0f)};  // 1 of 2: does not fit
  std::vector<flatbuffers::Offset<wire::Block>> offsets = {
      wire::CreateBlock(fbb, 0, 0, fbb.CreateVector(b0))};
  fbb.Finish(wire::CreatePullReply(fbb, 1, fbb.CreateVector(offsets)));
  std::vector<uint8_t> bytes(fbb.GetBufferPointer(),
                             fbb.GetBufferPointer() + fbb.GetSize());
  std::vector<float> out(10, -1);
  Status s = CopyPulledBlocks(AsReply(bytes), 4, out);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(out,
            (std::vector<float>{1.5f, -2, 3.25f, 4, -1, -1, -1, -1, -1, -1}));
  flatbuffers::FlatBufferBuilder bad;
  offsets = {wire::CreateBlock(bad, 2, 0, bad.CreateVector(b2))};
  bad.Finish(wire::CreatePullReply(bad, 1, bad.CreateVector(offsets)));
  bytes.assign(bad.GetBufferPointer(), bad.GetBufferPointer() + bad.GetSize());
  s = CopyPulledBlocks(AsReply(bytes), 4, out);
  EXPECT_EQ(s.code(), Code::kProtocol);
  EXPECT_EQ(s.message(), "pull reply block 2 does not fit the tensor");

  flatbuffers::FlatBufferBuilder rows;
  const std::vector<uint16_t> half = {ToBf16(20), ToBf16(21), ToBf16(0),
                                      ToBf16(1)};
  rows.Finish(wire::CreatePullReply(rows, 1, 0, 0, 0, rows.CreateVector(half)));
  bytes.assign(rows.GetBufferPointer(),
               rows.GetBufferPointer() + rows.GetSize());
  std::vector<float> row_out(6, -1);
  const size_t positions[] = {2, 0};
  s = CopyPulledRows(AsReply(bytes), positions, 2, row_out);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(row_out, (std::vector<float>{0, 1, -1, -1, 20, 21}));
}

}  // namespace
}  // namespace tether::client_internal
