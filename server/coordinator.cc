#include "server/coordinator.h"

#include <algorithm>

#include "schema/log.h"
#include "server/data_progress.h"
#include "server/shard.h"

namespace tether {

Coordinator::Coordinator(RunSettings settings, std::string own_address,
                         std::function<int64_t(int rank)> worker_clock)
    : settings_(settings),
      worker_clock_(std::move(worker_clock)),
      manifest_(settings),
      shard_addresses_(settings.num_shards),
      shard_conns_(settings.num_shards),
      shard_seen_(settings.num_shards, false),
      latest_complete_round_(settings.resume_round),
      worker_conns_(settings.num_workers, nullptr),
      worker_links_(settings.num_workers),
      left_(settings.num_workers, false) {
  shard_addresses_[0] = std::move(own_address);
}

bool Coordinator::MapComplete() const {
  for (const std::string& a : shard_addresses_) {
    if (a.empty()) return false;
  }
  return true;
}

Status Coordinator::Readiness() const {
  MutexLock lock(&mu_);
  if (!stopped_.empty()) return Unavailable("the run was stopped: " + stopped_);
  int registered = 0;
  for (const std::string& a : shard_addresses_) registered += !a.empty();
  if (registered < static_cast<int>(shard_addresses_.size())) {
    return Unavailable(std::to_string(registered) + " of " +
                       std::to_string(shard_addresses_.size()) +
                       " shards registered");
  }
  return Status::Ok();
}

int Coordinator::JoinedWorkers() const {
  int n = 0;
  for (const Connection* c : worker_conns_) n += c != nullptr;
  return n;
}

bool Coordinator::QuorumJoined() const {
  for (int r = 0; r < settings_.num_workers; ++r) {
    if (worker_conns_[r] == nullptr) return false;
  }
  return true;
}

std::vector<int> Coordinator::InRunLocked() const {
  std::vector<int> ranks;
  for (size_t r = 0; r < worker_conns_.size(); ++r) {
    if (worker_conns_[r] != nullptr && !left_[r]) {
      ranks.push_back(static_cast<int>(r));
    }
  }
  return ranks;
}

void Coordinator::RegisterShard(int shard_id, const std::string& address,
                                const std::shared_ptr<Connection>& conn,
                                const std::string& serving_run_id) {
  MutexLock lock(&mu_);
  Status error;
  if (!serving_run_id.empty() && serving_run_id != settings_.run_id) {
    error = InvalidArgument(
        "shard " + std::to_string(shard_id) + " serves run " + serving_run_id +
        ", and this coordinator runs " + settings_.run_id +
        ": start shard 0 again with --resume latest and the run's "
        "--data-dir to take that run back");
  } else if (shard_id <= 0 || shard_id >= settings_.num_shards) {
    error = InvalidArgument("shard id " + std::to_string(shard_id) +
                            " is not in 1.." +
                            std::to_string(settings_.num_shards - 1) +
                            " (coordinator runs --shards " +
                            std::to_string(settings_.num_shards) + ")");
  } else if (serving_run_id.empty() &&
             shard_conns_[shard_id].lock() != nullptr) {
    error = InvalidArgument("shard " + std::to_string(shard_id) +
                            " is already registered from " +
                            shard_addresses_[shard_id]);
  } else if (auto hp = ParseHostPort(address, "shard address"); !hp.ok()) {
    error = hp.status();
  }
  if (!error.ok()) {
    TETHER_LOG(kWarning) << "refused shard registration from " << conn->peer()
                         << ": " << error.message();
    return conn->SendAndClose(MakeErrorFrame(0, error));
  }
  if (!serving_run_id.empty()) {
    // It lost its coordinator (shard 0 restarted, or the network between
    // them failed) and kept serving: its state is newer than any round.
    if (!shard_addresses_[shard_id].empty() &&
        address != shard_addresses_[shard_id]) {
      TETHER_LOG(kWarning) << "shard " << shard_id << " re-registered at "
                           << address << ", not " << shard_addresses_[shard_id];
    }
    // This side may not have seen its old connection end yet.
    std::shared_ptr<Connection> old = shard_conns_[shard_id].lock();
    shard_seen_[shard_id] = true;
    shard_addresses_[shard_id] = address;
    shard_conns_[shard_id] = conn;
    TETHER_LOG(kInfo) << "shard " << shard_id << " registered again at "
                      << address
                      << ": it kept serving the run and keeps its state";
    conn->Send(MakeWelcome(-1, -1));
    bool all_loaded = false;
    if (resume_.active) {
      resume_.taken_back = true;
      resume_.loaded[shard_id] = true;
      all_loaded = std::all_of(resume_.loaded.begin(), resume_.loaded.end(),
                               [](bool loaded) { return loaded; });
    }
    if (all_loaded) {
      ResumedLocked();
    } else {
      ReleaseLocked();
    }
    lock.Unlock();
    if (old && old != conn) old->Close();
    return;
  }
  if (shard_seen_[shard_id]) {
    // A restarted shard: it loads the latest complete round and workers
    // reconnect to it, at the address they know.
    if (address != shard_addresses_[shard_id]) {
      TETHER_LOG(kWarning) << "shard " << shard_id << " came back at "
                           << address << ", not " << shard_addresses_[shard_id]
                           << ": workers dial the old address; restart it "
                              "with the same --listen";
    }
    RunSettings restart = CurrentSettingsLocked();
    restart.shard_restart = true;
    restart.resume_round = latest_complete_round_;
    shard_conns_[shard_id] = conn;
    TETHER_LOG(kWarning) << "shard " << shard_id << " registered again at "
                         << address << " (restarted): it resumes from "
                         << (latest_complete_round_ >= 0
                                 ? "round " +
                                       std::to_string(latest_complete_round_)
                                 : std::string("its initial values (no "
                                               "complete round yet)"));
    conn->Send(MakeWelcomeFrame(restart, 0, -1, -1, 0));
    return;
  }
  shard_seen_[shard_id] = true;
  shard_addresses_[shard_id] = address;
  shard_conns_[shard_id] = conn;
  TETHER_LOG(kInfo) << "shard " << shard_id << " registered at " << address;
  conn->Send(MakeWelcome(-1, -1));
  ReleaseLocked();
}

void Coordinator::ShardLeft(int shard_id, const Connection* conn) {
  MutexLock lock(&mu_);
  if (shard_id > 0 && shard_id < settings_.num_shards &&
      shard_conns_[shard_id].lock().get() == conn) {
    shard_conns_[shard_id].reset();
    TETHER_LOG(kWarning) << "shard " << shard_id << " disconnected";
  }
}

Result<int> Coordinator::JoinWorker(int requested_rank, int staleness,
                                    const std::shared_ptr<Connection>& conn,
                                    bool reconnecting) {
  MutexLock lock(&mu_);
  if (!stopped_.empty()) {
    return Unavailable("the run was stopped (" + stopped_ +
                       "); start a new one, or resume it with --resume");
  }
  const int n = settings_.num_workers;
  const int capacity = RankCapacity(settings_);
  int rank = requested_rank;
  if (rank >= capacity) {
    return InvalidArgument(
        "rank " + std::to_string(rank) + " is out of range: this run takes " +
        (settings_.max_workers > 0
             ? "ranks 0.." + std::to_string(capacity - 1) + " (--max-workers " +
                   std::to_string(settings_.max_workers) + ")"
             : "ranks below " + std::to_string(capacity)));
  }
  const int held = static_cast<int>(worker_conns_.size());
  std::shared_ptr<Connection> replaced;
  if (rank >= 0 && rank < held && worker_conns_[rank] != nullptr) {
    if (!reconnecting) {
      return InvalidArgument("rank " + std::to_string(rank) +
                             " is already held by a connected worker");
    }
    // The worker gave up on its old connection (it heard nothing for the
    // run's timeout); this side may not have noticed yet.
    replaced = worker_links_[rank].lock();
    TETHER_LOG(kWarning) << "worker " << rank << " reconnected from "
                         << conn->peer() << "; closing its old connection";
  }
  if (rank < 0) {
    for (int r = 0; r < capacity && rank < 0; ++r) {
      if (r >= held || worker_conns_[r] == nullptr) rank = r;
    }
    if (rank < 0) {
      return Unavailable("cluster full: all " + std::to_string(capacity) +
                         " worker ranks are taken (--max-workers)");
    }
  }
  if (rank >= held) {
    worker_conns_.resize(rank + 1, nullptr);
    worker_links_.resize(rank + 1);
    left_.resize(rank + 1, false);
  }
  left_[rank] = false;
  worker_conns_[rank] = conn.get();
  worker_links_[rank] = conn;
  waiting_.push_back({conn, rank, staleness});
  if (started_ && rank >= n) {
    TETHER_LOG(kInfo) << "worker " << rank << " joined from " << conn->peer()
                      << " (" << JoinedWorkers() << " in the run)";
  } else {
    TETHER_LOG(kInfo) << "worker " << rank << " joined from " << conn->peer()
                      << " (" << JoinedWorkers() << "/" << n << ")";
  }
  ReleaseLocked();
  lock.Unlock();
  if (replaced) replaced->Close();
  return rank;
}

void Coordinator::WorkerLeft(int rank, const Connection* conn) {
  MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int>(worker_conns_.size())) return;
  if (worker_conns_[rank] != conn) return;
  worker_conns_[rank] = nullptr;
  worker_links_[rank].reset();
  std::erase_if(waiting_,
                [conn](const Waiting& w) { return w.conn.get() == conn; });
  // A chunk it was training on goes to the next worker that asks.
  if (chunks_) chunks_->Release(rank);
  if (left_[rank]) {
    TETHER_LOG(kInfo) << "worker " << rank << " disconnected; rank " << rank
                      << " is free";
  } else {
    TETHER_LOG(kWarning) << "worker " << rank
                         << " disconnected without leaving: it may come back";
  }
}

