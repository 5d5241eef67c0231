// The client's request cutting on its own: which blocks and rows go to
// which shard in which frame, and how replies are put back, without a
// network.
#include "worker/request_cutter.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

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
  OutFrame out = PushBlocksFrame(9, 7, 3, false, {0, 2}, 4, grad);
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
