// One shard's data plane: its slice of the parameters, the workers' clocks,
// and the answers to Define, Pull, Push, Clock, Heartbeat and Stats.
//
// Thread-safe: every public method takes the shard's mutex. Replies go out
// through the requesting peer's Connection (thread-safe), possibly later: a
// pull that must wait for the slowest worker is stored with its connection
// and answered when a Clock releases it, holding no thread meanwhile.
// Replies are built under the mutex (a pull sees exactly the updates
// applied before it) and sent after it is released.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "schema/buffer_pool.h"
#include "schema/connection.h"
#include "schema/frame.h"
#include "schema/mutex.h"
#include "schema/stats.h"
#include "schema/wire_dtype.h"
#include "server/apply_pool.h"
#include "server/checkpoint.h"
#include "server/checkpointer.h"
#include "server/clock_table.h"
#include "server/direct_read.h"
#include "server/param_store.h"
#include "server/recording.h"
#include "server/run_settings.h"
#include "server/worker_table.h"

namespace tether {

// Who is on the other end of a connection, as its Hello said.
struct PeerInfo {
  wire::Role role = wire::Role::Observer;
  int rank = -1;       // workers only
  int staleness = -1;  // the bound enforced for this peer; -1 none
  std::string name;    // for logs
  // A worker on this host whose pushes are read from its memory and whose
  // pulls may be written into it (server/direct_read.h): its process id,
  // checked; 0: none. Said in every PushAck.
  int direct_pid = 0;
};

class Shard {
 public:
  // Pushes with staleness >= this land in the last histogram bucket.
  static constexpr int kStalenessBuckets = 17;

  // Pull replies that would exceed `max_frame_bytes` are refused, so a
  // peer cannot make the shard build a frame nobody can receive.
  Shard(int shard_id, RunSettings settings,
        size_t max_frame_bytes = kDefaultMaxFrameBytes);

  // The frame limit the shard was made with.
  size_t max_frame_bytes() const { return max_frame_bytes_; }

  int shard_id() const { return shard_id_; }
  const RunSettings& settings() const { return settings_; }

  // Answers one verified data-plane message from `peer`, arriving on
  // `conn`. Bad requests get an Error frame naming what is wrong; nothing a
  // peer sends can fail the shard.
  void Handle(const PeerInfo& peer, const wire::Message& message,
              const std::shared_ptr<Connection>& conn) TETHER_EXCLUDES(mu_);

  // Records that worker `rank` connected (with its enforced staleness
  // bound) or went away. A worker that is gone no longer holds back the
  // minimum clock, so pulls waiting on it are answered; one that connects
  // again counts again from its last clock.
  // A worker that (re)connects says its own clock (`clock`, -1 unknown);
  // it joins at the latest of that, its clock here and the others'.
  // `conn` identifies the connection: a disconnect from one that has since
  // been replaced (the worker reconnected) changes nothing.
  void SetWorkerConnected(int rank, bool connected, int staleness,
                          int64_t clock = -1, const Connection* conn = nullptr)
      TETHER_EXCLUDES(mu_);
  // After a restart: no worker holds back the others until it reconnects.
  void ForgetWorkers() TETHER_EXCLUDES(mu_);
  // The clock of worker `rank` on this shard.
  int64_t WorkerClock(int rank) TETHER_EXCLUDES(mu_);
  // The clock `rank` takes when it joins now (see ClockTable::JoinClock).
  int64_t JoinClock(int rank) TETHER_EXCLUDES(mu_);
  // Evicts every connected worker not heard from for the run's
  // worker_timeout_ms: it no longer holds back the minimum clock, and the
  // pulls waiting on it are answered. One heard from again rejoins at the
  // others' clock. Returns the ranks evicted now; call periodically.
  std::vector<int> EvictSilent() TETHER_EXCLUDES(mu_);
  // Any frame from worker `rank`: it is alive; an evicted one rejoins.
  void Heard(int rank) TETHER_EXCLUDES(mu_);
  // Requests with more than `max_keys` sparse keys, and pulls beyond
  // `max_waiting` held at once for one connection, are refused (the
  // limits are --max-keys and --max-waiting). Set before serving.
  void SetLimits(uint64_t max_keys, int max_waiting);
  // Threads that apply a push of a large tensor together (--apply-threads;
  // 0: one per core); 1, the default, keeps each push on the thread that
  // took it. Set before serving.
  void SetApplyThreads(int threads) TETHER_EXCLUDES(mu_);
  // Adds figures the shard does not own to Stats() (shard 0: the chunk
  // accounting). Set before serving.
  void SetStatsExtra(std::function<void(ShardStats&)> extra);

