#include "server/shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "schema/log.h"
#include "schema/stats_frame.h"
#include "schema/wire_values.h"

namespace tether {
namespace {

InitSpec ToInitSpec(const wire::InitSpec* spec) {
  InitSpec init;
  if (spec == nullptr) return init;
  switch (spec->kind()) {
    case wire::InitKind::Zeros:
      init.kind = InitSpec::Kind::kZeros;
      break;
    case wire::InitKind::Uniform:
      init.kind = InitSpec::Kind::kUniform;
      break;
    case wire::InitKind::Normal:
      init.kind = InitSpec::Kind::kNormal;
      break;
    case wire::InitKind::Constant:
      init.kind = InitSpec::Kind::kConstant;
      break;
    case wire::InitKind::Provided:
      init.kind = InitSpec::Kind::kProvided;
      break;
    default:
      init.kind = InitSpec::Kind::kZeros;
  }
  init.scale = spec->scale();
  return init;
}

OutFrame MakeDefineAck(uint64_t request_id, uint32_t id) {
  flatbuffers::FlatBufferBuilder fbb(64);
  return FinishFrame(fbb, wire::CreateDefineAck(fbb, request_id, id));
}

template <typename T>
std::vector<T> ToVector(const flatbuffers::Vector<T>* v) {
  if (v == nullptr) return {};
  return std::vector<T>(v->begin(), v->end());
}

// Set while a replayed message is handled in its recorded turn: a pull is
// answered then, as it was in the recorded run, without waiting for the
// bound.
thread_local bool t_in_turn = false;

template <typename T>
std::span<const T> ToSpan(const flatbuffers::Vector<T>* v) {
  if (v == nullptr) return {};
  return {v->data(), v->size()};
}

}  // namespace

Shard::Outbox::~Outbox() {
  for (Reply& reply : replies_) {
    if (reply.landing) {
      // A pull held while its connection closed: its worker may be gone,
      // and its process id taken by another process. Nothing is written.
      if (reply.conn->closed()) continue;
      reply.frame = WriteLanding(*reply.landing, std::move(reply.frame));
    }
    reply.conn->Send(std::move(reply.frame));
  }
}

void Shard::Outbox::Add(std::vector<Reply> replies) {
  if (replies_.empty()) {
    replies_ = std::move(replies);
    return;
  }
  for (Reply& reply : replies) replies_.push_back(std::move(reply));
}

Shard::Shard(int shard_id, RunSettings settings, size_t max_frame_bytes)
    : shard_id_(shard_id),
      settings_(settings),
      max_frame_bytes_(max_frame_bytes),
      store_(settings.seed, settings.block_size, settings.optimizer),
      clocks_(settings.num_workers, settings.backup_workers),
      workers_(RankCapacity(settings)),
      reports_(settings.num_workers) {}

int64_t Shard::NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}

void Shard::Heard(int rank) {
  if (!workers_.valid(rank)) return;
  workers_.Heard(rank, NowMs());
  if (!workers_.any_evicted() || replaying()) return;
  Outbox out;
  MutexLock lock(&mu_);
  // An evicted worker that speaks again (it was stopped, or its network
  // came back) rejoins at the others' clock.
  if (!workers_.Unevict(rank)) return;
  const int64_t was = clocks_.clock(rank);
  JoinLocked(rank, -1, out);
  TETHER_LOG(kWarning) << "worker " << rank
                       << " is back after its eviction: rejoins at clock "
                       << clocks_.clock(rank) << " (it was at " << was << ")";
}

void Shard::JoinLocked(int rank, int64_t clock, Outbox& out) {
  // A rank beyond --workers joins a running run: it starts at the slowest
  // live worker's clock, as a rejoin does.
  const bool beyond = rank >= settings_.num_workers;
  if (rank >= clocks_.num_workers()) {
    clocks_.Grow(rank + 1);
    reports_.resize(clocks_.num_workers());
  }
  // The first connection at the start of a run joins where it is: workers
  // connect one after another, and the first ones may have clocked already.
  const bool rejoin = workers_.Join(rank) || beyond;
  const int64_t join =
      std::max(rejoin ? clocks_.JoinClock(rank) : clocks_.clock(rank), clock);
  std::vector<ClockTable::Release> released;
  const bool moved = join > clocks_.clock(rank);
  if (moved) released = clocks_.Advance(rank, join);
  // A worker that joins a running run learns its clock from shard 0's
  // Welcome, which may be older than the clock it joins at here (the
  // slowest worker moved on in between): its first Clock may then not be
  // after this one, and the ack tells it where it stands.
  if (moved || rejoin) workers_.SetMovedForward(rank, true);
  auto more = clocks_.SetLive(rank, true);
  released.insert(released.end(), std::make_move_iterator(more.begin()),
                  std::make_move_iterator(more.end()));
  RecordLocked({RecordedEvent::Kind::kJoin, rank, clocks_.clock(rank)});
  ClocksMovedLocked(std::move(released), out);
}

void Shard::SetLimits(uint64_t max_keys, int max_waiting) {
  max_keys_ = max_keys;
  max_waiting_ = max_waiting;
}

void Shard::SetApplyThreads(int threads) {
  MutexLock lock(&mu_);
  apply_pool_ = std::make_unique<ApplyPool>(threads);
}

void Shard::SetStatsExtra(std::function<void(ShardStats&)> extra) {
  stats_extra_ = std::move(extra);
}

std::vector<int> Shard::EvictSilent() {
  std::vector<int> evicted;
  const int timeout_ms = settings_.worker_timeout_ms;
  // A replay takes joins and leaves from its recording.
  if (timeout_ms <= 0 || replaying()) return evicted;
  Outbox out;
  MutexLock lock(&mu_);
  // Evicting one worker changes no other's liveness or clock, so deciding
  // all first and then releasing pulls one by one is as evicting in turn.
  for (const WorkerTable::Evicted& e :
       workers_.EvictSilent(NowMs(), timeout_ms, [this](int r) {
         mu_.AssertHeld();  // called by EvictSilent, under mu_
         return clocks_.live(r);
       })) {
    evicted.push_back(e.rank);
    TETHER_LOG(kWarning) << "worker " << e.rank << " evicted: silent for "
                         << e.silent_ms << " ms (--worker-timeout-ms "
                         << timeout_ms << "); clock " << clocks_.clock(e.rank)
                         << " no longer holds back the others";
    RecordLocked({RecordedEvent::Kind::kLeave, e.rank});
    ClocksMovedLocked(clocks_.SetLive(e.rank, false), out);
  }
  return evicted;
}

