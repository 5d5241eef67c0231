// A shard's recording (server/recording.h): what it writes reads back, a
// torn tail is dropped, a resumed recording is cut at its round, and the
// replayer lets messages through in the recorded order only.
#include "server/recording.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "tests/support/temp_dir.h"

namespace tether {
namespace {

using testing::TempDir;
using K = RecordedEvent::Kind;

std::vector<RecordedEvent> SomeEvents() {
  return {{K::kJoin, 0, 0},
          {K::kJoin, 1, 0},
          {K::kPull, 1, 0, 77},
          {K::kPush, 1, 0, 77, 0xdeadbeef},
          {K::kClock, 1, 1},
          {K::kPull, 0, 0, 77},
          {K::kProvide, 0, -1, 5, 42},
          {K::kPush, 300, 123456789, 0xffffffff, 1},
          {K::kChunk, 2, 5, 0, 77},
          {K::kShare, 3, 0, 0, 99},
          {K::kLeave, 1, -1}};
}

std::vector<RecordedEvent> Write(const std::string& dir, uint64_t keep,
                                 const std::vector<RecordedEvent>& events) {
  auto recorder = Recorder::Open(dir, 3, keep);
  EXPECT_TRUE(recorder.ok()) << recorder.status().ToString();
  if (!recorder.ok()) return {};
  for (const RecordedEvent& e : events) (*recorder)->Add(e);
  EXPECT_EQ((*recorder)->events(), keep + events.size());
  EXPECT_TRUE((*recorder)->Sync().ok());
  return events;
}

TEST(Recording, WhatIsRecordedReadsBackInOrder) {
  TempDir dir;
  const auto events = Write(dir.path(), 0, SomeEvents());
  auto read = ReadRecording(RecordingPath(dir.path()));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->shard_id, 3);
  EXPECT_FALSE(read->torn_tail);
  EXPECT_EQ(read->events, events);
  // A few bytes per event.
  EXPECT_LT(std::filesystem::file_size(RecordingPath(dir.path())),
            14 + 12 * events.size());
}

TEST(Recording, TornLastEventIsDroppedAndSaid) {
  TempDir dir;
  const auto events = Write(dir.path(), 0, SomeEvents());
  const std::string path = RecordingPath(dir.path());
  // A crash in the middle of the last event's bytes.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1);
  auto read = ReadRecording(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(read->torn_tail);
  ASSERT_EQ(read->events.size(), events.size() - 1);
  EXPECT_EQ(read->events.back(), events[events.size() - 2]);
}

TEST(Recording, ResumedRecordingIsCutAtItsRoundAndGoesOn) {
  TempDir dir;
  const auto first = Write(dir.path(), 0, SomeEvents());
  // Resumed from a round taken after 4 events: the later ones are gone
  // with the crash, and the new ones follow.
  const std::vector<RecordedEvent> more = {{K::kClock, 0, 1},
                                           {K::kPull, 0, 1, 9}};
  Write(dir.path(), 4, more);
  auto read = ReadRecording(RecordingPath(dir.path()));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  std::vector<RecordedEvent> want(first.begin(), first.begin() + 4);
  want.insert(want.end(), more.begin(), more.end());
  EXPECT_EQ(read->events, want);
  // A round past the end of the recording: refused, naming the file.
  auto past = Recorder::Open(dir.path(), 3, 100);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), Code::kCorruption);
  EXPECT_NE(past.status().message().find("record.log"), std::string::npos);
}

TEST(Recording, MissingOrForeignFileIsAClearError) {
  TempDir dir;
  auto none = ReadRecording(RecordingPath(dir.path()));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kNotFound);
  EXPECT_NE(none.status().message().find("--record"), std::string::npos);
  std::ofstream(RecordingPath(dir.path())) << "not a recording at all";
  auto other = ReadRecording(RecordingPath(dir.path()));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), Code::kCorruption);
}

// A push of one block of `values` to tensor 7, read at clock 2.
std::string PushBytes(const std::vector<float>& values) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::Block>> blocks = {
      wire::CreateBlock(fbb, 0, fbb.CreateVector(values))};
  fbb.Finish(wire::CreatePush(fbb, 1, 7, 2, fbb.CreateVector(blocks)));
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()),
                     fbb.GetSize());
}
RecordedEvent PushOf(const std::string& bytes) {
  return PushEvent(1, *flatbuffers::GetRoot<wire::Push>(bytes.data()));
}

TEST(Recording, PushDigestTellsOneChangedValue) {
  std::vector<float> values(1000, 0.25f);
  const RecordedEvent a = PushOf(PushBytes(values));
  EXPECT_EQ(a.kind, K::kPush);
  EXPECT_EQ(a.tensor, 7u);
  EXPECT_EQ(a.clock, 2);
  EXPECT_EQ(PushOf(PushBytes(values)), a);
  values[517] = std::nextafter(values[517], 1.0f);  // one ulp
  EXPECT_NE(PushOf(PushBytes(values)).digest, a.digest);
}