void Coordinator::WorkerLeaving(
    int rank, const Connection* conn, const std::string& reason, bool finished,
    const std::optional<SharePlans::Leftover>& unfinished) {
  MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int>(worker_conns_.size()) ||
      worker_conns_[rank] != conn || left_[rank]) {
    return;
  }
  left_[rank] = true;
  if (chunks_ && finished) chunks_->Complete(rank);
  if (chunks_) chunks_->Release(rank);  // unfinished: back to the pool
  if (unfinished) {
    shares_.AddLeftover(*unfinished);
    TETHER_LOG(kInfo) << "worker " << rank
                      << " leaves part of a share of epoch "
                      << unfinished->epoch << " untrained (from row "
                      << unfinished->first_row
                      << "): the next member that asks trains it";
  }
  TETHER_LOG(kInfo) << "worker " << rank << " left the run ("
                    << (reason.empty() ? "no reason given" : reason) << "); "
                    << InRunLocked().size() << " in the run";
}

Result<SharePlans::Answer> Coordinator::Share(
    int rank, int epoch, int64_t clock, uint32_t batch,
    const std::function<void()>& decided) {
  if (epoch < 0) {
    return InvalidArgument("share request for epoch " + std::to_string(epoch));
  }
  MutexLock lock(&mu_);
  const bool known = shares_.plans().count(epoch) > 0;
  SharePlans::Answer answer =
      shares_.Ask(rank, epoch, clock, InRunLocked(), batch);
  if (decided) decided();
  if (!known && answer.decided) {
    TETHER_LOG(kInfo) << "epoch " << epoch << ": " << answer.members
                      << " worker(s) share the data";
  }
  return answer;
}

