// Membership, kept by shard 0: which shards have registered and where they
// listen, which worker holds which rank, and when the run may start.
//
// Workers are welcomed (given their rank, the run settings and the shard
// map) only once every shard has registered and --workers workers have
// joined, so no worker starts ahead of the others. Observers (tools,
// dashboards, tests) are welcomed once the shard map is complete.
//
// Thread-safe: every public method takes the coordinator's mutex. Replies go
// out through the peers' Connections.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "schema/connection.h"
#include "schema/mutex.h"
#include "schema/stats.h"
#include "server/chunk_pool.h"
#include "server/manifest.h"
#include "server/run_settings.h"
#include "server/share_plan.h"

namespace tether {

class Shard;

// One shard's report on one checkpoint round.
struct ShardRound {
  int shard_id = 0;
  int64_t round = 0;
  uint64_t bytes = 0;
  double seconds = 0;  // the shard's write time
  std::string error;   // empty: written
};

class Coordinator {
 public:
  // `own_address`: where shard 0 itself is reached by workers;
  // `worker_clock` tells a (re)joining worker's clock on shard 0.
  Coordinator(RunSettings settings, std::string own_address,
              std::function<int64_t(int rank)> worker_clock);

  // A shard's Hello. Answers Welcome (with the run settings) or an Error,
  // e.g. for an id out of range or one already held by a live shard.
  // `serving_run_id` (non-empty) says the shard has been serving that run
  // all along and lost its coordinator: when it is this run's, the shard
  // keeps its state (no round to load) -- a restarted shard 0 resuming
  // this run takes it back (see StartResume) -- otherwise it is refused.
  void RegisterShard(int shard_id, const std::string& address,
                     const std::shared_ptr<Connection>& conn,
                     const std::string& serving_run_id = "")
      TETHER_EXCLUDES(mu_);
  void ShardLeft(int shard_id, const Connection* conn) TETHER_EXCLUDES(mu_);

  // A worker's Hello asking for `requested_rank` (-1: the lowest free
  // one). Returns the rank it now holds, or the error to send (rank taken
  // or out of range, cluster full). Ranks 0..--workers-1 must all have
  // joined before training starts; more may join at any time, up to
  // RankCapacity (--max-workers). The Welcome follows when the run can
  // start (at once, once it has: a late joiner takes the slowest live
  // worker's clock).
  // A worker that says it is `reconnecting` (its Hello carries its clock)
  // takes its rank over from a connection that went silent: that one is
  // closed.
  Result<int> JoinWorker(int requested_rank, int staleness,
                         const std::shared_ptr<Connection>& conn,
                         bool reconnecting = false) TETHER_EXCLUDES(mu_);
  // Frees `rank` when its connection ends.
  void WorkerLeft(int rank, const Connection* conn) TETHER_EXCLUDES(mu_);
  // Worker `rank` (on `conn`) leaves the run for good, saying `reason`: it
  // is no longer a member (no share of later epochs), the chunk it holds is
  // done (`finished`) or goes back to the pool, and the dashboard shows it
  // as left. Its connection closes next, which frees the rank.
  // `unfinished`: the rest of its fixed share it did not train, for the
  // next member that asks (TakeLeftover).
  void WorkerLeaving(int rank, const Connection* conn,
                     const std::string& reason, bool finished,
                     const std::optional<SharePlans::Leftover>& unfinished =
                         std::nullopt) TETHER_EXCLUDES(mu_);

  // Fixed data shares: worker `rank` at `clock` asks for its share of
  // `epoch` (SharePlans::Ask, with the workers in the run now).
  // kInvalidArgument for a negative epoch. `decided`, as NextChunk's
  // `taken`.
  Result<SharePlans::Answer> Share(int rank, int epoch, int64_t clock,
                                   uint32_t batch = 0,
                                   const std::function<void()>& decided = {})
      TETHER_EXCLUDES(mu_);
  // Worker `rank`, done with its own share, asks for a share part a
  // departed member left, of `epoch` or earlier (SharePlans::TakeLeftover).
  std::optional<SharePlans::Leftover> TakeLeftover(
      int rank, int epoch, const std::function<void()>& decided = {})
      TETHER_EXCLUDES(mu_);

  // An observer's Hello; Welcome follows once the shard map is complete.
  void JoinObserver(const std::shared_ptr<Connection>& conn)
      TETHER_EXCLUDES(mu_);

