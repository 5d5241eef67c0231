#include "server/session.h"

#include <optional>

#include "schema/log.h"
#include "schema/stats_frame.h"

namespace tether {
namespace {

// What the peer says it was started with; "" when it does not say.
std::string Command(const wire::Hello& hello) {
  return hello.command() ? hello.command()->str() : "";
}

// The peer's part of the run manifest; "" when it does not say.
std::string Manifest(const wire::Hello& hello) {
  return hello.manifest() ? hello.manifest()->str() : "";
}

// The request id of a message a replay orders (EventOf).
uint64_t RequestIdOf(const wire::Message& m) {
  if (const auto* push = m.body_as_Push()) return push->request_id();
  if (const auto* pull = m.body_as_Pull()) return pull->request_id();
  if (const auto* clock = m.body_as_Clock()) return clock->request_id();
  if (const auto* data = m.body_as_DataRequest()) return data->request_id();
  if (const auto* share = m.body_as_ShareRequest()) return share->request_id();
  return 0;
}

// The ends of `stream` over plain TCP; nullopt over TLS or when the socket
// cannot say.
std::optional<SocketEnds> EndsOf(const Stream& stream) {
  if (stream.tls()) return std::nullopt;
  boost::system::error_code local_ec, remote_ec;
  SocketEnds ends;
  ends.local = stream.socket().local_endpoint(local_ec);
  ends.remote = stream.socket().remote_endpoint(remote_ec);
  if (local_ec || remote_ec) return std::nullopt;
  return ends;
}

}  // namespace

Session::Session(Stream stream, const ConnectionOptions& options,
                 std::shared_ptr<const AuthKey> key, Shard* shard,
                 Coordinator* coordinator, Monitor* monitor, bool direct_memory)
    : ends_(EndsOf(stream)),
      direct_memory_(direct_memory),
      shard_(shard),
      coordinator_(coordinator),
      monitor_(monitor),
      conn_(std::make_shared<Connection>(std::move(stream), options)),
      auth_(std::move(key)) {}

void Session::Start() {
  conn_->Start(
      [self = shared_from_this()](Frame frame) {
        self->Deliver(std::move(frame));
      },
      [self = shared_from_this()](const Status& why) { self->OnClosed(why); });
}

void Session::Close() { conn_->Close(); }

void Session::Deliver(Frame frame) {
  shard_->CountTraffic(frame.size(), 0);
  const wire::Message& message = *frame.message();
  if (!hello_done_) {
    if (message.body_type() != wire::Body::Hello) {
      std::string why =
          std::string("expected Hello as the first message, got ") +
          wire::EnumNameBody(message.body_type());
      TETHER_LOG(kWarning) << "refusing " << conn_->peer() << ": " << why;
      return conn_->SendAndClose(
          MakeErrorFrame(0, wire::ErrorCode::HelloRequired, why));
    }
    const wire::Hello& hello = *message.body_as_Hello();
    auto challenge = auth_.OnHello(hello);
    if (!challenge.ok()) return Refuse(challenge.status());
    if (*challenge) return conn_->Send(std::move(**challenge));
    OnHello(hello);
    if (hello_done_) conn_->HandshakeDone();
    return;
  }
  if (message.body_type() == wire::Body::Hello) {
    return conn_->Send(MakeErrorFrame(0, ProtocolError("duplicate Hello")));
  }
  if (const wire::Pull* pull = message.body_as_Pull();
      pull != nullptr && pull->landing() != 0 && peer_.direct_pid == 0) {
    return conn_->Send(MakeErrorFrame(
        pull->request_id(),
        ProtocolError("this connection's pulls are answered with their "
                      "values: the shard does not write into its worker's "
                      "memory")));
  }
  if (const wire::Push* push = message.body_as_Push();
      push != nullptr && IsDirectPush(*push)) {
    // Read from the worker's memory: the frame it stands for goes on as if
    // it had come so.
    Result<Frame> read =
        peer_.direct_pid == 0
            ? Result<Frame>(ProtocolError(
                  "this connection's pushes must carry their floats: the "
                  "shard does not read them from its worker's memory"))
            : ReadDirectPush(peer_.direct_pid, *push,
                             shard_->max_frame_bytes());
    if (!read.ok()) {
      return conn_->Send(MakeErrorFrame(push->request_id(), read.status()));
    }
    frame = std::move(*read);
  }
  const wire::Message& request = *frame.message();
  if (peer_.role == wire::Role::Worker && shard_->replaying()) {
    // A replay takes a worker's pushes, pulls, clocks and data requests in
    // their recorded order; the frame waits with them.
    if (std::optional<RecordedEvent> e = EventOf(peer_.rank, request)) {
      auto held = std::make_shared<Frame>(std::move(frame));
      auto self = shared_from_this();
      return shard_->InOrder(
          *e, RequestIdOf(*held->message()), conn_,
          [self, held] { self->Dispatch(*held->message()); },
          [self, held] { self->Unordered(*held->message()); });
    }
  }
  Dispatch(request);
}

void Session::Unordered(const wire::Message& message) {
  // A chunk request the recorded run answered with nothing yet (an idle
  // worker asks again as timing has it), or a resumed worker's share
  // request, answered from the round's plan.
  if (const auto* data = message.body_as_DataRequest()) {
    flatbuffers::FlatBufferBuilder fbb(64);
    return conn_->Send(FinishFrame(
        fbb, wire::CreateDataChunk(fbb, data->request_id(), 0, 0, 0, 0,
                                   /*finished=*/false)));
  }
  Dispatch(message);
}

void Session::Dispatch(const wire::Message& message) {
  if (const wire::CheckpointNow* now = message.body_as_CheckpointNow()) {
    if (coordinator_ == nullptr) {
      return conn_->Send(MakeErrorFrame(
          now->request_id(),
          ProtocolError("ask shard 0 (the coordinator) for checkpoints")));
    }
    auto round = coordinator_->CheckpointNow();
    if (!round.ok()) {
      return conn_->Send(MakeErrorFrame(now->request_id(), round.status()));
    }
    flatbuffers::FlatBufferBuilder fbb(64);
    return conn_->Send(FinishFrame(
        fbb, wire::CreateCheckpointStarted(fbb, now->request_id(), *round)));
  }
  if (const wire::RoundWritten* w = message.body_as_RoundWritten()) {
    if (peer_.role != wire::Role::Shard || coordinator_ == nullptr) {
      return conn_->Send(MakeErrorFrame(
          0, ProtocolError("only shards report checkpoint rounds")));
    }
    return coordinator_->RoundWritten({peer_.rank, w->round(), w->bytes(),
                                       w->seconds(),
                                       w->error() ? w->error()->str() : ""});
  }
  if (const wire::ResumeResult* r = message.body_as_ResumeResult()) {
    if (peer_.role != wire::Role::Shard || coordinator_ == nullptr) {
      return conn_->Send(MakeErrorFrame(
          0, ProtocolError("only shards report resuming a round")));
    }
    std::vector<int64_t> intact;
    if (r->intact() != nullptr) {
      intact.assign(r->intact()->begin(), r->intact()->end());
    }
    return coordinator_->ShardResumed(
        peer_.rank, r->round(), r->error() ? r->error()->str() : "", intact);
  }
  if (const wire::DataRequest* data = message.body_as_DataRequest()) {
    return OnDataRequest(*data);
  }
  if (const wire::ShareRequest* share = message.body_as_ShareRequest()) {
    return OnShareRequest(*share);
  }
  if (const wire::Leave* leave = message.body_as_Leave()) {
    if (peer_.role != wire::Role::Worker) {
      return conn_->Send(MakeErrorFrame(
          leave->request_id(), ProtocolError("only workers leave a run")));
    }
    // Other shards stop counting it when its connection closes, next.
    if (coordinator_ != nullptr) {
      std::optional<SharePlans::Leftover> unfinished;
      if (leave->epoch() >= 0 && leave->index() >= 0 &&
          leave->index() < leave->members()) {
        unfinished = SharePlans::Leftover{leave->epoch(), leave->index(),
                                          leave->members(), leave->rows_done()};
      }
      coordinator_->WorkerLeaving(peer_.rank, conn_.get(),
                                  leave->reason() ? leave->reason()->str() : "",
                                  leave->finished(), unfinished);
    }
    flatbuffers::FlatBufferBuilder fbb(64);
    return conn_->Send(
        FinishFrame(fbb, wire::CreateAck(fbb, leave->request_id())));
  }
  if (const wire::Stats* stats = message.body_as_Stats()) {
    // Another shard's figures, for the dashboard; nothing to answer.
    if (peer_.role != wire::Role::Shard || coordinator_ == nullptr) {
      return conn_->Send(MakeErrorFrame(
          0, ProtocolError("only shards send Stats to the coordinator")));
    }
    if (monitor_ == nullptr) return;
    ShardStats figures = ReadStats(*stats);
    figures.shard_id = peer_.rank;
    return monitor_->OnShardStats(figures);
  }
  shard_->Handle(peer_, message, conn_);
}

void Session::OnDataRequest(const wire::DataRequest& m) {
  if (peer_.role != wire::Role::Worker || coordinator_ == nullptr) {
    return conn_->Send(MakeErrorFrame(
        m.request_id(),
        ProtocolError("data chunks are for workers, from shard 0")));
  }
  shard_->Heard(peer_.rank);
  auto answer = coordinator_->NextChunk(
      peer_.rank, {m.rows(), m.chunk_rows(), m.epochs(), m.clock(), m.batch()},
      [this, &m] { shard_->Record(ChunkEvent(peer_.rank, m)); });
  if (!answer.ok()) {
    return conn_->Send(MakeErrorFrame(m.request_id(), answer.status()));
  }
  flatbuffers::FlatBufferBuilder fbb(64);
  const auto& c = answer->chunk;
  conn_->Send(FinishFrame(
      fbb, wire::CreateDataChunk(fbb, m.request_id(), c ? c->epoch : 0,
                                 c ? c->index : 0, c ? c->first : 0,
                                 c ? c->count : 0, answer->finished)));
}

void Session::OnShareRequest(const wire::ShareRequest& m) {
  if (peer_.role != wire::Role::Worker || coordinator_ == nullptr) {
    return conn_->Send(MakeErrorFrame(
        m.request_id(),
        ProtocolError("data shares are for workers, from shard 0")));
  }
  shard_->Heard(peer_.rank);
  // Recorded where the coordinator decides, so that a replay asks in the
  // same order.
  auto record = [this, &m] { shard_->Record(ShareEvent(peer_.rank, m)); };
  if (m.leftover()) {
    auto left = coordinator_->TakeLeftover(peer_.rank, m.epoch(), record);
    flatbuffers::FlatBufferBuilder fbb(64);
    return conn_->Send(FinishFrame(
        fbb, wire::CreateShareAnswer(
                 fbb, m.request_id(), left ? left->epoch : m.epoch(),
                 left.has_value(), left ? left->index : -1,
                 left ? left->members : 0, 0, left ? left->first_row : 0)));
  }
  auto answer =
      coordinator_->Share(peer_.rank, m.epoch(), m.clock(), m.batch(), record);
  if (!answer.ok()) {
    return conn_->Send(MakeErrorFrame(m.request_id(), answer.status()));
  }
  flatbuffers::FlatBufferBuilder fbb(64);
  conn_->Send(FinishFrame(
      fbb, wire::CreateShareAnswer(fbb, m.request_id(), m.epoch(),
                                   answer->decided, answer->index,
                                   answer->members, answer->start_clock)));
}

void Session::Refuse(const Status& why) {
  TETHER_LOG(kWarning) << "refusing " << conn_->peer() << ": " << why.message();
  conn_->SendAndClose(MakeErrorFrame(0, why));
}

void Session::OnHello(const wire::Hello& hello) {
  if (hello.protocol_version() != kProtocolVersion) {
    return Refuse(Status(Code::kVersionMismatch,
                         "protocol version " +
                             std::to_string(hello.protocol_version()) +
                             " is not supported; this shard speaks version " +
                             std::to_string(kProtocolVersion)));
  }
  const RunSettings& settings = shard_->settings();
  peer_.role = hello.role();
  peer_.name = hello.client_name() ? hello.client_name()->str() : "";
  switch (hello.role()) {
    case wire::Role::Shard: {
      if (coordinator_ == nullptr) {
        return Refuse(ProtocolError("shard " +
                                    std::to_string(shard_->shard_id()) +
                                    " is not the coordinator"));
      }
      peer_.rank = hello.shard_id();
      hello_done_ = true;
      std::string address = hello.address() ? hello.address()->str() : "";
      // Shard 0's own command is its own to say.
      // With its part of the run manifest, which the dashboard shows;
      // shard 0's own are its own to say.
      if (hello.shard_id() > 0) {
        coordinator_->manifest().SetShard(hello.shard_id(), Manifest(hello),
                                          Command(hello));
      }
      return coordinator_->RegisterShard(
          hello.shard_id(), address, conn_,
          hello.serving_run_id() ? hello.serving_run_id()->str() : "");
    }
    case wire::Role::Worker: {
      if (hello.direct_pid() > 0) TakeDirectOffer(hello.direct_pid());
      peer_.staleness =
          EffectiveStaleness(hello.staleness(), settings.max_staleness);
      int rank = hello.rank();
      if (coordinator_ != nullptr) {
        auto joined = coordinator_->JoinWorker(rank, peer_.staleness, conn_,
                                               hello.clock() >= 0);
        if (!joined.ok()) return Refuse(joined.status());
        rank = *joined;
      } else if (rank < 0 || rank >= RankCapacity(settings)) {
        return Refuse(InvalidArgument(
            "worker rank " + std::to_string(rank) + " is not in 0.." +
            std::to_string(RankCapacity(settings) - 1) +
            "; ask the coordinator for a rank first"));
      }
      peer_.rank = rank;
      hello_done_ = true;
      // Connected first, so the Welcome carries the clock it joins at.
      shard_->SetWorkerConnected(rank, true, peer_.staleness, hello.clock(),
                                 conn_.get());
      // Its part of the run manifest, which the dashboard shows, once it
      // is in the run.
      if (coordinator_ != nullptr) {
        coordinator_->manifest().SetWorker(rank, Manifest(hello),
                                           Command(hello));
      }
      if (coordinator_ == nullptr) {
        conn_->Send(MakeWelcome(rank, peer_.staleness));
      }
      return;
    }
    case wire::Role::Observer:
      hello_done_ = true;
      if (coordinator_ != nullptr) return coordinator_->JoinObserver(conn_);
      return conn_->Send(MakeWelcome(-1, -1));
    default:
      return Refuse(InvalidArgument(
          "unknown role " + std::to_string(static_cast<int>(hello.role()))));
  }
}

void Session::TakeDirectOffer(int pid) {
  Status checked =
      !direct_memory_ ? Unavailable("the shard runs with --direct-memory=false")
      : ends_         ? CheckPeerProcess(pid, *ends_)
              : Unavailable("not a plain TCP connection with known ends");
  if (!checked.ok()) {
    TETHER_LOG(kInfo) << conn_->peer() << " offered its memory (process " << pid
                      << ") for its pushes and pulls; they travel "
                      << "over TCP: " << checked.message();
    return;
  }
  peer_.direct_pid = pid;
  TETHER_LOG(kInfo) << conn_->peer() << " is process " << pid
                    << " on this host: its pushes are read from its memory, "
                       "its pulls written into it";
}

OutFrame Session::MakeWelcome(int rank, int staleness) const {
  return MakeWelcomeFrame(shard_->settings(), shard_->shard_id(), rank,
                          staleness, rank >= 0 ? shard_->WorkerClock(rank) : 0);
}

void Session::OnClosed(const Status& why) {
  if (!why.ok()) {
    TETHER_LOG(kInfo) << "connection from " << conn_->peer()
                      << " ended: " << why.message();
  }
  if (!hello_done_) return;
  if (peer_.role == wire::Role::Worker) {
    shard_->SetWorkerConnected(peer_.rank, false, peer_.staleness, -1,
                               conn_.get());
    if (coordinator_ != nullptr)
      coordinator_->WorkerLeft(peer_.rank, conn_.get());
  } else if (peer_.role == wire::Role::Shard && coordinator_ != nullptr) {
    coordinator_->ShardLeft(peer_.rank, conn_.get());
  }
}

}  // namespace tether