  // This shard's figures now.
  ShardStats Stats() TETHER_EXCLUDES(mu_);

  // Has `checkpointer` write a round whenever the minimum clock reaches a
  // multiple of settings().checkpoint_every. Call before serving.
  void EnableCheckpoints(Checkpointer* checkpointer) TETHER_EXCLUDES(mu_);
  // Writes a round now, from the state as it is: round `round`, or (when
  // negative) one named by the current minimum clock. Returns the round;
  // kUnavailable when no checkpoints are set up or a write is in progress.
  Result<int64_t> CheckpointNow(int64_t round) TETHER_EXCLUDES(mu_);
  // Loads a round's slice: parameters, optimizer state, and every worker's
  // clock set to the round's clock (workers continue from there). Before
  // workers join only: it replaces whatever was loaded before.
  Status Restore(const ShardSnapshot& snapshot) TETHER_EXCLUDES(mu_);
  // Every worker's clock and latest reported position, for round records.
  std::vector<WorkerPosition> WorkerPositions() TETHER_EXCLUDES(mu_);

  // Records, into `recorder`, every event that decides what the shard's
  // pulls answer (server/recording.h), those since the shard was made
  // first; null: none until the next call. `recorder` must outlive the
  // shard's use of it.
  void EnableRecording(Recorder* recorder) TETHER_EXCLUDES(mu_);
  // The events recorded before the round the shard restored (0 when none):
  // where a recording goes on, and a replay from that round starts.
  uint64_t RestoredRecordPosition() TETHER_EXCLUDES(mu_);
  // From now on, workers' pushes, pulls and clocks are taken in the order of
  // `events` (from index `start`), joins and leaves too: a message that
  // comes early waits for its turn (InOrder). When a worker sends what the
  // recording does not have next for it, the replay stops: the shard logs
  // the first difference, and answers every held message and every later
  // one with it. Call before serving.
  void StartReplay(std::vector<RecordedEvent> events, size_t start)
      TETHER_EXCLUDES(replay_mu_);
  // Whether a replay is under way: the session hands a worker's pushes,
  // pulls and clocks to InOrder instead of Handle.
  bool replaying() const { return replaying_.load(std::memory_order_acquire); }
  // Takes a worker's message `got` (request `request_id`, from `conn`) in
  // its recorded turn: `run` (which calls Handle) runs then, on whichever
  // thread reaches it. After a divergence it is answered with the error.
  // A data request the recording does not have next for that worker
  // (Replayer::Expects) is not ordered: `unordered` answers it as the
  // recorded run did.
  void InOrder(const RecordedEvent& got, uint64_t request_id,
               const std::shared_ptr<Connection>& conn,
               std::function<void()> run, std::function<void()> unordered)
      TETHER_EXCLUDES(replay_mu_, mu_);
  // A replay will start (StartReplay): until then, what InOrder is given
  // waits for it. Call when the shard is made, before it serves anyone.
  void ExpectReplay() TETHER_EXCLUDES(replay_mu_);
  // Records `e` when the run records (shard 0's data requests, which its
  // coordinator answers); in the order of the calls.
  void Record(const RecordedEvent& e) TETHER_EXCLUDES(mu_);
  // A replay that has waited `stall_ms` for the same event stops, saying
  // what it waits for. Call periodically.
  void CheckReplay(int stall_ms) TETHER_EXCLUDES(replay_mu_, mu_);