  // A shard wrote its slice of a round (`error` empty) or failed. Once
  // every shard has written a round, `on_complete(round, bytes)` runs (to
  // record it) and every shard is told, so it may prune older rounds.
  // `on_shard_round` sees every report first (for the dashboard).
  void RoundWritten(const ShardRound& written) TETHER_EXCLUDES(mu_);
  void OnRoundComplete(std::function<void(int64_t, uint64_t)> on_complete)
      TETHER_EXCLUDES(mu_);
  void OnShardRound(std::function<void(const ShardRound&)> on_shard_round)
      TETHER_EXCLUDES(mu_);

  // Chunked data assignment. The next chunk for worker `rank` (the one it
  // held is done): a chunk, or none with `finished` telling whether every
  // chunk is done (else others still hold some: ask again). The first
  // request sizes the pool; later ones must match it (kInvalidArgument).
  struct DataAnswer {
    std::optional<ChunkPool::Chunk> chunk;
    bool finished = false;
  };
  // What a worker's DataRequest says: the data's shape (every worker of
  // a run must send the same), and its clock and batch (ChunkPool::Next).
  struct ChunkRequest {
    uint64_t rows = 0;
    uint32_t chunk_rows = 0;
    int epochs = 0;
    int64_t clock = -1;
    uint32_t batch = 0;
  };
  // `taken` (when set) runs under the coordinator's lock once the pool has
  // answered something that changed it or ends the rank's work (not when
  // a rank with no chunk in hand gets none, which it asks again for as
  // timing has it): what a recording of the run's order records there.
  Result<DataAnswer> NextChunk(int rank, const ChunkRequest& request,
                               const std::function<void()>& taken = {})
      TETHER_EXCLUDES(mu_);
  // `rank` died or was evicted: the chunk it holds goes back to the pool.
  void ReleaseChunk(int rank) TETHER_EXCLUDES(mu_);
  // Adds the chunk accounting to shard 0's figures.
  void AddDataStats(ShardStats& stats) const TETHER_EXCLUDES(mu_);

  // The data assignment as the round at `clock` keeps it (DataProgress as
  // JSON: the rows trained before that clock, ChunkPool::Save, and the
  // epochs' share plans), and taking it back when a run resumes (before
  // any worker joins). kCorruption or kInvalidArgument when `json` does
  // not describe a valid assignment.
  std::string SaveDataProgress(int64_t clock) const TETHER_EXCLUDES(mu_);
  Status RestoreDataProgress(const std::string& json) TETHER_EXCLUDES(mu_);

  // A checkpoint round now: `take_local` writes shard 0's slice and names
  // the round, then every other shard is told to write the same round.
  void SetTakeRound(std::function<Result<int64_t>()> take_local)
      TETHER_EXCLUDES(mu_);
  Result<int64_t> CheckpointNow() TETHER_EXCLUDES(mu_);

  // Resuming: shard 0 has loaded `round`; `complete` lists the complete
  // rounds (ascending) in shard 0's records. Nobody is welcomed -- workers
  // and observers wait -- until every shard reports (ShardResumed) that it
  // loaded the same round; then `resumed(round)` runs. When a shard cannot
  // load it: with `fallback` (--resume latest) the run falls back to the newest
  // complete round that every shard holds intact (`load_local` loads it on
  // shard 0, LoadRound tells the others), saying so; otherwise, or when no
  // such round is left, every shard and waiting peer gets an Error and
  // `failed(why)` runs: the run does not start. Call before serving.
  //
  // A shard that re-registers serving this run (RegisterShard) counts as
  // loaded with its own, newer state: shard 0 was restarted in a running
  // run and takes it back. Then `resumed(round, true)`: the workers are
  // welcomed back at once, as they reconnect, with no --workers quorum.
  struct ResumeHooks {
    std::function<Status(int64_t round)> load_local;
    std::function<void(const Status& why)> failed;
    std::function<void(int64_t round, bool taken_back)> resumed;
  };
  void StartResume(int64_t round, std::vector<int64_t> complete, bool fallback,
                   ResumeHooks hooks) TETHER_EXCLUDES(mu_);
  // Shard `shard_id` loaded `round` (`error` empty) or could not; `intact`
  // lists the rounds it can load. Reports for a round no longer asked for
  // are ignored.
  void ShardResumed(int shard_id, int64_t round, const std::string& error,
                    const std::vector<int64_t>& intact) TETHER_EXCLUDES(mu_);

  // Ends training: every joined worker is told to stop after its current
  // step (it reports, evaluates and exits 0), and workers that join later
  // are refused. The shards keep serving. Returns how many were told;
  // kUnavailable when the run was stopped already.
  Result<int> StopRun(const std::string& reason) TETHER_EXCLUDES(mu_);