std::optional<SharePlans::Leftover> Coordinator::TakeLeftover(
    int rank, int epoch, const std::function<void()>& decided) {
  MutexLock lock(&mu_);
  auto leftover = shares_.TakeLeftover(epoch);
  if (decided) decided();
  if (leftover) {
    TETHER_LOG(kInfo) << "worker " << rank << " trains the rest of member "
                      << leftover->index << "'s share of epoch "
                      << leftover->epoch << " (from row " << leftover->first_row
                      << ")";
  }
  return leftover;
}

void Coordinator::OnRoundComplete(
    std::function<void(int64_t, uint64_t)> on_complete) {
  MutexLock lock(&mu_);
  on_round_complete_ = std::move(on_complete);
}

void Coordinator::SetTakeRound(std::function<Result<int64_t>()> take_local) {
  MutexLock lock(&mu_);
  take_round_ = std::move(take_local);
}

Result<int64_t> Coordinator::CheckpointNow() {
  MutexLock lock(&mu_);
  if (!take_round_) return Unavailable("checkpoints are not set up");
  auto take = take_round_;
  std::vector<std::shared_ptr<Connection>> shards;
  for (auto& weak : shard_conns_) {
    if (auto conn = weak.lock()) shards.push_back(std::move(conn));
  }
  lock.Unlock();
  TETHER_ASSIGN_OR_RETURN(auto round, take());
  flatbuffers::FlatBufferBuilder fbb(64);
  OutFrame frame = FinishFrame(fbb, wire::CreateTakeRound(fbb, round));
  for (auto& conn : shards) conn->Send(frame);
  TETHER_LOG(kInfo) << "checkpoint round " << round << " requested";
  return round;
}