  // Adds to the traffic counters shown in Stats.
  void CountTraffic(uint64_t bytes_in, uint64_t bytes_out) TETHER_EXCLUDES(mu_);

 private:
  // A reply and the connection it goes to.
  struct Reply {
    std::shared_ptr<Connection> conn;
    OutFrame frame;
    // A pull's values to write into its worker first (Pull.landing).
    std::shared_ptr<const Landing> landing;
  };
  // Replies built under mu_, sent when the Outbox is destroyed. Declared
  // before the MutexLock of the same scope, it outlives the lock: nothing is
  // written to a socket with mu_ held.
  class Outbox {
   public:
    Outbox() = default;
    Outbox(const Outbox&) = delete;
    Outbox& operator=(const Outbox&) = delete;
    ~Outbox();
    void Add(std::shared_ptr<Connection> conn, OutFrame frame,
             std::shared_ptr<const Landing> landing = nullptr) {
      replies_.push_back(
          {std::move(conn), std::move(frame), std::move(landing)});
    }
    void Add(std::vector<Reply> replies);

   private:
    std::vector<Reply> replies_;
  };

  void OnDefineTensor(const PeerInfo& peer, const wire::DefineTensor& m,
                      Connection& conn) TETHER_EXCLUDES(mu_);
  void OnDefineTable(const PeerInfo& peer, const wire::DefineTable& m,
                     Connection& conn) TETHER_EXCLUDES(mu_);
  void OnPull(const PeerInfo& peer, const wire::Pull& m,
              const std::shared_ptr<Connection>& conn) TETHER_EXCLUDES(mu_);
  void OnPush(const PeerInfo& peer, const wire::Push& m, Connection& conn)
      TETHER_EXCLUDES(mu_);
  // Writes a provided tensor's initial values (m.provide(), already
  // checked) where there are none yet.
  Status ProvideLocked(const wire::Push& m) TETHER_REQUIRES(mu_);
  // Replaces the blocks' values with m's (m.assign(), already checked into
  // block_grads_): no optimizer, no staleness.
  Status AssignLocked(const wire::Push& m) TETHER_REQUIRES(mu_);
  void OnClock(const PeerInfo& peer, const wire::Clock& m, Connection& conn)
      TETHER_EXCLUDES(mu_);
  void OnReport(const PeerInfo& peer, const wire::WorkerReport& m,
                Connection& conn) TETHER_EXCLUDES(mu_);

  // Builds the reply to a pull (values as `dtype` says); an Error
  // frame when it cannot be answered. A dense f32 pull with a `landing` in
  // the memory of worker process `pid` (PeerInfo::direct_pid) gets a reply
  // of landed blocks, and *landed says what to write there before it is
  // sent (WriteLanding, with no lock held).
  OutFrame BuildPullReplyLocked(
      uint64_t request_id, uint32_t tensor, bool sparse, WireDtype dtype,
      const std::vector<uint32_t>& blocks, const std::vector<uint64_t>& keys,
      int pid = 0, uint64_t landing = 0,
      std::shared_ptr<const Landing>* landed = nullptr) TETHER_REQUIRES(mu_);
  Status CheckReplySizeLocked(bool sparse, uint32_t tensor,
                              const std::vector<uint32_t>& blocks, size_t keys)
      TETHER_REQUIRES(mu_);
  // Checks a dense push; when OK, `grads` lists its blocks with their
  // gradients' bounds (views into `m`).
  Status CheckDensePush(const wire::Push& m,
                        std::vector<ParamStore::BlockGrad>* grads)
      TETHER_REQUIRES(mu_);
  Status CheckSparsePush(const wire::Push& m) TETHER_REQUIRES(mu_);
  // The largest magnitude in `values`; kNonFinite naming the tensor,
  // `part`, the element (`first_index` plus its place in `values`) and the
  // push's clock, when a value is NaN/Inf.
  Result<float> CheckFinite(const wire::Push& m, std::span<const float> values,
                            const std::string& part, uint64_t first_index)
      TETHER_REQUIRES(mu_);
  // Counts a push refused as non-finite against its worker, and logs it.
  void CountNonFiniteLocked(const PeerInfo& peer, const Status& s)
      TETHER_REQUIRES(mu_);

