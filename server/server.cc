#include "server/server.h"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>

#include "schema/atomic_file.h"
#include "schema/log.h"
#include "schema/stats_frame.h"
#include "schema/stream.h"
#include "server/health.h"
#include "server/manifest.h"
#include "server/reproduce.h"
#include "server/round_merge.h"

namespace tether {
namespace {

// --ready-file's text: where this shard listens and its dashboard, for a
// launcher or a script, which would otherwise read them from the log.
std::string ReadyFileText(int shard_id, const std::string& listening,
                          const std::string& address,
                          const Dashboard* dashboard) {
  boost::json::object ready;
  ready["shard_id"] = shard_id;
  ready["listen"] = listening;
  ready["advertise"] = address;
  ready["dashboard"] = dashboard != nullptr
                           ? boost::json::value(dashboard->url())
                           : boost::json::value(nullptr);
  ready["pid"] = getpid();
  return boost::json::serialize(ready) + "\n";
}

}  // namespace

Server::Server(ServerOptions options)
    : options_(std::move(options)),
      io_pool_(options_.threads),
      io_(io_pool_.main()),
      acceptor_(asio::make_strand(io_)),
      signals_(io_, SIGINT, SIGTERM) {
  connection_options_.max_frame_bytes = options_.max_frame_bytes;
  session_options_ = connection_options_;
  session_options_.handshake_timeout_ms = options_.handshake_timeout_ms;
  session_options_.idle_timeout_ms = options_.idle_timeout_ms;
  session_options_.spin_us = options_.spin_us;
}

Server::~Server() {
  try {
    Stop();
    MarkStarted();  // after a Start() that failed: nothing more is set up
    io_pool_.Join();
  } catch (const std::exception& e) {
    TETHER_LOG(kError) << "shutdown failed: " << e.what();
  }
}

Status Server::Bind() {
  TETHER_ASSIGN_OR_RETURN(auto bound,
                          Listen(acceptor_, options_.listen, "--listen"));
  boost::system::error_code ec;
  const bool loopback = acceptor_.local_endpoint(ec).address().is_loopback();
  listening_ = bound.ToString();
  address_ = options_.advertise.empty() ? listening_ : options_.advertise;
  if (tls_server_) {
    TETHER_LOG(kInfo) << "TLS: every connection, peers' certificates "
                         "checked against "
                      << options_.tls.ca_file;
  }
  if (auth_key_) {
    TETHER_LOG(kInfo) << "authentication: every peer proves the key in "
                      << options_.auth_key_file;
  } else if (loopback) {
    TETHER_LOG(kInfo) << "authentication: off (no --auth-key-file), so "
                         "loopback connections only";
  } else {
    TETHER_LOG(kWarning) << "authentication: OFF (--insecure): anyone who "
                            "reaches "
                         << bound.ToString() << " can join the run";
  }
  return Status::Ok();
}

Status Server::Start() {
  // A file left by an earlier run must not pass for this one's.
  if (!options_.ready_file.empty()) std::remove(options_.ready_file.c_str());
  if (!options_.auth_key_file.empty()) {
    TETHER_ASSIGN_OR_RETURN(
        auto key, AuthKey::Load(options_.auth_key_file, "--auth-key-file"));
    auth_key_ = key;
  }
  TETHER_ASSIGN_OR_RETURN(tls_server_,
                          MakeTlsContext(options_.tls, TlsRole::kServer));
  TETHER_RETURN_IF_ERROR(Bind());
  io_pool_.Start();
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    TETHER_LOG(kInfo) << "signal " << sig << ": shutting down";
    Stop();
  });
  // Before registering, which may wait long: a probe sees the process up
  // and not yet ready.
  TETHER_RETURN_IF_ERROR(StartHealth());
  if (options_.shard_id == 0) {
    RunSettings settings = options_.run;
    settings.run_id = NewRunId();
    std::optional<ShardSnapshot> resume_from;
    std::vector<int64_t> complete;
    std::string data_progress;
    if (!options_.resume.empty()) {
      TETHER_ASSIGN_OR_RETURN(
          auto picked, PickResumeRound(&settings, &complete, &data_progress));
      resume_from = std::move(picked);
    }
    shard_ = std::make_unique<Shard>(0, settings, options_.max_frame_bytes);
    shard_->SetLimits(options_.max_keys, options_.max_waiting);
    shard_->SetApplyThreads(options_.apply_threads);
    if (!options_.replay.empty()) shard_->ExpectReplay();
    coordinator_ = MakeCoordinator(*shard_, address_);
    coordinator_->OnRoundComplete(
        [this](int64_t round, uint64_t bytes) { RecordRound(round, bytes); });
    if (resume_from) {
      TETHER_RETURN_IF_ERROR(
          shard_->Restore(*resume_from)
              .WithContext("--resume: round " +
                           std::to_string(settings.resume_round)));
      TETHER_LOG(kInfo) << "resuming from round " << settings.resume_round
                        << " (clock " << resume_from->min_clock << ")";
      TETHER_LOG(kInfo) << "shard 0 loaded checkpoint round "
                        << settings.resume_round << " (clock "
                        << resume_from->min_clock << ") from "
                        << options_.data_dir
                        << "; waiting for every shard to load it";
      // Where each epoch's data stood at the round: a chunked run hands
      // out only the rows the round had not trained yet.
      if (!data_progress.empty()) {
        TETHER_RETURN_IF_ERROR(
            coordinator_->RestoreDataProgress(data_progress)
                .WithContext("--resume: round " +
                             std::to_string(settings.resume_round) +
                             " data progress"));
      }
      Coordinator::ResumeHooks hooks;
      hooks.load_local = [this](int64_t round) { return LoadRound(round); };
      hooks.failed = [this](const Status& why) { Fail(why); };
      hooks.resumed = [this](int64_t round, bool taken_back) {
        if (taken_back) {
          // Its own slice is the round's; the others kept theirs. Clocks
          // and membership come back with the workers as they reconnect.
          shard_->ForgetWorkers();
          TETHER_LOG(kWarning)
              << "took the running run back from checkpoint round " << round
              << ": the other shards kept serving it; shard 0's slice is "
                 "the round's, and workers are welcomed back as they "
                 "reconnect";
        } else {
          TETHER_LOG(kInfo) << "resumed from checkpoint round " << round
                            << ": every shard loaded it";
        }
        if (dashboard_) dashboard_->monitor().OnResumed(round);
      };
      coordinator_->StartResume(settings.resume_round, std::move(complete),
                                /*fallback=*/options_.resume == "latest",
                                std::move(hooks));
    }
  } else {
    TETHER_RETURN_IF_ERROR(RegisterWithCoordinator());
  }
  TETHER_RETURN_IF_ERROR(SetUpCheckpoints());
  TETHER_RETURN_IF_ERROR(SetUpRecording());
  if (shard_->settings().shard_restart) {
    shard_->ForgetWorkers();
    TETHER_LOG(kWarning) << "restarted into a running run: workers come back "
                            "as they reconnect";
  }
  if (coordinator_) {
    TETHER_RETURN_IF_ERROR(StartDashboard());
    if (!dashboard_) PublishManifest();
  } else {
    stats_timer_ = std::make_unique<asio::steady_timer>(asio::make_strand(io_));
    SendStats();
  }
  StartCheckpointer();
  eviction_timer_ =
      std::make_unique<asio::steady_timer>(asio::make_strand(io_));
  CheckSilence();
  TETHER_LOG(kInfo) << "shard " << options_.shard_id << " of "
                    << shard_->settings().num_shards << " listening on "
                    << address_;
  if (dashboard_) {
    TETHER_LOG(kInfo) << "dashboard at " << dashboard_->url();
  }
  // On the acceptor's strand, as every other use of it: the I/O threads
  // run already, and Stop() (a failed resume, a signal) closes it there.
  asio::post(acceptor_.get_executor(), [this] { DoAccept(); });
  if (!options_.ready_file.empty()) {
    TETHER_RETURN_IF_ERROR(
        WriteFileAtomically(options_.ready_file,
                            ReadyFileText(options_.shard_id, listening_,
                                          address_, dashboard_.get()))
            .WithContext("--ready-file"));
  }
  MarkStarted();
  return Status::Ok();
}

