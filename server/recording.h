// The order of an asynchronous run, recorded and replayed.
//
// With --record every shard writes, to DATA_DIR/record.log, each event that
// changes what its pulls answer, in the order it happened under the shard's
// lock: a worker joining or leaving, a push (its read clock, tensor and a
// digest of its values), a clock, and each pull's answer; shard 0 also its
// coordinator's answers to data requests (which chunk or share a worker
// gets). With --replay the
// shard takes those events in exactly that order again, holding back a
// message that comes early, so that every push meets the same state and
// every pull reads it: workers, deterministic given what they pull, then
// push the same gradients, and the run ends bit-identical.
//
// File: "TETHERREC1" and the shard id (u32, little-endian), then one event
// after another: kind (1 byte), rank (varint), clock + 1 (varint), and for
// pushes and pulls the tensor id (u32), for pushes and data requests the
// digest (u32). A few bytes each. A crash leaves at most a torn last event,
// which reading drops.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "schema/frame.h"
#include "schema/mutex.h"
#include "schema/status.h"

namespace tether {

struct RecordedEvent {
  enum class Kind : uint8_t {
    kJoin = 1,  // `clock`: where the worker joined
    kLeave = 2,
    kPush = 3,     // `clock`: its read clock; `tensor`, `digest`
    kProvide = 4,  // a provided tensor's initial values; `tensor`, `digest`
    kPull = 5,     // answered; `clock`: the worker's clock then; `tensor`
    kClock = 6,    // `clock`: the clock the worker said it finished
    // Shard 0: a data request its coordinator answered, `clock` the
    // worker's; `digest` of what it asked (chunks, or shares).
    kChunk = 7,
    kShare = 8,
  };
  Kind kind = Kind::kJoin;
  int rank = 0;
  int64_t clock = -1;
  uint32_t tensor = 0;
  uint32_t digest = 0;

  // Whether a worker's message carries it (not a join or leave).
  bool FromMessage() const {
    return kind != Kind::kJoin && kind != Kind::kLeave;
  }
  bool operator==(const RecordedEvent&) const = default;
};

// "worker 2's push of fc1.weight read at clock 37", naming the tensor with
// `name` (its id when null).
std::string DescribeEvent(
    const RecordedEvent& e,
    const std::function<std::string(uint32_t)>& name = {});

// The event a worker's Push, Pull, Clock, DataRequest or ShareRequest
// message is; nullopt for any other message. A push's digest covers its
// blocks or rows and values, a request's what it asks.
std::optional<RecordedEvent> EventOf(int rank, const wire::Message& message);
RecordedEvent PushEvent(int rank, const wire::Push& push);
RecordedEvent ChunkEvent(int rank, const wire::DataRequest& request);
RecordedEvent ShareEvent(int rank, const wire::ShareRequest& request);

// The recording's file in a shard's data dir.
std::string RecordingPath(const std::string& data_dir);

struct Recording {
  int shard_id = 0;
  std::vector<RecordedEvent> events;
  bool torn_tail = false;  // the file ended inside an event (a crash)
};
// Reads a recording; kNotFound naming the file when there is none,
// kCorruption when it is not one.
Result<Recording> ReadRecording(const std::string& path);

// Appends events to a shard's recording. Add() only copies a few bytes into
// a buffer; a thread of its own writes the buffer out every few ms.
// Thread-safe.
class Recorder {
 public:
  // Opens DATA_DIR/record.log for shard `shard_id` and cuts it to
  // `keep_events` events (those of the round a run resumed from; 0: a new
  // run starts it afresh). kIoError naming the file; kCorruption when it
  // holds fewer events than that.
  static Result<std::unique_ptr<Recorder>> Open(const std::string& data_dir,
                                                int shard_id,
                                                uint64_t keep_events);
  ~Recorder();  // writes out what is left

  void Add(const RecordedEvent& e) TETHER_EXCLUDES(mu_);
  // Events added so far (the position a round stores).
  uint64_t events() const TETHER_EXCLUDES(mu_);
  // Writes out and syncs every event added so far: a round stores its
  // position only once the events before it are on disk.
  Status Sync() TETHER_EXCLUDES(mu_, write_mu_);

  const std::string& path() const { return path_; }

 private:
  Recorder(std::string path, int fd, uint64_t events);
  void Loop() TETHER_EXCLUDES(mu_);
  Status WriteOut(bool sync) TETHER_EXCLUDES(mu_, write_mu_);

  const std::string path_;
  const int fd_;
  mutable Mutex mu_;
  CondVar cv_;
  std::string pending_ TETHER_GUARDED_BY(mu_);
  uint64_t events_ TETHER_GUARDED_BY(mu_) = 0;
  bool stopping_ TETHER_GUARDED_BY(mu_) = false;
  Mutex write_mu_;  // one writer at a time, in order
  Status write_error_ TETHER_GUARDED_BY(write_mu_);
  std::thread thread_;  // last: starts after the members it uses
};

// Replays a recording: decides which held message goes next. Not
// thread-safe: the shard serializes it.
class Replayer {
 public:
  // Replays `events` from index `start`; `name` names a tensor id in
  // what it reports.
  Replayer(std::vector<RecordedEvent> events, size_t start,
           std::function<std::string(uint32_t)> name);

  // A worker's message that arrived: `got` is what it is, `run` handles
  // it, `refuse` answers it with an error instead. Kept until its turn, or
  // (when the recording has no more messages from that worker: one cut
  // short by a crash) until the recording's end. Returns what differs when
  // it is not the event the recording has next for that worker (then
  // nothing is kept).
  Status Arrive(const RecordedEvent& got, std::function<void()> run,
                std::function<void(const Status&)> refuse);
  // False for a data request (kChunk, kShare) when the recording's next
  // message from its worker is not one: a request that changed nothing in
  // the recorded run (an idle worker asking again for a chunk, which got
  // none) or one a resumed worker makes again (its share of the epoch).
  // Such a request is not ordered; true for everything else.
  bool Expects(const RecordedEvent& got) const;

  // The next step when it can be taken now: a join or a leave (run empty;
  // the shard applies it), or a held message whose turn it is. Advances.
  struct Step {
    RecordedEvent event;
    std::function<void()> run;
    std::function<void(const Status&)> refuse;
  };
  std::optional<Step> Next();

  bool done() const { return next_ >= events_.size(); }
  size_t position() const { return next_; }
  size_t size() const { return events_.size(); }
  // The event the replay waits for (not done()).
  const RecordedEvent& waiting_for() const { return events_[next_]; }
  // Messages held now, in the order they came per worker; clears them (the
  // replay ended or stopped).
  std::vector<Step> TakeHeld();

 private:
  const std::vector<RecordedEvent> events_;
  const std::function<std::string(uint32_t)> name_;
  size_t next_ = 0;
  // By rank: the indices of its message events not yet arrived, in order.
  std::map<int, std::deque<size_t>> expected_;
  std::map<int, std::deque<Step>> held_;
  // By rank: messages past its recorded ones, run once the replay is done.
  std::map<int, std::deque<Step>> beyond_;
};

}  // namespace tether