void Coordinator::OnShardRound(
    std::function<void(const ShardRound&)> on_shard_round) {
  MutexLock lock(&mu_);
  on_shard_round_ = std::move(on_shard_round);
}

void Coordinator::RoundWritten(const ShardRound& written) {
  const int shard_id = written.shard_id;
  const int64_t round = written.round;
  const std::string& error = written.error;
  MutexLock lock(&mu_);
  if (shard_id < 0 || shard_id >= settings_.num_shards) return;
  if (on_shard_round_) on_shard_round_(written);
  if (!error.empty()) {
    TETHER_LOG(kError) << "checkpoint round " << round << " failed on shard "
                       << shard_id << ": " << error
                       << "; the previous complete round stays the latest";
    rounds_.erase(round);
    return;
  }
  RoundProgress& progress = rounds_[round];
  progress.written.resize(settings_.num_shards, false);
  progress.written[shard_id] = true;
  progress.bytes += written.bytes;
  for (bool w : progress.written) {
    if (!w) return;
  }
  const uint64_t total = progress.bytes;
  latest_complete_round_ = std::max(latest_complete_round_, round);
  // Older rounds that never completed never will.
  rounds_.erase(rounds_.begin(), rounds_.upper_bound(round));
  std::vector<std::shared_ptr<Connection>> shards;
  for (auto& weak : shard_conns_) {
    if (auto conn = weak.lock()) shards.push_back(std::move(conn));
  }
  auto on_complete = on_round_complete_;
  lock.Unlock();
  if (on_complete) on_complete(round, total);
  flatbuffers::FlatBufferBuilder fbb(64);
  OutFrame frame = FinishFrame(fbb, wire::CreateRoundComplete(fbb, round));
  for (auto& conn : shards) conn->Send(frame);
}

Result<Coordinator::DataAnswer> Coordinator::NextChunk(
    int rank, const ChunkRequest& r, const std::function<void()>& taken) {
  MutexLock lock(&mu_);
  if (!chunks_) {
    auto pool = ChunkPool::Create(RankCapacity(settings_), r.rows, r.chunk_rows,
                                  r.epochs, settings_.seed);
    if (!pool.ok()) return pool.status().WithContext("data request");
    chunks_ = std::move(*pool);
    chunk_rows_total_ = r.rows;
    chunk_rows_ = r.chunk_rows;
    chunk_epochs_ = r.epochs;
    TETHER_LOG(kInfo) << "chunked data: " << r.rows << " rows in chunks of "
                      << r.chunk_rows << ", " << r.epochs << " epochs";
  } else if (r.rows != chunk_rows_total_ || r.chunk_rows != chunk_rows_ ||
             r.epochs != chunk_epochs_) {
    return InvalidArgument("data request for " + std::to_string(r.rows) +
                           " rows, chunks of " + std::to_string(r.chunk_rows) +
                           ", " + std::to_string(r.epochs) +
                           " epochs does not match the run's " +
                           std::to_string(chunk_rows_total_) +
                           " rows, chunks of " + std::to_string(chunk_rows_) +
                           ", " + std::to_string(chunk_epochs_) + " epochs");
  }
  const uint64_t rows_before = chunks_->RowsDone(rank);
  TETHER_ASSIGN_OR_RETURN(auto next, chunks_->Next(rank, r.clock, r.batch));
  DataAnswer answer;
  answer.chunk = next;
  answer.finished = !answer.chunk && chunks_->Done();
  // A worker with nothing in hand that gets nothing changed nothing: it
  // asks again, as often as timing has it.
  if (taken &&
      (next || answer.finished || chunks_->RowsDone(rank) != rows_before)) {
    taken();
  }
  return answer;
}

std::string Coordinator::SaveDataProgress(int64_t clock) const {
  MutexLock lock(&mu_);
  DataProgress progress;
  if (chunks_) progress.chunks = chunks_->Save(clock);
  progress.shares = shares_.plans();
  progress.leftovers = shares_.leftovers();
  return DataProgressToJson(progress);
}