void Server::MarkStarted() {
  // A Stop() that came while Start() was still setting up (a resume the
  // other shards refused, a signal) left the closing to this point.
  started_ = true;
  if (stopping_) CloseAll();
}

void Server::PublishManifest() {
  RunManifest& manifest = coordinator_->manifest();
  manifest.SetShard(
      0, ShardManifest(options_.argv),
      ShardCommand(options_.argv, listening_, &shard_->settings()));
  Monitor* monitor = dashboard_ ? &dashboard_->monitor() : nullptr;
  const std::string path =
      options_.data_dir.empty() ? "" : options_.data_dir + "/manifest.json";
  manifest.OnChange([monitor, path](const std::string& whole) {
    if (monitor != nullptr) monitor->OnManifest(whole);
    if (path.empty()) return;
    if (Status s = WriteFileAtomically(path, whole); !s.ok()) {
      TETHER_LOG(kWarning) << "run manifest not written: " << s.message();
    }
  });
}

Status Server::StartDashboard() {
  if (!options_.http_enabled) return Status::Ok();
  dashboard_ = Dashboard::Create(io_, options_.dashboard, shard_.get(),
                                 coordinator_.get());
  Monitor* monitor = &dashboard_->monitor();
  monitor->SetCheckpointsEnabled(store_ != nullptr);  // set up just before
  coordinator_->OnShardRound(
      [monitor](const ShardRound& written) { monitor->OnShardRound(written); });
  // Shard 0's command and manifest are in the first page a client gets.
  PublishManifest();
  return dashboard_->Start();
}