int64_t Shard::JoinClock(int rank) {
  MutexLock lock(&mu_);
  if (rank < 0) return 0;
  // Not seen yet: it will take the slowest live worker's clock.
  if (rank >= clocks_.num_workers()) return clocks_.min_clock();
  return workers_.joined(rank) || rank >= settings_.num_workers
             ? clocks_.JoinClock(rank)
             : clocks_.clock(rank);
}

void Shard::Handle(const PeerInfo& peer, const wire::Message& message,
                   const std::shared_ptr<Connection>& conn) {
  if (peer.role == wire::Role::Worker) Heard(peer.rank);
  switch (message.body_type()) {
    case wire::Body::DefineTensor:
      return OnDefineTensor(peer, *message.body_as_DefineTensor(), *conn);
    case wire::Body::DefineTable:
      return OnDefineTable(peer, *message.body_as_DefineTable(), *conn);
    case wire::Body::Pull:
      return OnPull(peer, *message.body_as_Pull(), conn);
    case wire::Body::Push:
      return OnPush(peer, *message.body_as_Push(), *conn);
    case wire::Body::Clock:
      return OnClock(peer, *message.body_as_Clock(), *conn);
    case wire::Body::Heartbeat: {
      flatbuffers::FlatBufferBuilder fbb(64);
      auto* hb = message.body_as_Heartbeat();
      return conn->Send(FinishFrame(
          fbb, wire::CreateHeartbeat(fbb, hb->request_id(), hb->unix_ms(),
                                     workers_.connected_count(),
                                     settings_.num_workers)));
    }
    case wire::Body::WorkerReport:
      return OnReport(peer, *message.body_as_WorkerReport(), *conn);
    case wire::Body::StatsRequest:
      return conn->Send(MakeStatsFrame(
          message.body_as_StatsRequest()->request_id(), Stats()));
    default:
      return conn->Send(MakeErrorFrame(
          0, ProtocolError(std::string("unexpected message ") +
                           wire::EnumNameBody(message.body_type()))));
  }
}

// Observers (tools, evaluation) attach to a model by name and shape; only
// workers must agree on how it starts.
void Shard::OnDefineTensor(const PeerInfo& peer, const wire::DefineTensor& m,
                           Connection& conn) {
  const bool same_init = peer.role == wire::Role::Worker;
  std::vector<uint64_t> shape = ToVector(m.shape());
  Result<uint32_t> id = [&] {
    MutexLock lock(&mu_);
    return store_.DefineTensor(m.name()->str(), shape, ToInitSpec(m.init()),
                               same_init);
  }();
  if (!id.ok()) return conn.Send(MakeErrorFrame(m.request_id(), id.status()));
  conn.Send(MakeDefineAck(m.request_id(), *id));
}

void Shard::OnDefineTable(const PeerInfo& peer, const wire::DefineTable& m,
                          Connection& conn) {
  const bool same_init = peer.role == wire::Role::Worker;
  Result<uint32_t> id = [&] {
    MutexLock lock(&mu_);
    return store_.DefineTable(m.name()->str(), m.dim(), ToInitSpec(m.init()),
                              same_init);
  }();
  if (!id.ok()) return conn.Send(MakeErrorFrame(m.request_id(), id.status()));
  conn.Send(MakeDefineAck(m.request_id(), *id));
}

void Shard::OnPull(const PeerInfo& peer, const wire::Pull& m,
                   const std::shared_ptr<Connection>& conn) {
  std::vector<uint32_t> blocks = ToVector(m.blocks());
  std::vector<uint64_t> keys = ToVector(m.keys());
  const bool is_worker = peer.role == wire::Role::Worker;
  Outbox out;
  MutexLock lock(&mu_);
  // A worker's pull is recorded when it is answered, error or weights.
  auto record = [&, rank = peer.rank, tensor = m.tensor()] {
    mu_.AssertHeld();
    if (is_worker) {
      RecordLocked(
          {RecordedEvent::Kind::kPull, rank, clocks_.clock(rank), tensor});
    }
  };
  if (Status s =
          CheckReplySizeLocked(m.sparse(), m.tensor(), blocks, keys.size());
      !s.ok()) {
    record();
    return out.Add(conn, MakeErrorFrame(m.request_id(), s));
  }
  const Result<WireDtype> wanted = FromWire(m.dtype());
  if (!wanted.ok()) {
    record();
    return out.Add(conn, MakeErrorFrame(m.request_id(),
                                        wanted.status().WithContext("pull")));
  }
  const WireDtype dtype = *wanted;
  // Not held for the bound first: a provided tensor's provider may be the
  // very worker the bound waits for.
  if (Status s = store_.Ready(m.tensor(), blocks, keys); !s.ok()) {
    record();
    return out.Add(conn, MakeErrorFrame(m.request_id(), s));
  }
  int64_t clock = is_worker ? clocks_.clock(peer.rank) : 0;
  if (is_worker && m.clock() > clock) {
    // A prefetch for the next clock is held as a pull at that clock.
    if (m.clock() > clock + 1) {
      record();
      return out.Add(
          conn, MakeErrorFrame(
                    m.request_id(),
                    InvalidArgument(
                        "pull for clock " + std::to_string(m.clock()) +
                        " from a worker at clock " + std::to_string(clock) +
                        ": a prefetch may be for the next clock only")));
    }
    clock = m.clock();
  }
  ++pulls_;
  int staleness = peer.staleness;
  if (settings_.record && checkpointer_ != nullptr &&
      settings_.checkpoint_every > 0 && clock >= next_round_clock_) {
    // A recorded run's rounds are clean cuts: no worker reads past a round
    // before every worker has reached it, so a replay can start from the
    // round with every worker at its clock.
    const int64_t to_round = clock - next_round_clock_;
    if (staleness < 0 || staleness > to_round) {
      staleness = static_cast<int>(to_round);
    }
  }
  // In a replay the recording says when to answer: now.
  if (is_worker && !t_in_turn && !clocks_.Ready(clock, staleness)) {
    int& held = waiting_by_conn_[conn.get()];
    if (held >= max_waiting_) {
      return out.Add(
          conn, MakeErrorFrame(
                    m.request_id(),
                    InvalidArgument(
                        std::to_string(held) +
                        " pulls of this connection are already waiting for "
                        "the slowest worker (--max-waiting)")));
    }
    ++held;
    // Answered by the Clock that lets the slowest worker catch up; the
    // reply is built then, so it carries every update up to that moment.
    clocks_.Wait(
        clock, staleness,
        [this, conn, id = m.request_id(), tensor = m.tensor(),
         sparse = m.sparse(), dtype, blocks = std::move(blocks),
         keys = std::move(keys), rank = peer.rank, pid = peer.direct_pid,
         landing = m.landing()] {
          mu_.AssertHeld();  // run by ClocksMovedLocked
          if (--waiting_by_conn_[conn.get()] <= 0) {
            waiting_by_conn_.erase(conn.get());
          }
          RecordLocked(
              {RecordedEvent::Kind::kPull, rank, clocks_.clock(rank), tensor});
          std::shared_ptr<const Landing> landed;
          OutFrame reply = BuildPullReplyLocked(
              id, tensor, sparse, dtype, blocks, keys, pid, landing, &landed);
          bytes_out_ += reply->size();
          released_.push_back({conn, std::move(reply), std::move(landed)});
        });
    return;
  }
  record();
  std::shared_ptr<const Landing> landed;
  OutFrame reply =
      BuildPullReplyLocked(m.request_id(), m.tensor(), m.sparse(), dtype,
                           blocks, keys, peer.direct_pid, m.landing(), &landed);
  bytes_out_ += reply->size();
  out.Add(conn, std::move(reply), std::move(landed));
}