TEST(Replayer, HoldsEarlyMessagesUntilTheirRecordedTurn) {
  // Worker 1 pushed before worker 0 in the recording.
  const std::vector<RecordedEvent> events = {
      {K::kJoin, 0, 0},        {K::kJoin, 1, 0},    {K::kPush, 1, 0, 7, 11},
      {K::kPush, 0, 0, 7, 22}, {K::kPull, 0, 0, 7}, {K::kLeave, 1, -1}};
  Replayer replayer(events, 0, {});
  std::vector<std::string> ran;
  auto run = [&ran](std::string what) {
    return [&ran, what] { ran.push_back(what); };
  };
  auto refuse = [](const Status&) { FAIL() << "nothing is refused here"; };
  // The joins go first, on their own.
  std::vector<K> steps;
  while (auto step = replayer.Next()) {
    EXPECT_FALSE(step->run);
    steps.push_back(step->event.kind);
  }
  EXPECT_EQ(steps, (std::vector<K>{K::kJoin, K::kJoin}));
  // Worker 0 comes first now: held.
  ASSERT_TRUE(
      replayer.Arrive({K::kPush, 0, 0, 7, 22}, run("push 0"), refuse).ok());
  ASSERT_TRUE(
      replayer.Arrive({K::kPull, 0, -1, 7}, run("pull 0"), refuse).ok());
  EXPECT_FALSE(replayer.Next());
  EXPECT_EQ(replayer.waiting_for(), events[2]);
  ASSERT_TRUE(
      replayer.Arrive({K::kPush, 1, 0, 7, 11}, run("push 1"), refuse).ok());
  while (auto step = replayer.Next()) {
    if (step->run) step->run();
  }
  EXPECT_EQ(ran, (std::vector<std::string>{"push 1", "push 0", "pull 0"}));
  EXPECT_TRUE(replayer.done());
}

TEST(Replayer, OtherValuesAreNamedAndMessagesPastTheRecordingWait) {
  const std::vector<RecordedEvent> events = {{K::kPush, 2, 37, 7, 11}};
  Replayer replayer(events, 0, [](uint32_t id) {
    return id == 7 ? std::string("fc1.weight") : "?";
  });
  Status s = replayer.Arrive(
      {K::kPush, 2, 37, 7, 12}, [] {}, [](const Status&) {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("worker 2 sent worker 2's push of fc1.weight "
                             "read at clock 37 with other values"),
            std::string::npos)
      << s.message();
  // A worker past its recorded messages (a recording a crash cut short)
  // waits for the recording's end.
  bool ran = false;
  EXPECT_TRUE(
      replayer
          .Arrive(
              {K::kClock, 5, 1}, [&ran] { ran = true; }, [](const Status&) {})
          .ok());
  EXPECT_FALSE(replayer.Next());
  std::vector<Replayer::Step> held = replayer.TakeHeld();
  ASSERT_EQ(held.size(), 1u);
  held[0].run();
  EXPECT_TRUE(ran);
}

TEST(Replayer, DataRequestsTheRecordingDoesNotHaveAreNotOrdered) {
  // Worker 0 got a chunk, pushed, then (idle, asking again and again) got
  // the run's end; the requests that changed nothing are not recorded.
  const std::vector<RecordedEvent> events = {
      {K::kChunk, 0, 0, 0, 5}, {K::kClock, 0, 1}, {K::kChunk, 0, 1, 0, 5}};
  Replayer replayer(events, 0, {});
  EXPECT_TRUE(replayer.Expects({K::kChunk, 0, 0, 0, 5}));
  ASSERT_TRUE(replayer
                  .Arrive(
                      {K::kChunk, 0, 0, 0, 5}, [] {}, [](const Status&) {})
                  .ok());
  // Next from worker 0 is a clock: a chunk request now is an idle one.
  EXPECT_FALSE(replayer.Expects({K::kChunk, 0, 0, 0, 5}));
  EXPECT_FALSE(replayer.Expects({K::kShare, 0, 0, 0, 5}));
  EXPECT_TRUE(replayer.Expects({K::kClock, 0, 1}));
  ASSERT_TRUE(replayer
                  .Arrive(
                      {K::kClock, 0, 1}, [] {}, [](const Status&) {})
                  .ok());
  EXPECT_TRUE(replayer.Expects({K::kChunk, 0, 1, 0, 5}));
  EXPECT_FALSE(replayer.Expects({K::kChunk, 7, 1, 0, 5}));  // no such worker
}

TEST(Replayer, StartsFromARoundsPosition) {
  const std::vector<RecordedEvent> events = {{K::kPush, 0, 0, 7, 1},
                                             {K::kPush, 0, 1, 7, 2}};
  Replayer replayer(events, 1, {});
  EXPECT_EQ(replayer.position(), 1u);
  // The first push is before the round: the replay expects the second.
  EXPECT_FALSE(replayer
                   .Arrive(
                       {K::kPush, 0, 0, 7, 1}, [] {}, [](const Status&) {})
                   .ok());
}

}  // namespace
}  // namespace tether