void Server::CheckSilence() {
  const int timeout_ms = shard_->settings().worker_timeout_ms;
  if (stopping_) return;
  // A replay that waits this long for its next event stops, saying which.
  shard_->CheckReplay(timeout_ms > 0 ? std::max(timeout_ms, 2000) : 30000);
  if (timeout_ms <= 0 && !shard_->replaying()) return;
  for (int rank : shard_->EvictSilent()) {
    if (coordinator_) coordinator_->ReleaseChunk(rank);
  }
  eviction_timer_->expires_after(std::chrono::milliseconds(
      timeout_ms > 0 ? std::clamp(timeout_ms / 4, 10, 250) : 250));
  eviction_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) CheckSilence();
  });
}

void Server::SendStats() {
  if (stopping_) return;
  coordinator_link_->Send(MakeStatsFrame(0, shard_->Stats()));
  stats_timer_->expires_after(
      std::chrono::milliseconds(options_.dashboard.interval_ms));
  stats_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) SendStats();
  });
}

Status Server::RegisterWithCoordinator() {
  CoordinatorLink::Options o;
  o.coordinator = options_.coordinator;
  o.shard_id = options_.shard_id;
  o.address = address_;
  o.command = ShardCommand(options_.argv, listening_);
  o.manifest = ShardManifest(options_.argv);
  o.connect_timeout_ms = options_.connect_timeout_ms;
  o.connection = connection_options_;
  o.auth_key = auth_key_;
  o.tls = options_.tls;
  CoordinatorLink::Callbacks callbacks;
  callbacks.on_order = [this](const wire::Message& m) {
    OnCoordinatorOrder(m);
  };
  callbacks.on_refused = [this](const Status& why) { Fail(why); };
  coordinator_link_ = std::make_unique<CoordinatorLink>(io_, std::move(o),
                                                        std::move(callbacks));
  TETHER_ASSIGN_OR_RETURN(RunSettings settings, coordinator_link_->Register());
  if (settings.num_shards != options_.run.num_shards) {
    return InvalidArgument("--shards: this shard was started with " +
                           std::to_string(options_.run.num_shards) +
                           " but the coordinator runs " +
                           std::to_string(settings.num_shards));
  }
  shard_ = std::make_unique<Shard>(options_.shard_id, settings,
                                   options_.max_frame_bytes);
  shard_->SetLimits(options_.max_keys, options_.max_waiting);
  shard_->SetApplyThreads(options_.apply_threads);
  if (!options_.replay.empty()) shard_->ExpectReplay();
  return Status::Ok();
}