OutFrame Shard::BuildPullReplyLocked(uint64_t request_id, uint32_t tensor,
                                     bool sparse, WireDtype dtype,
                                     const std::vector<uint32_t>& blocks,
                                     const std::vector<uint64_t>& keys, int pid,
                                     uint64_t landing,
                                     std::shared_ptr<const Landing>* landed) {
  const bool f32 = dtype == WireDtype::kF32;
  if (sparse) {
    auto dim = store_.TableDim(tensor);
    if (!dim.ok()) return MakeErrorFrame(request_id, dim.status());
    size_t n = keys.size() * *dim;
    auto fbb = MakeBuilder(256 + n * WireBytes(dtype));
    float* rows = nullptr;
    flatbuffers::Offset<flatbuffers::Vector<float>> rows_offset;
    std::vector<float>& wide = wire_scratch_;
    if (f32) {
      rows_offset = fbb.CreateUninitializedVector(n, &rows);
    } else {
      wide.resize(n);
      rows = wide.data();
    }
    Status s = store_.ReadRows(tensor, keys, std::span<float>(rows, n));
    if (!s.ok()) return MakeErrorFrame(request_id, s);
    const NarrowedValues narrow = AddNarrowed(
        fbb, f32 ? std::span<const float>() : std::span<const float>(rows, n),
        dtype);
    wire::PullReplyBuilder b(fbb);
    b.add_request_id(request_id);
    b.add_rows(rows_offset);
    b.add_rows_bf16(narrow.bf16);
    b.add_rows_q8(narrow.q8);
    b.add_rows_q8_scale(narrow.q8_scale);
    b.add_min_clock(clocks_.min_clock());
    return FinishFrame(fbb, b.Finish());
  }
  // Only the metadata is built here; the weights go out straight from the
  // store, kept unchanged by ShareBlock until the reply has been written.
  // Narrowed (bfloat16, int8) they are converted into the frame.
  auto fbb = MakeBuilder(
      1024 + blocks.size() * (settings_.block_size * WireBytes(dtype) + 32));
  FrameSplicer splicer(fbb);
  std::vector<flatbuffers::Offset<wire::Block>> out;
  out.reserve(blocks.size());
  std::shared_ptr<Landing> lands;
  if (landing != 0 && pid > 0 && f32 && landed != nullptr) {
    lands = std::make_shared<Landing>();
    lands->pid = pid;
    lands->request_id = request_id;
    lands->address = landing;
  }
  for (uint32_t index : blocks) {
    auto shared = store_.ShareBlock(tensor, index);
    if (!shared.ok()) return MakeErrorFrame(request_id, shared.status());
    if (lands) {
      // Written into the worker after the lock (WriteLanding).
      const auto count = static_cast<uint32_t>(shared->values.size());
      lands->pieces.push_back({std::move(shared->owner), shared->values});
      out.push_back(wire::CreateBlock(fbb, index, 0, 0, 0, count, true));
      continue;
    }
    if (!f32) {
      const NarrowedValues narrow = AddNarrowed(fbb, shared->values, dtype);
      out.push_back(wire::CreateBlock(fbb, index, 0, narrow.bf16, 0, 0, false,
                                      narrow.q8, narrow.q8_scale));
      continue;
    }
    auto values = splicer.AddFloats(shared->values, std::move(shared->owner));
    out.push_back(wire::CreateBlock(fbb, index, values));
  }
  auto blocks_offset = fbb.CreateVector(out);
  wire::PullReplyBuilder b(fbb);
  b.add_request_id(request_id);
  b.add_blocks(blocks_offset);
  b.add_min_clock(clocks_.min_clock());
  if (lands) *landed = std::move(lands);
  return splicer.Finish(b.Finish());
}

Status Shard::CheckReplySizeLocked(bool sparse, uint32_t tensor,
                                   const std::vector<uint32_t>& blocks,
                                   size_t keys) {
  if (keys > max_keys_) {
    return InvalidArgument("pull of " + std::to_string(keys) +
                           " keys: more than --max-keys " +
                           std::to_string(max_keys_));
  }
  uint64_t floats = 0;
  if (sparse) {
    TETHER_ASSIGN_OR_RETURN(auto dim, store_.TableDim(tensor));
    floats = uint64_t{dim} * keys;
  } else {
    TETHER_ASSIGN_OR_RETURN(auto size, store_.TensorSize(tensor));
    const uint64_t bs = settings_.block_size;
    for (uint32_t b : blocks) {
      uint64_t first = uint64_t{b} * bs;
      if (first < size) floats += std::min(bs, size - first);
    }
  }
  // Per block or row: a table, an offset and a vector length.
  uint64_t bytes = floats * sizeof(float) + (blocks.size() + keys) * 16 + 1024;
  if (bytes > max_frame_bytes_) {
    return InvalidArgument(
        "pull of " + std::to_string(sparse ? keys : blocks.size()) +
        (sparse ? " rows" : " blocks") + " would need a reply of " +
        std::to_string(bytes) + " bytes, over the frame limit of " +
        std::to_string(max_frame_bytes_) + "; pull in smaller requests");
  }
  return Status::Ok();
}