  // Replays the steps whose turn it is, joins and leaves included; ends
  // the replay when the recording does.
  void DrainReplayLocked() TETHER_REQUIRES(replay_mu_) TETHER_EXCLUDES(mu_);
  void StopReplayLocked(const Status& why) TETHER_REQUIRES(replay_mu_);
  // A message given to InOrder.
  struct Pending {
    RecordedEvent got;
    uint64_t request_id = 0;
    std::shared_ptr<Connection> conn;
    std::function<void()> run;
    std::function<void()> unordered;
  };
  // Hands `p` to the replayer (or refuses it after a divergence); returns
  // what to run now, outside the lock, when it is not ordered.
  std::function<void()> TakeInOrderLocked(Pending p)
      TETHER_REQUIRES(replay_mu_);
  // Into the recorder, or (a recorded run whose recorder is not there
  // yet: workers may come as the shard sets up) kept for it.
  void RecordLocked(const RecordedEvent& e) TETHER_REQUIRES(mu_) {
    if (recorder_ != nullptr) {
      recorder_->Add(e);
    } else if (settings_.record) {
      early_events_.push_back(e);
    }
  }

  // Constant after construction.
  const int shard_id_;
  const RunSettings settings_;
  const size_t max_frame_bytes_;

  using SteadyClock = std::chrono::steady_clock;
  static int64_t NowMs();  // steady clock
  // Stats() without the extra figures.
  ShardStats OwnStats() TETHER_EXCLUDES(mu_);
  // Makes `rank` live, at least at `clock` and, when it rejoins, at its
  // join clock; answers what that releases.
  void JoinLocked(int rank, int64_t clock, Outbox& out) TETHER_REQUIRES(mu_);