void Server::OnCoordinatorOrder(const wire::Message& m) {
  if (const auto* load = m.body_as_LoadRound()) {
    (void)LoadAndReport(load->round());
  } else if (const auto* error = m.body_as_Error()) {
    Fail(StatusFromError(*error, "coordinator " + options_.coordinator));
  } else if (const auto* done = m.body_as_RoundComplete()) {
    PruneRounds(done->round());
  } else if (const auto* take = m.body_as_TakeRound()) {
    auto round = shard_->CheckpointNow(take->round());
    if (!round.ok()) OnRoundWritten(take->round(), round.status(), 0);
  }
}

Status Server::OpenStore(CheckpointStore::OpenMode mode) {
  MutexLock lock(&setup_mu_);
  if (store_) return Status::Ok();
  auto store = CheckpointStore::Open(options_.data_dir, mode);
  if (!store.ok()) return store.status().WithContext("--data-dir");
  store_ = std::move(*store);
  return Status::Ok();
}

void Server::StartCheckpointer() {
  MutexLock lock(&setup_mu_);
  if (!store_ || !shard_ || checkpointer_) return;
  // Periodic rounds when checkpoint_every > 0, and rounds on demand.
  checkpointer_ = std::make_unique<Checkpointer>(
      store_.get(),
      [this](int64_t round, const Result<uint64_t>& written, double seconds) {
        OnRoundWritten(round, written, seconds);
      });
  shard_->EnableCheckpoints(checkpointer_.get());
}

Result<ShardSnapshot> Server::ReadRound(int64_t round, const RunSettings& run,
                                        int written_by, bool* resharded) {
  if (resharded != nullptr) *resharded = false;
  const std::string where = "checkpoint dir " + options_.data_dir + ": round " +
                            std::to_string(round);
  Result<ShardSnapshot> own =
      store_ ? store_->ReadShard(round)
             : Result<ShardSnapshot>(NotFound(where + ": no checkpoint store"));
  if (written_by == 0 && own.ok()) written_by = own->settings.num_shards;
  const bool other_count = written_by != 0 && written_by != run.num_shards;
  if (!other_count && (own.ok() || options_.reshard_from.empty())) {
    if (!own.ok()) return own.status();
    std::string mismatch = IdentityMismatch(*own, options_.shard_id, run);
    if (!mismatch.empty()) {
      return InvalidArgument(
          where + " is not shard " + std::to_string(options_.shard_id) +
          "'s slice of this run, so it is not served: " + mismatch);
    }
    return own;
  }
  if (options_.reshard_from.empty()) {
    return InvalidArgument(
        where + " was written by " + std::to_string(written_by) +
        " shards and this run has " + std::to_string(run.num_shards) +
        " (--shards): give --reshard-from with the data dir of every shard "
        "that wrote it (readable from this host), and each shard loads its "
        "part of the round");
  }
  Result<ShardSnapshot> part =
      ReadRoundPart(options_.reshard_from, round, run, options_.shard_id);
  if (!part.ok()) return part.status().WithContext("--reshard-from");
  if (resharded != nullptr) *resharded = true;
  return part;
}

std::string Server::ReshardNote(const ShardSnapshot& snapshot,
                                const RunSettings& run, bool resharded) const {
  const std::string round = "round " + std::to_string(snapshot.round);
  if (resharded) {
    return "resuming " + round + " written by " +
           std::to_string(snapshot.settings.num_shards) + " shards on " +
           std::to_string(run.num_shards) + " shards: shard " +
           std::to_string(options_.shard_id) + " took its part from " +
           std::to_string(options_.reshard_from.size()) +
           " --reshard-from dir(s)";
  }
  if (!options_.reshard_from.empty()) {
    return "--reshard-from ignored: " + round + " was written by " +
           std::to_string(snapshot.settings.num_shards) +
           " shards, as many as this run has";
  }
  return "";
}