Status Coordinator::RestoreDataProgress(const std::string& json) {
  TETHER_ASSIGN_OR_RETURN(DataProgress progress, DataProgressFromJson(json));
  MutexLock lock(&mu_);
  if (progress.chunks) {
    TETHER_ASSIGN_OR_RETURN(
        auto pool, ChunkPool::Resume(RankCapacity(settings_), *progress.chunks,
                                     settings_.seed));
    chunks_ = std::move(pool);
    chunk_rows_total_ = progress.chunks->rows;
    chunk_rows_ = progress.chunks->chunk_rows;
    chunk_epochs_ = progress.chunks->epochs;
  }
  std::sort(progress.leftovers.begin(), progress.leftovers.end(),
            [](const auto& a, const auto& b) { return a.epoch < b.epoch; });
  shares_.Restore(std::move(progress.shares), std::move(progress.leftovers));
  return Status::Ok();
}

void Coordinator::ReleaseChunk(int rank) {
  MutexLock lock(&mu_);
  if (chunks_) chunks_->Release(rank);
}

void Coordinator::AddDataStats(ShardStats& stats) const {
  MutexLock lock(&mu_);
  for (size_t r = 0; r < left_.size() && r < stats.workers.size(); ++r) {
    stats.workers[r].left = left_[r];
  }
  if (!chunks_) return;
  for (const ChunkPool::EpochCount& e : chunks_->Counts()) {
    stats.data_epochs.push_back(
        {e.epoch, e.chunks_total, e.chunks_done, e.rows_done, e.duplicates});
  }
  stats.chunks_reassigned = chunks_->reassigned();
}

void Coordinator::JoinObserver(const std::shared_ptr<Connection>& conn) {
  MutexLock lock(&mu_);
  waiting_.push_back({conn, -1, -1});
  ReleaseLocked();
}

void Coordinator::StartResume(int64_t round, std::vector<int64_t> complete,
                              bool fallback, ResumeHooks hooks) {
  MutexLock lock(&mu_);
  resume_.active = true;
  resume_.fallback = fallback;
  resume_.round = round;
  resume_.left.insert(complete.begin(), complete.end());
  resume_.loaded.assign(settings_.num_shards, false);
  resume_.loaded[0] = true;
  resume_.hooks = std::move(hooks);
  latest_complete_round_ = round;
  if (settings_.num_shards == 1) ResumedLocked();
}

void Coordinator::ShardResumed(int shard_id, int64_t round,
                               const std::string& error,
                               const std::vector<int64_t>& intact) {
  MutexLock lock(&mu_);
  if (!resume_.active || round != resume_.round || shard_id <= 0 ||
      shard_id >= settings_.num_shards) {
    return;
  }
  if (error.empty()) {
    resume_.loaded[shard_id] = true;
    TETHER_LOG(kInfo) << "shard " << shard_id << " loaded round " << round;
    for (bool loaded : resume_.loaded) {
      if (!loaded) return;
    }
    return ResumedLocked();
  }
  const std::string why = "shard " + std::to_string(shard_id) +
                          " cannot load round " + std::to_string(round) + ": " +
                          error;
  TETHER_LOG(kError) << why;
  // Only rounds this shard still holds intact can serve the whole run.
  std::set<int64_t> left;
  for (int64_t r : intact) {
    if (resume_.left.count(r) > 0 && r != round) left.insert(r);
  }
  resume_.left = std::move(left);
  if (!resume_.fallback) {
    return ResumeFailedLocked(Status(
        Code::kIoError, "--resume " + std::to_string(round) + ": " + why +
                            "; the run does not start (--resume latest "
                            "would fall back to an older intact round)"));
  }
  while (!resume_.left.empty()) {
    const int64_t older = *resume_.left.rbegin();
    resume_.left.erase(older);
    Status local = resume_.hooks.load_local(older);
    if (!local.ok()) {
      TETHER_LOG(kError) << "shard 0 cannot load round " << older << ": "
                         << local.message();
      continue;
    }
    TETHER_LOG(kWarning) << "--resume latest: " << why
                         << "; falling back to round " << older
                         << ", the newest complete round it holds intact";
    resume_.round = older;
    latest_complete_round_ = older;
    resume_.loaded.assign(settings_.num_shards, false);
    resume_.loaded[0] = true;
    flatbuffers::FlatBufferBuilder fbb(64);
    OutFrame frame = FinishFrame(fbb, wire::CreateLoadRound(fbb, older));
    for (auto& weak : shard_conns_) {
      if (auto conn = weak.lock()) conn->Send(frame);
    }
    return;
  }
  ResumeFailedLocked(Status(
      Code::kIoError,
      "--resume latest: " + why +
          ", and no older complete round is held intact by every shard; the "
          "run does not start"));
}