Status Shard::CheckDensePush(const wire::Push& m,
                             std::vector<ParamStore::BlockGrad>* grads) {
  grads->clear();
  TETHER_ASSIGN_OR_RETURN(auto size, store_.TensorSize(m.tensor()));
  if (m.blocks() == nullptr) return InvalidArgument("push carries no blocks");
  const uint64_t bs = settings_.block_size;
  const uint64_t num_blocks = (size + bs - 1) / bs;
  for (const wire::Block* block : *m.blocks()) {
    if (block->index() >= num_blocks) {
      return InvalidArgument("push to block " + std::to_string(block->index()) +
                             " past the end (" + std::to_string(num_blocks) +
                             " blocks)");
    }
    uint64_t expected = std::min(bs, size - block->index() * bs);
    uint64_t got = block->values() ? block->values()->size() : 0;
    if (got != expected) {
      return InvalidArgument("push to block " + std::to_string(block->index()) +
                             " has " + std::to_string(got) +
                             " values, expected " + std::to_string(expected));
    }
    const std::span<const float> values = ToSpan(block->values());
    TETHER_ASSIGN_OR_RETURN(
        const float bound,
        CheckFinite(m, values, " block " + std::to_string(block->index()),
                    block->index() * bs));
    grads->push_back({block->index(), values, bound});
  }
  return Status::Ok();
}

Result<float> Shard::CheckFinite(const wire::Push& m,
                                 std::span<const float> values,
                                 const std::string& part,
                                 uint64_t first_index) {
  const float bound = MaxMagnitude(values);
  if (std::isfinite(bound)) return bound;
  const size_t bad = FirstNonFinite(values);
  return Status(Code::kNonFinite,
                (m.assign() ? "assign to tensor '" : "push to tensor '") +
                    store_.NameOf(m.tensor()) + "'" + part +
                    " (read at clock " + std::to_string(m.read_clock()) +
                    ") holds " + (std::isnan(values[bad]) ? "NaN" : "Inf") +
                    " at element " + std::to_string(first_index + bad) +
                    "; refused, nothing applied");
}

Status Shard::CheckSparsePush(const wire::Push& m) {
  TETHER_ASSIGN_OR_RETURN(auto dim, store_.TableDim(m.tensor()));
  uint64_t keys = m.keys() ? m.keys()->size() : 0;
  if (keys > max_keys_) {
    return InvalidArgument("push of " + std::to_string(keys) +
                           " keys: more than --max-keys " +
                           std::to_string(max_keys_));
  }
  uint64_t rows = m.rows() ? m.rows()->size() : 0;
  if (rows != keys * dim) {
    return InvalidArgument("sparse push has " + std::to_string(rows) +
                           " values for " + std::to_string(keys) +
                           " keys of width " + std::to_string(dim));
  }
  if (rows == 0) return Status::Ok();
  return CheckFinite(m, {m.rows()->data(), m.rows()->size()}, "", 0).status();
}

namespace {

// A block's narrowed values (bfloat16 or int8), if it carries any.
NarrowedView Narrowed(const wire::Block& block) {
  return {block.bf16(), block.q8(), block.q8_scale()};
}

// Whether a push carries narrowed values (a client with wire dtype bf16 or
// int8).
bool CarriesNarrowed(const wire::Push& m) {
  if (m.rows_bf16() != nullptr || m.rows_q8() != nullptr) return true;
  if (m.blocks() == nullptr) return false;
  for (const wire::Block* block : *m.blocks()) {
    if (Narrowed(*block).present()) return true;
  }
  return false;
}

// The same push with its narrowed values widened to f32 (a block or rows
// that carry both keep their f32 values), as a finished buffer whose root
// is the Push. kInvalidArgument for int8 values without their scales.
Result<flatbuffers::DetachedBuffer> WidenPush(const wire::Push& m) {
  const NarrowedView rows_narrowed{m.rows_bf16(), m.rows_q8(),
                                   m.rows_q8_scale()};
  size_t floats = rows_narrowed.size();
  if (m.blocks() != nullptr) {
    for (const wire::Block* block : *m.blocks()) {
      floats += Narrowed(*block).size();
    }
  }
  // Room for the widened values, so that the builder never grows, drawn
  // from the buffer pool (fresh memory would page-fault on every push).
  flatbuffers::FlatBufferBuilder fbb =
      MakeBuilder(1024 + floats * sizeof(float) +
                  (m.blocks() ? m.blocks()->size() * 32 : 0) +
                  (m.keys() ? m.keys()->size() * 8 : 0) +
                  (m.rows() ? m.rows()->size() * sizeof(float) : 0));
  using Floats = flatbuffers::Offset<flatbuffers::Vector<float>>;
  auto widen = [&fbb](const flatbuffers::Vector<float>* values,
                      const NarrowedView& narrow,
                      const std::string& what) -> Result<Floats> {
    if (values != nullptr) {
      return fbb.CreateVector(values->data(), values->size());
    }
    if (!narrow.present()) return Floats();
    float* wide = nullptr;
    auto offset = fbb.CreateUninitializedVector(narrow.size(), &wide);
    TETHER_RETURN_IF_ERROR(Widen(narrow, wide, what));
    return offset;
  };
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::Block>>>
      blocks;
  if (m.blocks() != nullptr) {
    std::vector<flatbuffers::Offset<wire::Block>> out;
    out.reserve(m.blocks()->size());
    for (const wire::Block* block : *m.blocks()) {
      TETHER_ASSIGN_OR_RETURN(
          Floats values, widen(block->values(), Narrowed(*block),
                               "push block " + std::to_string(block->index())));
      out.push_back(wire::CreateBlock(fbb, block->index(), values));
    }
    blocks = fbb.CreateVector(out);
  }
  auto keys = m.keys() == nullptr
                  ? flatbuffers::Offset<flatbuffers::Vector<uint64_t>>()
                  : fbb.CreateVector(m.keys()->data(), m.keys()->size());
  TETHER_ASSIGN_OR_RETURN(Floats rows,
                          widen(m.rows(), rows_narrowed, "sparse push"));
  fbb.Finish(wire::CreatePush(fbb, m.request_id(), m.tensor(), m.read_clock(),
                              blocks, keys, rows, m.sparse(), m.provide(), 0, 0,
                              0, m.assign()));
  return fbb.Release();
}

}  // namespace