  Mutex mu_;
  ParamStore store_ TETHER_GUARDED_BY(mu_);
  std::unique_ptr<ApplyPool> apply_pool_ TETHER_GUARDED_BY(mu_);
  // A push's blocks for ApplyBlocks (CheckDensePush lists them; staged
  // ones are listed again at the clock's close), kept to allocate nothing
  // per push.
  std::vector<ParamStore::BlockGrad> block_grads_ TETHER_GUARDED_BY(mu_);
  // Rows read for a bfloat16 reply, before they are narrowed into it.
  std::vector<float> wire_scratch_ TETHER_GUARDED_BY(mu_);
  ClockTable clocks_ TETHER_GUARDED_BY(mu_);
  // Who is connected, evicted, last heard from: see WorkerTable for the
  // parts read and written without mu_.
  WorkerTable workers_;
  uint64_t late_pushes_ TETHER_GUARDED_BY(mu_) = 0;
  std::function<void(ShardStats&)> stats_extra_;  // set before serving
  uint64_t max_keys_ = uint64_t{1} << 20;         // set before serving
  int max_waiting_ = 4096;                        // set before serving
  std::map<const Connection*, int> waiting_by_conn_ TETHER_GUARDED_BY(mu_);
  // Replies of the pulls the clocks released, built by their callbacks
  // (run under mu_) and handed to the Outbox of the call that released them.
  std::vector<Reply> released_ TETHER_GUARDED_BY(mu_);
  // Pushes from BSP workers (bound 0) wait here, by the clock they belong
  // to, until every live worker has finished that clock; then they are
  // applied in rank order, so a BSP run is bit-for-bit repeatable whatever
  // order the pushes arrive in.
  struct StagedPush {
    int rank = 0;
    uint32_t tensor = 0;
    bool sparse = false;
    // Dense: a block, and at least every |value| of it (the push's check
    // measured them).
    struct Block {
      uint32_t block = 0;
      float bound = 0;
    };
    std::vector<Block> blocks;   // dense: the blocks, values in order
    std::vector<uint64_t> keys;  // sparse: the rows
    // The values, in a buffer from the pool (an applied push gave it
    // back: no fresh pages to fault in each clock).
    PooledFloats values;
  };
  // Stages a sparse push, or a dense one that CheckDensePush passed with
  // `grads`.
  void StageLocked(int rank, const wire::Push& m,
                   std::span<const ParamStore::BlockGrad> grads)
      TETHER_REQUIRES(mu_);
  void ApplyStagedLocked() TETHER_REQUIRES(mu_);
  // After the clocks moved: applies what the new minimum closes, takes a
  // checkpoint when due, then builds the replies of the released pulls
  // into `out`.
  void ClocksMovedLocked(std::vector<ClockTable::Release> released, Outbox& out)
      TETHER_REQUIRES(mu_);
  void MaybeCheckpointLocked() TETHER_REQUIRES(mu_);
  // Snapshots the store as `round` and hands it to the writer; Ok without
  // a new snapshot when this shard took `round` already (a requested round
  // that falls on a periodic one: writing it again would first delete the
  // round being written).
  Status TakeRoundLocked(int64_t round, Checkpointer::IfBusy if_busy)
      TETHER_REQUIRES(mu_);
  Checkpointer* checkpointer_ TETHER_GUARDED_BY(mu_) = nullptr;
  // The round this shard was restored from; -1 for none.
  int64_t restored_round_ TETHER_GUARDED_BY(mu_) = -1;
  int64_t next_round_clock_ TETHER_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::vector<StagedPush>> staged_ TETHER_GUARDED_BY(mu_);
  // The latest WorkerReport of each worker (shard 0 receives them), and on
  // every shard the count of its pushes refused as non-finite.
  std::vector<ShardStats::Worker> reports_ TETHER_GUARDED_BY(mu_);
  uint64_t reports_received_ TETHER_GUARDED_BY(mu_) = 0;
  std::array<uint64_t, kStalenessBuckets> staleness_histogram_
      TETHER_GUARDED_BY(mu_){};
  uint64_t staleness_sum_ TETHER_GUARDED_BY(mu_) = 0;
  uint64_t pushes_ TETHER_GUARDED_BY(mu_) = 0;
  uint64_t pulls_ TETHER_GUARDED_BY(mu_) = 0;
  uint64_t rejected_pushes_ TETHER_GUARDED_BY(mu_) = 0;
  uint64_t bytes_in_ TETHER_GUARDED_BY(mu_) = 0;
  uint64_t bytes_out_ TETHER_GUARDED_BY(mu_) = 0;

  Recorder* recorder_ TETHER_GUARDED_BY(mu_) = nullptr;
  std::vector<RecordedEvent> early_events_ TETHER_GUARDED_BY(mu_);
  uint64_t restored_events_ TETHER_GUARDED_BY(mu_) = 0;
  bool join_on_connect_ TETHER_GUARDED_BY(mu_) = false;
  std::set<int> joined_in_replay_ TETHER_GUARDED_BY(mu_);
  // Taken before mu_ when both are held.
  Mutex replay_mu_;
  std::unique_ptr<Replayer> replayer_ TETHER_GUARDED_BY(replay_mu_);
  Status replay_stopped_ TETHER_GUARDED_BY(replay_mu_);
  bool replay_pending_ TETHER_GUARDED_BY(replay_mu_) = false;
  bool replay_heard_ TETHER_GUARDED_BY(replay_mu_) = false;
  std::vector<Pending> pending_ TETHER_GUARDED_BY(replay_mu_);
  int64_t replay_moved_ms_ TETHER_GUARDED_BY(replay_mu_) = 0;
  size_t replay_moved_at_ TETHER_GUARDED_BY(replay_mu_) = 0;
  std::atomic<bool> replaying_{false};
};

}  // namespace tether