Result<std::vector<RoundRecord>> Server::ResumableRounds() {
  Status opened = OpenStore(CheckpointStore::OpenMode::kExisting);
  if (opened.ok()) return store_->CompleteRounds();
  if (opened.code() != Code::kNotFound || options_.reshard_from.empty()) {
    return opened.WithContext("--resume");
  }
  // A new data dir for a resharded run: the old shard 0's records.
  for (const std::string& dir : options_.reshard_from) {
    auto old = CheckpointStore::OpenReadOnly(dir);
    if (!old.ok()) return old.status().WithContext("--reshard-from");
    TETHER_ASSIGN_OR_RETURN(auto records, (*old)->CompleteRounds());
    if (!records.empty()) {
      TETHER_LOG(kInfo) << "--resume: " << options_.data_dir
                        << " holds no checkpoint store; the complete rounds "
                           "are those recorded in "
                        << dir;
      return records;
    }
  }
  return NotFound("--resume: no checkpoint store in " + options_.data_dir +
                  ", and none of the --reshard-from dirs records a complete "
                  "round (shard 0's does)");
}

Result<ShardSnapshot> Server::PickResumeRound(RunSettings* settings,
                                              std::vector<int64_t>* complete,
                                              std::string* data_progress) {
  TETHER_ASSIGN_OR_RETURN(auto rounds, ResumableRounds());
  if (rounds.empty()) {
    return NotFound("--resume: no complete checkpoint round in " +
                    options_.data_dir);
  }
  const bool latest = options_.resume == "latest";
  std::vector<const RoundRecord*> candidates;  // newest first
  for (auto it = rounds.rbegin(); it != rounds.rend(); ++it) {
    if (latest || std::to_string(it->round) == options_.resume) {
      candidates.push_back(&*it);
    }
  }
  if (candidates.empty()) {
    std::string listed;
    for (const RoundRecord& r : rounds) {
      listed += (listed.empty() ? "" : ", ") + std::to_string(r.round);
    }
    return NotFound("--resume: round " + options_.resume +
                    " is not a complete round in " + options_.data_dir +
                    " (complete: " + listed + ")");
  }
  // The run goes on with the round's settings; flags given now either
  // agree, override a tunable one (said in the log), or are refused.
  std::vector<std::string> overridden;
  auto fits = ResumedSettings(candidates[0]->settings, *settings,
                              options_.given, &overridden);
  if (!fits.ok()) {
    return InvalidArgument(
        "--resume: round " + std::to_string(candidates[0]->round) +
        " does not fit this run: " + fits.status().message());
  }
  for (const std::string& o : overridden) {
    TETHER_LOG(kInfo) << "--resume: " << o;
  }
  Status last;
  for (const RoundRecord* record : candidates) {
    auto resumed =
        ResumedSettings(record->settings, *settings, options_.given, nullptr);
    if (!resumed.ok()) {
      last = resumed.status().WithContext("round " +
                                          std::to_string(record->round));
      if (!latest) break;
      continue;
    }
    RunSettings run = *resumed;
    run.run_id = record->settings.run_id;
    run.resume_round = record->round;
    bool resharded = false;
    auto snapshot =
        ReadRound(record->round, run, record->settings.num_shards, &resharded);
    if (!snapshot.ok()) {
      last = snapshot.status();
      if (!latest) break;
      TETHER_LOG(kError) << "--resume latest: shard 0 cannot load round "
                         << record->round << ": " << last.message()
                         << "; trying the previous complete round";
      continue;
    }
    if (record != candidates[0]) {
      TETHER_LOG(kWarning) << "--resume latest: falling back to round "
                           << record->round
                           << ", the newest complete round shard 0 holds "
                              "intact";
    }
    if (std::string note = ReshardNote(*snapshot, run, resharded);
        !note.empty()) {
      TETHER_LOG(kInfo) << note;
    }
    *settings = run;
    *data_progress = record->data;
    for (const RoundRecord& r : rounds) {
      if (r.round <= record->round) complete->push_back(r.round);
    }
    return snapshot;
  }
  return last.WithContext("--resume " + options_.resume +
                          ": shard 0 cannot load " +
                          (latest ? "any complete round" : "the round"));
}