void Shard::OnPush(const PeerInfo& peer, const wire::Push& m,
                   Connection& conn) {
  if (CarriesNarrowed(m)) {
    // Widened on arrival: everything past here (checks, the optimizer, a
    // recording's digest) sees f32 values.
    Result<flatbuffers::DetachedBuffer> wide = WidenPush(m);
    if (!wide.ok()) {
      return conn.Send(MakeErrorFrame(m.request_id(), wide.status()));
    }
    return OnPush(peer, *flatbuffers::GetRoot<wire::Push>(wide->data()), conn);
  }
  // The digest of its values is taken before the lock.
  std::optional<RecordedEvent> recorded;
  if (settings_.record && peer.role == wire::Role::Worker) {
    recorded = PushEvent(peer.rank, m);
  }
  MutexLock lock(&mu_);
  if (recorded) RecordLocked(*recorded);
  Status s = m.sparse() ? CheckSparsePush(m) : CheckDensePush(m, &block_grads_);
  if (!s.ok()) {
    CountNonFiniteLocked(peer, s);
    lock.Unlock();
    return conn.Send(MakeErrorFrame(m.request_id(), s));
  }
  if (m.provide() || m.assign()) {
    s = m.provide() ? ProvideLocked(m) : AssignLocked(m);
    lock.Unlock();
    if (!s.ok()) return conn.Send(MakeErrorFrame(m.request_id(), s));
    flatbuffers::FlatBufferBuilder fbb(64);
    return conn.Send(FinishFrame(
        fbb,
        wire::CreatePushAck(fbb, m.request_id(), 0, peer.direct_pid != 0)));
  }
  std::vector<uint32_t> blocks;
  if (!m.sparse()) {
    for (const wire::Block* block : *m.blocks())
      blocks.push_back(block->index());
  }
  if (s = store_.Ready(m.tensor(), blocks, ToSpan(m.keys())); !s.ok()) {
    lock.Unlock();
    return conn.Send(MakeErrorFrame(m.request_id(), s));
  }
  int64_t staleness = 0;
  if (peer.role == wire::Role::Worker && m.read_clock() >= 0) {
    staleness = std::max<int64_t>(0, clocks_.max_clock() - m.read_clock());
  }
  if (settings_.reject_staleness >= 0 &&
      staleness > settings_.reject_staleness) {
    ++rejected_pushes_;
    lock.Unlock();
    return conn.Send(MakeErrorFrame(
        m.request_id(),
        Status(Code::kStalePush,
               "push read at clock " + std::to_string(m.read_clock()) + " is " +
                   std::to_string(staleness) +
                   " clocks stale; this run rejects more than " +
                   std::to_string(settings_.reject_staleness))));
  }
  // Staleness-aware rate: a stale gradient moves the weights less.
  const float lr_scale = settings_.staleness_lr
                             ? 1.0f / (1.0f + static_cast<float>(staleness))
                             : 1.0f;
  if (peer.role == wire::Role::Worker && peer.staleness == 0) {
    if (clocks_.clock(peer.rank) < clocks_.closed_clock()) {
      // Its clock closed without it (backup workers, or it was evicted):
      // the update it belongs to has been applied.
      ++late_pushes_;
    } else {
      StageLocked(peer.rank, m, block_grads_);
    }
  } else if (m.sparse()) {
    std::span<const uint64_t> keys;
    std::span<const float> rows;
    if (m.keys() != nullptr) keys = {m.keys()->data(), m.keys()->size()};
    if (m.rows() != nullptr) rows = {m.rows()->data(), m.rows()->size()};
    s = store_.ApplyRows(m.tensor(), keys, rows, lr_scale);
  } else {
    // An update refused as overflowing leaves its block unchanged; the
    // push's other blocks still apply, and the worker hears of the first.
    s = store_.ApplyBlocks(m.tensor(), block_grads_, lr_scale,
                           apply_pool_.get());
  }
  ++pushes_;
  ++staleness_histogram_[std::min<int64_t>(staleness, kStalenessBuckets - 1)];
  staleness_sum_ += staleness;
  CountNonFiniteLocked(peer, s);
  lock.Unlock();
  if (!s.ok()) return conn.Send(MakeErrorFrame(m.request_id(), s));
  flatbuffers::FlatBufferBuilder fbb(64);
  conn.Send(FinishFrame(fbb, wire::CreatePushAck(fbb, m.request_id(), staleness,
                                                 peer.direct_pid != 0)));
}

Status Shard::ProvideLocked(const wire::Push& m) {
  Status s;
  if (m.sparse()) {
    s = store_.ProvideRows(m.tensor(), ToSpan(m.keys()), ToSpan(m.rows()));
  } else {
    for (const wire::Block* block : *m.blocks()) {
      s = store_.ProvideBlock(m.tensor(), block->index(),
                              ToSpan(block->values()));
      if (!s.ok()) break;
    }
  }
  return s;
}

Status Shard::AssignLocked(const wire::Push& m) {
  if (m.sparse()) {
    return InvalidArgument("assign to table '" + store_.NameOf(m.tensor()) +
                           "': only dense tensors take assigned values");
  }
  for (const ParamStore::BlockGrad& block : block_grads_) {
    TETHER_RETURN_IF_ERROR(
        store_.AssignBlock(m.tensor(), block.block, block.grad));
  }
  return Status::Ok();
}

void Shard::CountNonFiniteLocked(const PeerInfo& peer, const Status& s) {
  if (s.code() != Code::kNonFinite) return;
  uint64_t count = 1;
  if (peer.role == wire::Role::Worker && peer.rank >= 0 &&
      peer.rank < static_cast<int>(reports_.size())) {
    count = ++reports_[peer.rank].nonfinite_pushes;
  }
  // A diverged worker may push NaN every step: its count tells the rest.
  if (count == 1 || count % 1000 == 0) {
    TETHER_LOG(kWarning) << (peer.role == wire::Role::Worker
                                 ? "worker " + std::to_string(peer.rank)
                                 : std::string("an observer"))
                         << " (" << count
                         << " non-finite so far): " << s.message();
  }
}