  // OK once every shard has registered and the run goes on (for /readyz);
  // otherwise why not: shards still missing, a resume not done, the run
  // stopped.
  Status Readiness() const TETHER_EXCLUDES(mu_);

  // The run manifest, filled in by the sessions as processes say theirs.
  RunManifest& manifest() { return manifest_; }

 private:
  struct Waiting {
    std::shared_ptr<Connection> conn;
    int rank;
    int staleness;
  };
  bool MapComplete() const TETHER_REQUIRES(mu_);
  int JoinedWorkers() const TETHER_REQUIRES(mu_);
  // Ranks 0..--workers-1 have all joined: training may start.
  bool QuorumJoined() const TETHER_REQUIRES(mu_);
  // The ranks in the run now: connected and not leaving, ascending.
  std::vector<int> InRunLocked() const TETHER_REQUIRES(mu_);
  // Welcomes whoever may start now.
  void ReleaseLocked() TETHER_REQUIRES(mu_);
  OutFrame MakeWelcome(int rank, int staleness) const TETHER_REQUIRES(mu_);
  // The settings as handed out now: with the round being resumed.
  RunSettings CurrentSettingsLocked() const TETHER_REQUIRES(mu_);
  // Every resuming shard loaded the round: the run may start.
  void ResumedLocked() TETHER_REQUIRES(mu_);
  // The run cannot resume: tells every shard and waiting peer, then hooks.
  void ResumeFailedLocked(const Status& why) TETHER_REQUIRES(mu_);

  const RunSettings settings_;
  const std::function<int64_t(int rank)> worker_clock_;
  RunManifest manifest_;

  mutable Mutex mu_;
  // "" until registered.
  std::vector<std::string> shard_addresses_ TETHER_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<Connection>> shard_conns_ TETHER_GUARDED_BY(mu_);
  // Registered once: the next is a restart.
  std::vector<bool> shard_seen_ TETHER_GUARDED_BY(mu_);
  int64_t latest_complete_round_ TETHER_GUARDED_BY(mu_) = -1;
  struct RoundProgress {
    std::vector<bool> written;
    uint64_t bytes = 0;
  };
  // Rounds not yet complete.
  std::map<int64_t, RoundProgress> rounds_ TETHER_GUARDED_BY(mu_);
  std::function<void(int64_t, uint64_t)> on_round_complete_
      TETHER_GUARDED_BY(mu_);
  std::function<void(const ShardRound&)> on_shard_round_ TETHER_GUARDED_BY(mu_);
  std::function<Result<int64_t>()> take_round_ TETHER_GUARDED_BY(mu_);
  // By rank; null when free.
  std::vector<const Connection*> worker_conns_ TETHER_GUARDED_BY(mu_);
  // The same, owned.
  std::vector<std::weak_ptr<Connection>> worker_links_ TETHER_GUARDED_BY(mu_);
  // By rank: its worker said it leaves for good (cleared when the rank is
  // taken again).
  std::vector<bool> left_ TETHER_GUARDED_BY(mu_);
  SharePlans shares_ TETHER_GUARDED_BY(mu_);
  // Hello'd peers not yet welcomed.
  std::vector<Waiting> waiting_ TETHER_GUARDED_BY(mu_);
  // Every worker has been welcomed once.
  bool started_ TETHER_GUARDED_BY(mu_) = false;
  // Why the run was stopped; "" running.
  std::string stopped_ TETHER_GUARDED_BY(mu_);
  struct Resume {
    bool active = false;       // waiting for every shard to load `round`
    int64_t round = -1;        // the round being resumed
    std::set<int64_t> left;    // rounds the run may still fall back to
    std::vector<bool> loaded;  // by shard
    bool fallback = false;     // --resume latest
    bool taken_back = false;   // a shard kept serving the run meanwhile
    ResumeHooks hooks;
  };
  Resume resume_ TETHER_GUARDED_BY(mu_);
  // Made by the first DataRequest, for chunk_rows_total_ rows.
  std::optional<ChunkPool> chunks_ TETHER_GUARDED_BY(mu_);
  uint64_t chunk_rows_total_ TETHER_GUARDED_BY(mu_) = 0;
  uint32_t chunk_rows_ TETHER_GUARDED_BY(mu_) = 0;
  int chunk_epochs_ TETHER_GUARDED_BY(mu_) = 0;
};

// Shard 0's coordinator, wired to shard 0 (`shard`, which must outlive it):
// joining workers' clocks, checkpoint rounds taken on demand, and the data
// figures in the shard's stats. `address` is where shard 0 is reached.
std::unique_ptr<Coordinator> MakeCoordinator(Shard& shard,
                                             const std::string& address);

}  // namespace tether