Status Server::LoadRound(int64_t round) {
  // A shard new to a resharded run starts a store of its own.
  TETHER_RETURN_IF_ERROR(OpenStore(options_.reshard_from.empty()
                                       ? CheckpointStore::OpenMode::kExisting
                                       : CheckpointStore::OpenMode::kCreate));
  bool resharded = false;
  TETHER_ASSIGN_OR_RETURN(
      auto snapshot,
      ReadRound(round, shard_->settings(), /*written_by=*/0, &resharded));
  TETHER_RETURN_IF_ERROR(shard_->Restore(snapshot).WithContext(
      "checkpoint dir " + options_.data_dir + ": round " +
      std::to_string(round)));
  StartCheckpointer();
  if (recorder_) {
    // A fallback to an older round: the recording goes on from that one.
    // The old recorder finishes its writes before the file is cut.
    shard_->EnableRecording(nullptr);
    recorder_.reset();
    TETHER_ASSIGN_OR_RETURN(recorder_,
                            Recorder::Open(options_.data_dir, options_.shard_id,
                                           snapshot.record_events));
    shard_->EnableRecording(recorder_.get());
  }
  if (std::string note = ReshardNote(snapshot, shard_->settings(), resharded);
      !note.empty()) {
    TETHER_LOG(kInfo) << note;
  }
  TETHER_LOG(kInfo) << "resuming from round " << round << " (clock "
                    << snapshot.min_clock << ")";
  TETHER_LOG(kInfo) << "shard " << options_.shard_id
                    << " loaded checkpoint round " << round << " (clock "
                    << snapshot.min_clock << ") from " << options_.data_dir;
  return Status::Ok();
}

std::vector<int64_t> Server::IntactRounds() {
  std::vector<int64_t> intact;
  std::set<int64_t> rounds;
  if (store_) {
    auto own = store_->ShardRounds();
    if (own.ok()) rounds.insert(own->begin(), own->end());
  }
  // A resharded run's rounds are in the old shards' dirs (each in all).
  if (!options_.reshard_from.empty()) {
    auto old = CheckpointStore::OpenReadOnly(options_.reshard_from[0]);
    auto listed = old.ok() ? (*old)->ShardRounds()
                           : Result<std::vector<int64_t>>(old.status());
    if (listed.ok()) rounds.insert(listed->begin(), listed->end());
  }
  for (int64_t round : rounds) {
    if (ReadRound(round, shard_->settings()).ok()) intact.push_back(round);
  }
  return intact;
}

Status Server::LoadAndReport(int64_t round) {
  Status loaded = LoadRound(round);
  std::vector<int64_t> intact;
  if (!loaded.ok()) {
    TETHER_LOG(kError) << "cannot load checkpoint round " << round << ": "
                       << loaded.message();
    intact = IntactRounds();
  }
  flatbuffers::FlatBufferBuilder fbb(256);
  auto error = fbb.CreateString(loaded.ok() ? "" : loaded.message());
  auto rounds = fbb.CreateVector(intact);
  coordinator_link_->Send(
      FinishFrame(fbb, wire::CreateResumeResult(fbb, round, error, rounds)));
  return loaded;
}

Status Server::SetUpCheckpoints() {
  const RunSettings& settings = shard_->settings();
  const bool resuming = settings.resume_round >= 0;
  const bool needed = settings.checkpoint_every > 0 || resuming;
  if (!needed && options_.data_dir.empty()) return Status::Ok();
  if (options_.data_dir.empty()) {
    return InvalidArgument(
        "--data-dir: required: this run writes or resumes checkpoints");
  }
  if (coordinator_ || !resuming) {
    // Shard 0 has opened its store already when it resumes.
    return OpenStore(CheckpointStore::OpenMode::kCreate);
  }
  // Whether the run can start from this is the coordinator's call: it may
  // fall back to an older round (LoadRound) or refuse the run (Error). A
  // restarted shard rejoins a running run, which cannot wait for it.
  Status loaded = LoadAndReport(settings.resume_round);
  if (!loaded.ok() && settings.shard_restart) {
    return loaded.WithContext("restarted shard");
  }
  return Status::Ok();
}