void Shard::OnClock(const PeerInfo& peer, const wire::Clock& m,
                    Connection& conn) {
  if (peer.role != wire::Role::Worker) {
    return conn.Send(MakeErrorFrame(m.request_id(),
                                    ProtocolError("only workers have clocks")));
  }
  int64_t clock = 0;
  int64_t min_clock = 0;
  Status s;
  {
    Outbox out;  // the replies of the pulls this releases, sent first
    MutexLock lock(&mu_);
    RecordLocked({RecordedEvent::Kind::kClock, peer.rank, m.clock()});
    clock = clocks_.clock(peer.rank);
    min_clock = clocks_.min_clock();
    if (m.clock() <= clock && workers_.moved_forward(peer.rank)) {
      // The shard moved this worker ahead (it rejoined, or backup workers
      // closed its clock without it); it learns its clock from the ack.
    } else if (m.clock() <= clock) {
      s = InvalidArgument("clock " + std::to_string(m.clock()) + " of worker " +
                          std::to_string(peer.rank) +
                          " is not after its current clock " +
                          std::to_string(clock));
    } else {
      // Released pulls build their replies now, under the lock, so each
      // sees exactly the updates applied before this tick, staged ones
      // included.
      workers_.SetMovedForward(peer.rank, false);
      ClocksMovedLocked(clocks_.Advance(peer.rank, m.clock()), out);
      // With backup workers, one that is behind a closed clock skips
      // ahead: its pushes for closed clocks would be dropped anyway.
      const int64_t closed = clocks_.closed_clock();
      if (settings_.backup_workers > 0 && clocks_.clock(peer.rank) < closed) {
        workers_.SetMovedForward(peer.rank, true);
        ClocksMovedLocked(clocks_.Advance(peer.rank, closed), out);
      }
      clock = clocks_.clock(peer.rank);
      min_clock = clocks_.min_clock();
    }
  }
  if (!s.ok()) return conn.Send(MakeErrorFrame(m.request_id(), s));
  flatbuffers::FlatBufferBuilder fbb(64);
  conn.Send(FinishFrame(
      fbb, wire::CreateClockAck(fbb, m.request_id(), min_clock, clock)));
}

void Shard::SetWorkerConnected(int rank, bool connected, int staleness,
                               int64_t clock, const Connection* conn) {
  Outbox out;
  MutexLock lock(&mu_);
  if (!workers_.valid(rank)) return;
  if (connected) {
    if (workers_.Connect(rank, conn, staleness, NowMs())) {
      TETHER_LOG(kWarning) << "worker " << rank
                           << " is back after its eviction: it reconnected";
    }
    // A replay joins it when the recording says (from a round: the first
    // time it connects).
    if (replaying()) {
      if (join_on_connect_ && joined_in_replay_.insert(rank).second) {
        JoinLocked(rank, clock, out);
      }
      return;
    }
    return JoinLocked(rank, clock, out);
  }
  if (!workers_.Leave(rank, conn, staleness, NowMs())) return;
  if (replaying()) return;
  RecordLocked({RecordedEvent::Kind::kLeave, rank});
  ClocksMovedLocked(clocks_.SetLive(rank, false), out);
}

void Shard::ForgetWorkers() {
  MutexLock lock(&mu_);
  for (int r = 0; r < clocks_.num_workers(); ++r) {
    if (!workers_.connected(r)) (void)clocks_.SetLive(r, false);
  }
}

void Shard::ClocksMovedLocked(std::vector<ClockTable::Release> released,
                              Outbox& out) {
  ApplyStagedLocked();
  MaybeCheckpointLocked();
  for (auto& release : released) release();
  out.Add(std::exchange(released_, {}));
}

void Shard::EnableCheckpoints(Checkpointer* checkpointer) {
  MutexLock lock(&mu_);
  checkpointer_ = checkpointer;
  const int64_t k = settings_.checkpoint_every;
  if (k > 0) next_round_clock_ = (clocks_.min_clock() / k + 1) * k;
}

void Shard::MaybeCheckpointLocked() {
  const int64_t k = settings_.checkpoint_every;
  if (checkpointer_ == nullptr || k <= 0) return;
  const int64_t min_clock = clocks_.min_clock();
  if (min_clock < next_round_clock_) return;
  // Rounds are named by the clock they capture: every shard takes the
  // same round at the same clock, each from its own view of the clocks.
  const int64_t round = min_clock / k * k;
  next_round_clock_ = round + k;
  // A round that comes while the previous one is written is dropped (the
  // next comes soon enough), except in a recorded run: its rounds are where
  // a replay resumes and what it is compared with, so which of them exist
  // must not depend on how fast a disk was. It waits its turn instead.
  const auto if_busy = recorder_ != nullptr ? Checkpointer::IfBusy::kQueue
                                            : Checkpointer::IfBusy::kDrop;
  if (Status s = TakeRoundLocked(round, if_busy); !s.ok()) {
    TETHER_LOG(kWarning) << "skipping checkpoint round " << round << ": "
                         << s.message();
  }
}

Status Shard::TakeRoundLocked(int64_t round, Checkpointer::IfBusy if_busy) {
  if (checkpointer_ == nullptr) {
    return Unavailable("shard " + std::to_string(shard_id_) +
                       " has no --data-dir to write checkpoints into");
  }
  // The round it was restored from is on disk already. (Rounds taken here
  // are not written twice either: Checkpointer::Submit.)
  if (round == restored_round_) return Status::Ok();
  ShardSnapshot snapshot;
  snapshot.round = round;
  snapshot.shard_id = shard_id_;
  snapshot.min_clock = clocks_.min_clock();
  snapshot.settings = settings_;
  for (int r = 0; r < clocks_.num_workers(); ++r) {
    snapshot.worker_clocks.push_back(clocks_.clock(r));
  }
  if (recorder_ != nullptr) {
    // The round holds the recording's position only once the events
    // before it are on disk: a resumed recording goes on from there.
    if (Status s = recorder_->Sync(); !s.ok()) return s;
    snapshot.record_events = recorder_->events();
  }
  store_.Snapshot(&snapshot.tensors, &snapshot.tables);
  if (!checkpointer_->Submit(std::move(snapshot), if_busy)) {
    return Unavailable(if_busy == Checkpointer::IfBusy::kDrop
                           ? "the previous round is still being written"
                           : "two earlier rounds are still being written");
  }
  return Status::Ok();
}