void Coordinator::ResumedLocked() {
  resume_.active = false;
  // The workers are out there, training: each is welcomed back as it
  // reconnects, as to a restarted shard.
  if (resume_.taken_back) started_ = true;
  // A run resumed on fewer workers: the ranks beyond --workers hand the
  // rest of their fixed shares to the others.
  if (!resume_.taken_back) {
    if (int handed = shares_.HandOff(settings_.num_workers, resume_.round);
        handed > 0) {
      TETHER_LOG(kInfo) << handed << " share(s) of ranks beyond --workers "
                        << settings_.num_workers
                        << " go to the others, from where the round has them";
    }
  }
  if (resume_.hooks.resumed) {
    resume_.hooks.resumed(resume_.round, resume_.taken_back);
  }
  ReleaseLocked();
}

void Coordinator::ResumeFailedLocked(const Status& why) {
  TETHER_LOG(kError) << why.message();
  OutFrame error = MakeErrorFrame(0, why);
  for (auto& weak : shard_conns_) {
    if (auto conn = weak.lock()) conn->SendAndClose(error);
  }
  for (Waiting& w : waiting_) w.conn->SendAndClose(error);
  waiting_.clear();
  stopped_ = "it could not resume";
  if (resume_.hooks.failed) resume_.hooks.failed(why);
}

void Coordinator::ReleaseLocked() {
  if (!MapComplete() || resume_.active) return;
  // The first start needs every worker; later joiners (restarts) go at once.
  bool workers_may_start = started_ || QuorumJoined();
  if (workers_may_start && !started_ && settings_.num_workers > 0) {
    started_ = true;
    TETHER_LOG(kInfo) << "all " << settings_.num_workers
                      << " workers joined; training starts";
  }
  std::vector<Waiting> still_waiting;
  for (Waiting& w : waiting_) {
    if (w.rank >= 0 && !workers_may_start) {
      still_waiting.push_back(std::move(w));
      continue;
    }
    w.conn->Send(MakeWelcome(w.rank, w.staleness));
  }
  waiting_ = std::move(still_waiting);
}

RunSettings Coordinator::CurrentSettingsLocked() const {
  RunSettings current = settings_;
  if (resume_.round >= 0) current.resume_round = resume_.round;
  return current;
}

OutFrame Coordinator::MakeWelcome(int rank, int staleness) const {
  static const std::vector<std::string> kNoMap;
  return MakeWelcomeFrame(CurrentSettingsLocked(), 0, rank, staleness,
                          rank >= 0 ? worker_clock_(rank) : 0,
                          MapComplete() ? shard_addresses_ : kNoMap);
}

Result<int> Coordinator::StopRun(const std::string& reason) {
  std::vector<std::shared_ptr<Connection>> workers, unwelcomed;
  {
    MutexLock lock(&mu_);
    if (!stopped_.empty()) return Unavailable("the run was stopped already");
    stopped_ = reason;
    // Workers still waiting for their Welcome will not get one.
    std::erase_if(waiting_, [&](const Waiting& w) {
      if (w.rank >= 0) unwelcomed.push_back(w.conn);
      return w.rank >= 0;
    });
    for (const auto& link : worker_links_) {
      auto conn = link.lock();
      if (conn && std::find(unwelcomed.begin(), unwelcomed.end(), conn) ==
                      unwelcomed.end()) {
        workers.push_back(std::move(conn));
      }
    }
  }
  for (const auto& conn : unwelcomed) {
    conn->SendAndClose(MakeErrorFrame(
        0,
        Unavailable("the run was stopped (" + reason + ") before it started")));
  }
  for (const auto& conn : workers) {
    flatbuffers::FlatBufferBuilder fbb(64);
    conn->Send(
        FinishFrame(fbb, wire::CreateStop(fbb, fbb.CreateString(reason))));
  }
  TETHER_LOG(kWarning) << "run stopped (" << reason << "): told "
                       << workers.size() << " worker(s)";
  return static_cast<int>(workers.size());
}

std::unique_ptr<Coordinator> MakeCoordinator(Shard& shard,
                                             const std::string& address) {
  Shard* s = &shard;
  auto coordinator = std::make_unique<Coordinator>(
      shard.settings(), address, [s](int rank) { return s->JoinClock(rank); });
  coordinator->SetTakeRound([s] { return s->CheckpointNow(-1); });
  Coordinator* c = coordinator.get();
  shard.SetStatsExtra([c](ShardStats& stats) { c->AddDataStats(stats); });
  return coordinator;
}

}  // namespace tether