Status Server::SetUpRecording() {
  const RunSettings& settings = shard_->settings();
  const uint64_t from = shard_->RestoredRecordPosition();
  const std::string shard = "shard " + std::to_string(options_.shard_id);
  if (!options_.replay.empty()) {
    Result<Recording> read = ReadRecording(RecordingPath(options_.replay));
    if (!read.ok()) return read.status().WithContext("--replay");
    Recording recording = std::move(*read);
    if (recording.shard_id != options_.shard_id) {
      return InvalidArgument(
          "--replay " + options_.replay + ": holds the recording of shard " +
          std::to_string(recording.shard_id) + ", and this is " + shard);
    }
    if (from > recording.events.size()) {
      return InvalidArgument(
          "--replay " + options_.replay + ": the round resumed is at event " +
          std::to_string(from) + " but the recording holds only " +
          std::to_string(recording.events.size()));
    }
    if (recording.torn_tail) {
      TETHER_LOG(kWarning) << "--replay " << options_.replay
                           << ": the recording ends with a torn event (the "
                              "run was killed); replaying the complete ones";
    }
    TETHER_LOG(kInfo) << shard << " replays " << recording.events.size() - from
                      << " recorded events from " << options_.replay
                      << " (from event " << from << ")";
    shard_->StartReplay(std::move(recording.events), from);
  }
  if (settings.record) {
    if (options_.data_dir.empty()) {
      return InvalidArgument("--data-dir: required on " + shard +
                             ": the run records its order (--record)");
    }
    TETHER_ASSIGN_OR_RETURN(
        recorder_, Recorder::Open(options_.data_dir, options_.shard_id, from));
    shard_->EnableRecording(recorder_.get());
    TETHER_LOG(kInfo) << shard << " records the order of pushes and pulls in "
                      << recorder_->path();
  }
  return Status::Ok();
}

void Server::Fail(const Status& why) {
  {
    MutexLock lock(&sessions_mu_);
    if (failure_.ok()) failure_ = why;
  }
  TETHER_LOG(kError) << why.message();
  Stop();
}

void Server::OnRoundWritten(int64_t round, const Result<uint64_t>& written,
                            double seconds) {
  const std::string error = written.ok() ? "" : written.status().message();
  const uint64_t bytes = written.ok() ? *written : 0;
  if (!written.ok()) {
    TETHER_LOG(kError) << "checkpoint round " << round
                       << " not written: " << error;
  }
  if (coordinator_) {
    coordinator_->RoundWritten(
        {options_.shard_id, round, bytes, seconds, error});
    return;
  }
  flatbuffers::FlatBufferBuilder fbb(256);
  auto text = fbb.CreateString(error);
  coordinator_link_->Send(
      FinishFrame(fbb, wire::CreateRoundWritten(fbb, round, options_.shard_id,
                                                bytes, text, seconds)));
}

void Server::RecordRound(int64_t round, uint64_t bytes) {
  RoundRecord record;
  record.round = round;
  record.clock = round;
  record.unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  record.bytes = bytes;
  record.settings = shard_->settings();
  record.workers = shard_->WorkerPositions();
  record.manifest = coordinator_->manifest().Json();
  record.data = coordinator_->SaveDataProgress(record.clock);
  if (Status s = store_->MarkComplete(record); !s.ok()) {
    TETHER_LOG(kError) << "checkpoint round " << round
                       << " written but not recorded: " << s.message();
    return;
  }
  TETHER_LOG(kInfo) << "checkpoint round " << round << " complete (" << bytes
                    << " bytes on " << shard_->settings().num_shards
                    << " shards)";
  if (dashboard_) dashboard_->monitor().OnRoundComplete(round, bytes);
  PruneRounds(round);
}

void Server::PruneRounds(int64_t newest_complete) {
  if (!store_) return;
  if (Status s =
          store_->Prune(shard_->settings().keep_checkpoints, newest_complete);
      !s.ok()) {
    TETHER_LOG(kWarning) << "pruning checkpoints: " << s.message();
  }
}

void Server::DoAccept() {
  acceptor_.async_accept(
      asio::make_strand(io_pool_.Next()),
      [this](const boost::system::error_code& ec, tcp::socket socket) {
        OnAccept(ec, std::move(socket));
      });
}

void Server::OnAccept(const boost::system::error_code& ec, tcp::socket socket) {
  if (stopping_) return;
  if (ec) {
    // A failed accept (out of descriptors, a peer that reset) costs that
    // one connection only.
    TETHER_LOG(kWarning) << "accept failed: " << ec.message();
  } else if (!tls_server_) {
    Admit(std::move(socket));
  } else {
    // The handshake is bounded by --handshake-timeout-ms, as the Hello is.
    AsyncTlsHandshake(std::move(socket), tls_server_, TlsRole::kServer,
                      options_.handshake_timeout_ms,
                      [this](Result<Stream> stream) {
                        if (stopping_) return;
                        if (!stream.ok()) {
                          TETHER_LOG(kWarning) << "refusing a connection: "
                                               << stream.status().message();
                          return;
                        }
                        Admit(std::move(*stream));
                      });
  }
  DoAccept();
}