Result<int64_t> Shard::CheckpointNow(int64_t round) {
  MutexLock lock(&mu_);
  if (round < 0) round = clocks_.min_clock();
  TETHER_RETURN_IF_ERROR(TakeRoundLocked(round, Checkpointer::IfBusy::kQueue));
  return round;
}

Status Shard::Restore(const ShardSnapshot& snapshot) {
  MutexLock lock(&mu_);
  TETHER_RETURN_IF_ERROR(store_.Restore(snapshot.tensors, snapshot.tables));
  // Workers resume together from the round's clock: that is the state the
  // weights hold (with s = 0 exactly, later pushes were still staged). From
  // fresh clocks, since a resume that falls back loads an older round.
  clocks_.Restart(snapshot.min_clock);
  restored_events_ = snapshot.record_events;
  restored_round_ = snapshot.round;
  const int64_t k = settings_.checkpoint_every;
  if (k > 0) next_round_clock_ = snapshot.min_clock + k;
  return Status::Ok();
}

std::vector<WorkerPosition> Shard::WorkerPositions() {
  MutexLock lock(&mu_);
  std::vector<WorkerPosition> out;
  for (int r = 0; r < clocks_.num_workers(); ++r) {
    out.push_back(
        {r, clocks_.clock(r), reports_[r].epoch, reports_[r].samples});
  }
  return out;
}

void Shard::StageLocked(int rank, const wire::Push& m,
                        std::span<const ParamStore::BlockGrad> grads) {
  StagedPush p;
  p.rank = rank;
  p.tensor = m.tensor();
  p.sparse = m.sparse();
  if (m.sparse()) {
    if (m.keys()) p.keys.assign(m.keys()->begin(), m.keys()->end());
    const std::span<const float> rows = ToSpan(m.rows());
    p.values = PooledFloats(rows.size());
    std::copy(rows.begin(), rows.end(), p.values.data());
  } else {
    size_t floats = 0;
    for (const ParamStore::BlockGrad& g : grads) floats += g.grad.size();
    p.values = PooledFloats(floats);
    p.blocks.reserve(grads.size());
    float* at = p.values.data();
    for (const ParamStore::BlockGrad& g : grads) {
      p.blocks.push_back({g.block, g.bound});
      at = std::copy(g.grad.begin(), g.grad.end(), at);
    }
  }
  staged_[clocks_.clock(rank)].push_back(std::move(p));
}

void Shard::ApplyStagedLocked() {
  auto end = staged_.lower_bound(clocks_.closed_clock());
  for (auto it = staged_.begin(); it != end; ++it) {
    std::vector<StagedPush>& pushes = it->second;
    std::stable_sort(pushes.begin(), pushes.end(),
                     [](const StagedPush& a, const StagedPush& b) {
                       return a.rank < b.rank;
                     });
    for (const StagedPush& p : pushes) {
      Status s;
      if (p.sparse) {
        s = store_.ApplyRows(p.tensor, p.keys, p.values.span());
      } else {
        auto size = store_.TensorSize(p.tensor);  // checked when staged
        const uint64_t bs = settings_.block_size;
        size_t at = 0;
        std::vector<ParamStore::BlockGrad>& grads = block_grads_;
        grads.clear();
        for (size_t i = 0; i < p.blocks.size() && size.ok(); ++i) {
          const auto [block, bound] = p.blocks[i];
          size_t n = std::min(bs, *size - uint64_t{block} * bs);
          grads.push_back({block, std::span(p.values.data() + at, n), bound});
          at += n;
        }
        s = store_.ApplyBlocks(p.tensor, grads, 1.0f, apply_pool_.get());
      }
      if (!s.ok()) {
        if (s.code() == Code::kNonFinite) ++reports_[p.rank].nonfinite_pushes;
        TETHER_LOG(kError) << "staged push of worker " << p.rank
                           << " failed: " << s.message();
      }
    }
  }
  staged_.erase(staged_.begin(), end);
}

int64_t Shard::WorkerClock(int rank) {
  MutexLock lock(&mu_);
  return rank >= 0 && rank < clocks_.num_workers() ? clocks_.clock(rank) : 0;
}

void Shard::OnReport(const PeerInfo& peer, const wire::WorkerReport& m,
                     Connection& conn) {
  if (peer.role != wire::Role::Worker) {
    return conn.Send(MakeErrorFrame(
        m.request_id(), ProtocolError("only workers send reports")));
  }
  {
    MutexLock lock(&mu_);
    ++reports_received_;
    ShardStats::Worker& r = reports_[peer.rank];
    r.epoch = m.epoch();
    r.samples = m.samples();
    r.loss = m.loss();
    r.samples_per_s = m.samples_per_s();
    if (m.test_accuracy() >= 0) {
      r.test_accuracy = m.test_accuracy();
      r.test_loss = m.test_loss();
    }
    if (m.device()) r.device = m.device()->str();
    if (m.host()) r.host = m.host()->str();
    r.wait_fraction = m.wait_fraction();
    r.done = m.done();
  }
  flatbuffers::FlatBufferBuilder fbb(64);
  conn.Send(FinishFrame(fbb, wire::CreateAck(fbb, m.request_id())));
}

void Shard::EnableRecording(Recorder* recorder) {
  MutexLock lock(&mu_);
  recorder_ = recorder;
  if (recorder_ == nullptr) return;
  for (const RecordedEvent& e : early_events_) recorder_->Add(e);
  early_events_.clear();
}

void Shard::Record(const RecordedEvent& e) {
  MutexLock lock(&mu_);
  RecordLocked(e);
}

uint64_t Shard::RestoredRecordPosition() {
  MutexLock lock(&mu_);
  return restored_events_;
}

void Shard::StartReplay(std::vector<RecordedEvent> events, size_t start) {
  MutexLock lock(&replay_mu_);
  replayer_ =
      std::make_unique<Replayer>(std::move(events), start, [this](uint32_t id) {
        MutexLock lock(&mu_);
        return store_.NameOf(id);
      });
  {
    Outbox out;
    MutexLock lock(&mu_);
    // From a round, the recording has no joins for the workers already in
    // the run: each joins at the round's clock when it connects (those
    // connected already, now).
    join_on_connect_ = start > 0;
    for (int r = 0; join_on_connect_ && r < clocks_.num_workers(); ++r) {
      if (workers_.connected(r) && joined_in_replay_.insert(r).second) {
        JoinLocked(r, -1, out);
      }
    }
  }
  replay_moved_ms_ = NowMs();
  replay_moved_at_ = start;
  replay_pending_ = false;
  replaying_.store(true, std::memory_order_release);
  // What came while the replay was being set up, in the order it came.
  std::vector<std::function<void()>> now;
  for (Pending& p : std::exchange(pending_, {})) {
    if (auto run = TakeInOrderLocked(std::move(p)))
      now.push_back(std::move(run));
  }
  DrainReplayLocked();
  lock.Unlock();
  for (auto& run : now) run();
}