void Server::Admit(Stream stream) {
  size_t open = 0;
  {
    MutexLock lock(&sessions_mu_);
    std::erase_if(sessions_, [](auto& w) { return w.expired(); });
    open = sessions_.size();
  }
  if (open >= static_cast<size_t>(options_.max_connections)) {
    auto refused =
        std::make_shared<Connection>(std::move(stream), connection_options_);
    TETHER_LOG(kWarning) << "refusing " << refused->peer() << ": " << open
                         << " connections open (--max-connections)";
    refused->Start([](Frame) {}, [](const Status&) {});
    refused->SendAndClose(MakeErrorFrame(
        0, Unavailable("shard " + std::to_string(options_.shard_id) +
                       " serves " + std::to_string(open) +
                       " connections already (--max-connections)")));
    return;
  }
  auto session = std::make_shared<Session>(
      std::move(stream), session_options_, auth_key_, shard_.get(),
      coordinator_.get(), dashboard_ ? &dashboard_->monitor() : nullptr,
      options_.direct_memory);
  {
    MutexLock lock(&sessions_mu_);
    sessions_.push_back(session);
  }
  session->Start();
}

Status Server::StartHealth() {
  if (options_.health == "off") return Status::Ok();
  HttpOptions http = options_.dashboard.http;
  http.listen = options_.health;
  http.tls = TlsOptions{};  // probes speak plain HTTP
  health_ = std::make_unique<HttpServer>(
      io_, http, "",
      [this](const HttpRequest& request) {
        if (auto probe =
                HealthAnswer(request, [this] { return Readiness(); })) {
          return *probe;
        }
        HttpResponse r;
        r.status = 404;
        r.content_type = "text/plain; charset=utf-8";
        r.body = "this port answers /healthz and /readyz only\n";
        return r;
      },
      [] { return WsMessage{}; });
  TETHER_RETURN_IF_ERROR(health_->Bind());
  health_->Start();
  TETHER_LOG(kInfo) << "health probes at " << health_->scheme()
                    << health_->address() << "/healthz and /readyz";
  return Status::Ok();
}

Status Server::Readiness() const {
  if (stopping_) return Unavailable("the shard is stopping");
  if (!started_) {
    // Start() is still setting up: coordinator_ may not be there yet.
    return Unavailable(options_.shard_id == 0
                           ? "the shard is starting"
                           : "registering with the coordinator at " +
                                 options_.coordinator);
  }
  if (coordinator_) return coordinator_->Readiness();
  if (coordinator_link_->lost()) {
    return Unavailable("the coordinator (" + options_.coordinator +
                       ") is out of reach");
  }
  return Status::Ok();
}

Status Server::Run() {
  io_pool_.Join();
  MutexLock lock(&sessions_mu_);
  return failure_;
}

void Server::Stop() {
  if (stopping_.exchange(true)) return;
  // Only once Start() has set up what CloseAll() closes: until then it runs
  // on the I/O threads already, and a Stop() from them waits for it.
  if (started_) CloseAll();
}

void Server::CloseAll() {
  asio::post(acceptor_.get_executor(), [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    signals_.cancel(ignored);
    if (coordinator_link_) coordinator_link_->Close();
    for (auto* timer : {stats_timer_.get(), eviction_timer_.get()}) {
      if (timer)
        asio::post(timer->get_executor(), [timer] { timer->cancel(); });
    }
    if (dashboard_) dashboard_->Stop();
    if (health_) health_->Stop();
    std::vector<std::shared_ptr<Session>> sessions;
    {
      MutexLock lock(&sessions_mu_);
      for (auto& w : sessions_) {
        if (auto s = w.lock()) sessions.push_back(std::move(s));
      }
    }
    for (auto& s : sessions) s->Close();
    io_pool_.Release();
  });
}

}  // namespace tether