void Shard::ExpectReplay() {
  MutexLock lock(&replay_mu_);
  replay_pending_ = true;
  replaying_.store(true, std::memory_order_release);
}

void Shard::InOrder(const RecordedEvent& got, uint64_t request_id,
                    const std::shared_ptr<Connection>& conn,
                    std::function<void()> run,
                    std::function<void()> unordered) {
  MutexLock lock(&replay_mu_);
  if (!replayer_ && replay_pending_) {
    // The shard is still setting its replay up: the message waits for it.
    pending_.push_back(
        {got, request_id, conn, std::move(run), std::move(unordered)});
    return;
  }
  std::function<void()> now = TakeInOrderLocked(
      {got, request_id, conn, std::move(run), std::move(unordered)});
  DrainReplayLocked();
  lock.Unlock();
  if (now) now();
}

std::function<void()> Shard::TakeInOrderLocked(Pending p) {
  // Any message is progress: the replay waits for the one it needs from
  // the time the last one came.
  replay_heard_ = true;
  replay_moved_ms_ = NowMs();
  if (!replayer_) {
    // The replay ended (or stopped) since the session looked.
    if (!replay_stopped_.ok()) {
      p.conn->Send(MakeErrorFrame(p.request_id, replay_stopped_));
      return {};
    }
    return std::move(p.run);
  }
  if (!replayer_->Expects(p.got)) return std::move(p.unordered);
  auto refuse = [conn = p.conn, id = p.request_id](const Status& why) {
    conn->Send(MakeErrorFrame(id, why));
  };
  if (Status s = replayer_->Arrive(p.got, std::move(p.run), refuse); !s.ok()) {
    StopReplayLocked(s);
    refuse(replay_stopped_);
  }
  return {};
}

void Shard::DrainReplayLocked() {
  while (replayer_) {
    if (replayer_->done()) {
      TETHER_LOG(kInfo) << "replay: all " << replayer_->size()
                        << " recorded events of shard " << shard_id_
                        << " replayed; the run goes on as it comes";
      std::vector<Replayer::Step> held = replayer_->TakeHeld();
      replayer_.reset();
      replaying_.store(false, std::memory_order_release);
      for (Replayer::Step& h : held) h.run();
      return;
    }
    std::optional<Replayer::Step> step = replayer_->Next();
    if (!step) return;
    const RecordedEvent& e = step->event;
    if (step->run) {
      t_in_turn = true;
      step->run();
      t_in_turn = false;
    } else {
      Outbox out;
      MutexLock lock(&mu_);
      if (e.kind == RecordedEvent::Kind::kJoin) {
        JoinLocked(e.rank, e.clock, out);
      } else {
        RecordLocked(e);
        ClocksMovedLocked(clocks_.SetLive(e.rank, false), out);
      }
    }
  }
}

void Shard::StopReplayLocked(const Status& why) {
  if (!replayer_) return;
  const Status stopped(why.code(), "replay diverged on shard " +
                                       std::to_string(shard_id_) + ": " +
                                       why.message());
  replay_stopped_ = stopped;
  TETHER_LOG(kError) << stopped.message();
  for (Replayer::Step& h : replayer_->TakeHeld()) h.refuse(stopped);
  // replaying() stays true: what workers send from now on is refused.
  replayer_.reset();
}

void Shard::CheckReplay(int stall_ms) {
  MutexLock lock(&replay_mu_);
  if (!replayer_) return;
  const int64_t now = NowMs();
  if (replayer_->position() != replay_moved_at_) {
    replay_moved_at_ = replayer_->position();
    replay_moved_ms_ = now;
    return;
  }
  // Not before the first worker's message: workers may take long to start
  // (loading their data).
  if (!replay_heard_ || now - replay_moved_ms_ < stall_ms) return;
  std::string name;
  {
    MutexLock data_lock(&mu_);
    name = DescribeEvent(replayer_->waiting_for(), [this](uint32_t id) {
      mu_.AssertHeld();
      return store_.NameOf(id);
    });
  }
  StopReplayLocked(Status(Code::kTimeout,
                          "waited " + std::to_string(now - replay_moved_ms_) +
                              " ms at event " +
                              std::to_string(replayer_->position()) + " for " +
                              name + ", which has not come"));
}

void Shard::CountTraffic(uint64_t bytes_in, uint64_t bytes_out) {
  MutexLock lock(&mu_);
  bytes_in_ += bytes_in;
  bytes_out_ += bytes_out;
}

ShardStats Shard::Stats() {
  ShardStats stats = OwnStats();
  if (stats_extra_) stats_extra_(stats);
  return stats;
}

ShardStats Shard::OwnStats() {
  MutexLock lock(&mu_);
  ShardStats stats;
  ParamStore::Counts counts = store_.counts();
  stats.shard_id = shard_id_;
  stats.tensors = counts.tensors;
  stats.dense_blocks = counts.dense_blocks;
  stats.sparse_rows = counts.sparse_rows;
  stats.bytes = counts.bytes;
  stats.pushes = pushes_;
  stats.pulls = pulls_;
  stats.rejected_pushes = rejected_pushes_;
  stats.waiting_pulls = clocks_.waiting();
  stats.bytes_in = bytes_in_;
  stats.bytes_out = bytes_out_;
  stats.min_clock = clocks_.min_clock();
  stats.staleness_histogram.assign(staleness_histogram_.begin(),
                                   staleness_histogram_.end());
  stats.staleness_sum = staleness_sum_;
  stats.reports = reports_received_;
  stats.evictions = workers_.evictions();
  stats.late_pushes = late_pushes_;
  stats.workers = reports_;
  for (int r = 0; r < clocks_.num_workers(); ++r) {
    ShardStats::Worker& w = stats.workers[r];
    w.rank = r;
    w.clock = clocks_.clock(r);
    w.staleness = workers_.staleness_bound(r);
    w.connected = workers_.connected(r);
    w.live = clocks_.live(r);
  }
  return stats;
}

}  // namespace tether
