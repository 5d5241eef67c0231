#include "worker/shard_link.h"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <future>
#include <optional>
#include <unordered_map>

#include "schema/log.h"

namespace tether::client_internal {
namespace {

uint64_t RequestIdOf(const wire::Message& m) {
  switch (m.body_type()) {
    case wire::Body::DefineAck:
      return m.body_as_DefineAck()->request_id();
    case wire::Body::PullReply:
      return m.body_as_PullReply()->request_id();
    case wire::Body::PushAck:
      return m.body_as_PushAck()->request_id();
    case wire::Body::ClockAck:
      return m.body_as_ClockAck()->request_id();
    case wire::Body::Heartbeat:
      return m.body_as_Heartbeat()->request_id();
    case wire::Body::Stats:
      return m.body_as_Stats()->request_id();
    case wire::Body::Ack:
      return m.body_as_Ack()->request_id();
    case wire::Body::CheckpointStarted:
      return m.body_as_CheckpointStarted()->request_id();
    case wire::Body::DataChunk:
      return m.body_as_DataChunk()->request_id();
    case wire::Body::ShareAnswer:
      return m.body_as_ShareAnswer()->request_id();
    case wire::Body::Error:
      return m.body_as_Error()->request_id();
    default:
      return 0;  // Welcome answers the Hello, request 0
  }
}

wire::InitKind ToWire(InitKind kind) {
  switch (kind) {
    case InitKind::kZeros:
      return wire::InitKind::Zeros;
    case InitKind::kUniform:
      return wire::InitKind::Uniform;
    case InitKind::kNormal:
      return wire::InitKind::Normal;
    case InitKind::kConstant:
      return wire::InitKind::Constant;
    case InitKind::kProvided:
      return wire::InitKind::Provided;
  }
  return wire::InitKind::Zeros;
}

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Result<WelcomeInfo> ParseWelcome(const wire::Message* m, const Status& error,
                                 const std::string& peer) {
  if (m == nullptr) return error;
  const wire::Welcome* w = m->body_as_Welcome();
  if (w == nullptr || w->config() == nullptr) {
    return ProtocolError(peer + " answered Hello with " +
                         wire::EnumNameBody(m->body_type()));
  }
  WelcomeInfo info;
  info.rank = w->rank();
  info.staleness = w->staleness();
  info.clock = w->clock();
  info.seed = w->config()->seed();
  info.num_shards = w->config()->num_shards();
  info.num_workers = w->config()->num_workers();
  info.block_size = w->config()->block_size();
  info.heartbeat_ms = w->config()->heartbeat_ms();
  info.silence_ms = w->config()->worker_timeout_ms();
  info.resume_round = w->config()->resume_round();
  info.record = w->config()->record();
  if (w->shard_map() && w->shard_map()->shards()) {
    for (const wire::ShardInfo* s : *w->shard_map()->shards()) {
      info.shard_addresses.push_back(s->address() ? s->address()->str() : "");
    }
  }
  return info;
}

// Worded as ConnectWithRetry words its errors (a single try).
Status DialError(const std::string& what, const HostPort& hp,
                 const boost::system::error_code& ec) {
  const std::string head =
      "cannot reach " + what + " at " + hp.ToString() + ": ";
  if (ec == asio::error::host_not_found) {
    return Unavailable(head + "the host name '" + hp.host +
                       "' does not resolve (" + ec.message() + ")");
  }
  return Unavailable(head + ec.message() + " (tried for 0.00 s)");
}

}  // namespace

// One shard's connection and the requests waiting for its answers. Owned
// by shared_ptr: the handlers of its own asynchronous operations (the
// heartbeat loop, a handshake step, reconnection) hold it while pending,
// those of its connection hold it weakly.
struct ShardLinks::Link {
  Link(asio::io_context& context, int id, std::string addr)
      : shard_id(id),
        address(std::move(addr)),
        io(context),
        strand(asio::make_strand(io)),
        timer(strand),
        backoff(strand),
        deadline(strand),
        resolver(strand) {}

  // Constant after construction.
  const int shard_id;
  const std::string address;
  asio::io_context& io;  // its connection's, in the pool
  // Heartbeats, handshake steps and reconnection run here, one at a
  // time; other threads enter only by posting to it.
  const asio::strand<asio::io_context::executor_type> strand;

  Mutex mu;
  struct Pending {
    ReplyHandler handler;
    std::chrono::steady_clock::time_point sent;
  };
  std::shared_ptr<Connection> conn TETHER_GUARDED_BY(mu);
  std::unordered_map<uint64_t, Pending> pending TETHER_GUARDED_BY(mu);
  bool closed TETHER_GUARDED_BY(mu) = false;
  int generation TETHER_GUARDED_BY(mu) = 0;  // one per connection
  // Reconnecting failed for good.
  bool gave_up TETHER_GUARDED_BY(mu) = false;
  // Lost, being dialled again.
  bool reconnecting TETHER_GUARDED_BY(mu) = false;
  // The heartbeat loop runs.
  bool ticking TETHER_GUARDED_BY(mu) = false;
  // Hello sent on this conn.
  bool greeted TETHER_GUARDED_BY(mu) = false;

  // On the strand.
  asio::steady_timer timer;     // heartbeats and the slow-request watchdog
  asio::steady_timer backoff;   // the wait before the next dial
  asio::steady_timer deadline;  // of the handshake step in flight
  tcp::resolver resolver;
  std::optional<tcp::socket> dialing;  // a connect in flight
  uint64_t step = 0;  // the step in flight; a late answer to an older one
                      // (timed out, superseded) is dropped
  int64_t last_warned_ms = 0;
  int64_t tick_due_ms = 0;  // when the armed heartbeat timer should fire
  // The reconnection in progress (workers).
  std::chrono::steady_clock::time_point lost_at;
  int attempt = 0;
  int delay_ms = 100;
  int64_t waited_ms = 0;  // from lost_at to the current attempt's dial

  std::atomic<int64_t> last_heard_ms{0};  // steady clock, any frame
  // From the shard's latest heartbeat: workers connected to it, of the
  // run's --workers; -1 until it says.
  std::atomic<int> workers_joined{-1};
  std::atomic<int> workers_expected{-1};
  std::string Describe() const {
    return "shard " + std::to_string(shard_id) + " at " + address;
  }
};

OutFrame DefineFrame(uint64_t request, const std::string& name, bool sparse,
                     const std::vector<uint64_t>& shape, uint32_t dim,
                     Init init) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto name_offset = fbb.CreateString(name);
  auto init_offset = wire::CreateInitSpec(fbb, ToWire(init.kind), init.scale);
  return sparse ? FinishFrame(fbb,
                              wire::CreateDefineTable(fbb, request, name_offset,
                                                      dim, init_offset))
                : FinishFrame(fbb, wire::CreateDefineTensor(
                                       fbb, request, name_offset,
                                       fbb.CreateVector(shape), init_offset));
}

ShardLinks::ShardLinks(const ClientOptions& options,
                       std::shared_ptr<const AuthKey> auth_key,
                       std::shared_ptr<asio::ssl::context> tls,
                       std::atomic<int64_t>& clock, Definitions definitions)
    : options_(options),
      auth_key_(std::move(auth_key)),
      tls_(std::move(tls)),
      clock_(clock),
      definitions_(std::move(definitions)),
      io_pool_(options.io_threads, /*assisted=*/true),
      heartbeat_ms_(options.heartbeat_ms) {
  io_pool_.Start();
}

ShardLinks::~ShardLinks() {
  // Every step of a link's asynchronous work checks `stopping_` first, so
  // once Shut has run on its strand nothing new starts there; the I/O
  // threads then run what is left and return.
  stopping_ = true;
  for (auto& link : links_) {
    asio::post(link->strand, [link] { Shut(*link); });
  }
  io_pool_.Release();
  io_pool_.Join();
}

Result<WelcomeInfo> ShardLinks::Join(int shard_id, const std::string& address,
                                     int rank, int timeout_ms) {
  TETHER_ASSIGN_OR_RETURN(auto link, Open(shard_id, address));
  return Handshake(link, rank, timeout_ms);
}

void ShardLinks::Welcomed(int rank, int heartbeat_ms, int silence_ms) {
  rank_ = rank;
  silence_ms_ = silence_ms;
  if (heartbeat_ms > 0) heartbeat_ms_ = heartbeat_ms;
  welcomed_ = true;
}

void ShardLinks::Send(int shard, uint64_t id, OutFrame frame,
                      ReplyHandler handler) {
  Send(*links_[shard], id, std::move(frame), std::move(handler));
}

void ShardLinks::RequestStop(const std::string& reason) {
  {
    MutexLock lock(&stop_mu_);
    if (stop_requested_) return;  // the first reason stands
    stop_reason_ = reason;
  }
  stop_requested_ = true;
}

std::string ShardLinks::stop_reason() const {
  MutexLock lock(&stop_mu_);
  return stop_reason_;
}

Result<std::shared_ptr<ShardLinks::Link>> ShardLinks::Open(
    int shard_id, const std::string& address) {
  TETHER_ASSIGN_OR_RETURN(
      auto hp, ParseHostPort(address, "shard " + std::to_string(shard_id)));
  std::string what =
      shard_id == 0 ? "the coordinator" : "shard " + std::to_string(shard_id);
  asio::io_context& io = io_pool_.Next();
  TETHER_ASSIGN_OR_RETURN(
      auto socket,
      ConnectWithRetry(io, hp, what, options_.connect_timeout_ms, tls_));
  auto link = std::make_shared<Link>(io, shard_id, address);
  ConnectionOptions co;
  co.max_frame_bytes = options_.max_frame_bytes;
  links_.push_back(link);
  Attach(link, std::make_shared<Connection>(std::move(socket), co));
  return link;
}

void ShardLinks::Attach(const std::shared_ptr<Link>& link,
                        std::shared_ptr<Connection> conn) {
  int generation;
  {
    MutexLock lock(&link->mu);
    generation = ++link->generation;
    link->conn = conn;
    link->closed = false;
    link->greeted = false;
    link->last_heard_ms = SteadyMs();
  }
  std::weak_ptr<Link> weak = link;
  conn->Start(
      [this, weak](Frame frame) {
        if (auto l = weak.lock()) OnFrame(*l, frame);
      },
      [this, weak, generation](const Status& why) {
        if (auto l = weak.lock()) OnClose(l, generation, why);
      });
}

template <typename T>
void ShardLinks::Ask(const std::shared_ptr<Link>& link, uint64_t id,
                     OutFrame frame, int timeout_ms, Parser<T> parse,
                     Status timeout, std::function<void(Result<T>)> done) {
  const uint64_t step = ++link->step;
  std::weak_ptr<Link> weak = link;
  // From any thread: the answer, a failure or the deadline, first one wins.
  auto finish = [weak, step, done = std::move(done)](Result<T> result) {
    std::shared_ptr<Link> l = weak.lock();
    if (!l) return;
    asio::post(l->strand,
               [l, step, done, result = std::move(result)]() mutable {
                 if (l->step != step) return;
                 ++l->step;
                 l->deadline.cancel();
                 done(std::move(result));
               });
  };
  if (stopping_) {
    // Shut may have run: arm nothing that would hold the I/O threads up.
    return finish(Unavailable(link->Describe() + ": the client is closing"));
  }
  link->deadline.expires_after(std::chrono::milliseconds(timeout_ms));
  link->deadline.async_wait(
      [finish, timeout](const boost::system::error_code& ec) {
        if (!ec) finish(timeout);
      });
  Send(
      *link, id, std::move(frame),
      [finish, parse = std::move(parse)](const wire::Message* m,
                                         const Status& error) {
        finish(parse(m, error));
      },
      /*rejoining=*/true);
}

void ShardLinks::Greet(const std::shared_ptr<Link>& link, int rank,
                       int timeout_ms, WelcomeHandler done) {
  HelloFields fields;
  fields.role = options_.observer ? wire::Role::Observer : wire::Role::Worker;
  fields.rank = rank;
  fields.staleness = options_.staleness;
  fields.name = options_.name;
  // Only the coordinator lists the run's processes.
  if (link->shard_id == 0) {
    fields.command = options_.command;
    fields.manifest = options_.manifest;
  }
  // A worker coming back after a lost connection says its clock, so the
  // shard does not hold it (and everyone) back at an older one.
  fields.clock = welcomed_ ? clock_.load() : -1;
  if (!options_.observer && options_.direct_memory && tls_ == nullptr) {
    fields.direct_pid = static_cast<int>(::getpid());
  }
  auto auth = std::make_shared<PeerAuth>(auth_key_);
  OutFrame hello = auth->First(std::move(fields));
  if (!auth_key_) return SendHello(link, std::move(hello), timeout_ms, done);
  // The shard challenges at once (before the coordinator waits for the
  // others to join), so this waits no longer than a connect.
  const std::string peer = link->Describe();
  const int wait_ms = std::max(options_.connect_timeout_ms, 1000);
  Ask<OutFrame>(
      link, 0, std::move(hello), wait_ms,
      [auth, peer](const wire::Message* m,
                   const Status& error) -> Result<OutFrame> {
        if (m == nullptr) return error;
        if (const wire::Challenge* c = m->body_as_Challenge()) {
          return auth->Answer(*c, peer);
        }
        Status refused = auth->CheckWelcome(peer);
        if (!refused.ok()) return refused;
        return ProtocolError(peer + " answered Hello with " +
                             wire::EnumNameBody(m->body_type()));
      },
      Status(Code::kTimeout, "no Challenge from " + peer + " after " +
                                 std::to_string(wait_ms / 1000) + " s"),
      [this, link, timeout_ms, done](Result<OutFrame> second) {
        if (!second.ok()) return done(second.status());
        SendHello(link, std::move(*second), timeout_ms, done);
      });
}

void ShardLinks::SendHello(const std::shared_ptr<Link>& link, OutFrame hello,
                           int timeout_ms, WelcomeHandler done) {
  const std::string peer = link->Describe();
  const std::string why = link->shard_id == 0 && !options_.observer
                              ? " (are all --workers started?)"
                              : "";
  Ask<WelcomeInfo>(
      link, 0, std::move(hello), timeout_ms,
      [peer](const wire::Message* m, const Status& error) {
        return ParseWelcome(m, error, peer);
      },
      Status(Code::kTimeout, "no Welcome from " + peer + " after " +
                                 std::to_string(timeout_ms / 1000) + " s" +
                                 why),
      std::move(done));
  bool start_ticking = false;
  {
    MutexLock lock(&link->mu);
    link->greeted = true;     // heartbeats may follow the Hello now
    if (heartbeat_ms_ > 0) {  // observers too: idle connections are closed
      start_ticking = !link->ticking;
      link->ticking = true;
    }
  }
  // Heartbeats start once the Hello is on its way, so a worker waiting for
  // the others to join is not taken for a silent one. (A loop that stopped
  // with a lost connection is not running: one timer, one loop.)
  if (start_ticking) ArmTick(link);
}

Result<WelcomeInfo> ShardLinks::Handshake(const std::shared_ptr<Link>& link,
                                          int rank, int timeout_ms) {
  auto promise = std::make_shared<std::promise<Result<WelcomeInfo>>>();
  auto future = promise->get_future();
  asio::post(link->strand, [this, link, rank, timeout_ms, promise] {
    Greet(link, rank, timeout_ms, [promise](Result<WelcomeInfo> w) {
      promise->set_value(std::move(w));
    });
  });
  return future.get();
}

void ShardLinks::Redefine(const std::shared_ptr<Link>& link,
                          std::shared_ptr<const Defined> defined, size_t next,
                          std::function<void(const Status&)> done) {
  if (next == defined->size()) return done(Status::Ok());
  const auto& [name, meta] = (*defined)[next];
  const uint64_t request = NextId();
  Ask<uint32_t>(
      link, request,
      DefineFrame(request, name, meta.sparse, meta.shape, meta.dim, meta.init),
      options_.connect_timeout_ms,
      [id = meta.id, name = name](const wire::Message* m,
                                  const Status& error) -> Result<uint32_t> {
        if (m == nullptr) return error;
        const wire::DefineAck* ack = m->body_as_DefineAck();
        if (ack == nullptr || ack->id() != id) {
          return ProtocolError("'" + name +
                               "' came back with another id after the restart");
        }
        return id;
      },
      Status(Code::kTimeout, "defining '" + name + "' again timed out"),
      [this, link, defined, next, done](Result<uint32_t> id) {
        if (!id.ok()) return done(id.status());
        Redefine(link, defined, next + 1, done);
      });
}

void ShardLinks::StartReconnect(const std::shared_ptr<Link>& link) {
  if (stopping_) return;
  link->lost_at = std::chrono::steady_clock::now();
  link->attempt = 0;
  link->delay_ms = 100;
  AwaitBackoff(link);
}

void ShardLinks::AwaitBackoff(const std::shared_ptr<Link>& link) {
  link->backoff.expires_after(std::chrono::milliseconds(link->delay_ms));
  link->backoff.async_wait([this, link](const boost::system::error_code& ec) {
    if (!ec) Dial(link);
  });
}

void ShardLinks::Dial(const std::shared_ptr<Link>& link) {
  if (stopping_) return;
  ++link->attempt;
  link->waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - link->lost_at)
                        .count();
  if (link->waited_ms > options_.reconnect_timeout_ms) {
    TETHER_LOG(kError) << "gave up on " << link->Describe() << " after "
                       << link->waited_ms / 1000 << " s and "
                       << link->attempt - 1
                       << " attempts (reconnect_timeout_ms)";
    MutexLock lock(&link->mu);
    link->gave_up = true;
    return;
  }
  auto hp = ParseHostPort(link->address, link->Describe());
  if (!hp.ok()) return RetryLater(link, hp.status());
  link->resolver.async_resolve(
      hp->host, std::to_string(hp->port),
      [this, link, hp = *hp](const boost::system::error_code& ec,
                             const tcp::resolver::results_type& endpoints) {
        OnResolved(link, hp, ec, endpoints);
      });
}

void ShardLinks::OnResolved(const std::shared_ptr<Link>& link,
                            const HostPort& hp,
                            const boost::system::error_code& ec,
                            const tcp::resolver::results_type& endpoints) {
  if (stopping_) return;
  if (ec) return RetryLater(link, DialError(link->Describe(), hp, ec));
  link->dialing.emplace(link->io);
  asio::async_connect(
      *link->dialing, endpoints,
      asio::bind_executor(
          link->strand,
          [this, link, hp](const boost::system::error_code& ec,
                           const tcp::endpoint&) { OnDialed(link, hp, ec); }));
}

void ShardLinks::OnDialed(const std::shared_ptr<Link>& link, const HostPort& hp,
                          const boost::system::error_code& ec) {
  if (stopping_) return;  // Shut closes the socket
  tcp::socket socket = std::move(*link->dialing);
  link->dialing.reset();
  if (ec) return RetryLater(link, DialError(link->Describe(), hp, ec));
  if (!tls_) return OnConnected(link, std::move(socket));
  AsyncTlsHandshake(std::move(socket), tls_, TlsRole::kClient,
                    std::max(options_.connect_timeout_ms, 1000),
                    [this, link](Result<Stream> s) {
                      asio::post(link->strand,
                                 [this, link, s = std::move(s)]() mutable {
                                   if (stopping_) return;
                                   if (!s.ok())
                                     return RetryLater(link, s.status());
                                   OnConnected(link, std::move(*s));
                                 });
                    });
}

void ShardLinks::OnConnected(const std::shared_ptr<Link>& link, Stream stream) {
  ConnectionOptions co;
  co.max_frame_bytes = options_.max_frame_bytes;
  Attach(link, std::make_shared<Connection>(std::move(stream), co));
  Greet(
      link, rank_, options_.connect_timeout_ms,
      [this, link](Result<WelcomeInfo> w) { OnRejoined(link, std::move(w)); });
}

void ShardLinks::OnRejoined(const std::shared_ptr<Link>& link,
                            Result<WelcomeInfo> w) {
  if (stopping_) return;
  if (!w.ok()) return RetryLater(link, w.status());
  int64_t mine = clock_.load();
  while (w->clock > mine && !clock_.compare_exchange_weak(mine, w->clock)) {
  }
  auto defined = std::make_shared<Defined>(definitions_());
  // In the order they were first defined, so a shard that starts empty
  // hands out the same ids.
  std::sort(defined->begin(), defined->end(), [](const auto& a, const auto& b) {
    return a.second.id < b.second.id;
  });
  Redefine(link, std::move(defined), 0,
           [this, link](const Status& s) { OnRedefined(link, s); });
}

void ShardLinks::OnRedefined(const std::shared_ptr<Link>& link,
                             const Status& s) {
  if (stopping_) return;
  if (!s.ok()) return RetryLater(link, s);
  bool lost_again = false;
  {
    MutexLock lock(&link->mu);
    // Lost again before it was done: OnClose left that to this attempt.
    lost_again = link->closed;
    if (!lost_again) link->reconnecting = false;
  }
  if (lost_again) {
    return RetryLater(link,
                      Unavailable(link->Describe() + " closed the connection"));
  }
  TETHER_LOG(kWarning) << "reconnected to " << link->Describe() << " after "
                       << link->attempt << " attempt(s), "
                       << link->waited_ms / 1000 << " s";
}

void ShardLinks::RetryLater(const std::shared_ptr<Link>& link,
                            const Status& why) {
  if (link->attempt == 1 || link->attempt % 10 == 0) {
    TETHER_LOG(kWarning) << "reconnecting, attempt " << link->attempt << ": "
                         << why.message() << "; next in " << link->delay_ms
                         << " ms";
  }
  std::shared_ptr<Connection> conn;
  {
    // A connection that failed half way is closed for good; the next
    // attempt starts a new one.
    MutexLock lock(&link->mu);
    conn = link->conn;
    link->closed = true;
  }
  if (conn) conn->Close();
  link->delay_ms = std::min(link->delay_ms * 2, 5000);
  AwaitBackoff(link);
}

void ShardLinks::Shut(Link& link) {
  link.timer.cancel();
  link.backoff.cancel();
  link.deadline.cancel();
  link.resolver.cancel();
  if (link.dialing) {
    boost::system::error_code ignored;
    link.dialing->close(ignored);
  }
  std::shared_ptr<Connection> conn;
  {
    MutexLock lock(&link.mu);
    conn = link.conn;
  }
  if (conn) conn->Close();
}

void ShardLinks::Send(Link& link, uint64_t id, OutFrame frame,
                      ReplyHandler handler, bool rejoining) {
  std::shared_ptr<Connection> conn;
  bool reconnecting = false;
  {
    MutexLock lock(&link.mu);
    if (!link.closed && (rejoining || !link.reconnecting)) {
      link.pending.emplace(id, Link::Pending{std::move(handler),
                                             std::chrono::steady_clock::now()});
      handler = nullptr;
      conn = link.conn;
    }
    reconnecting = link.reconnecting && !link.gave_up;
  }
  if (handler) {
    return handler(nullptr,
                   Unavailable(link.Describe() + ": connection is closed" +
                               (reconnecting ? " (reconnecting)" : "")));
  }
  conn->Send(std::move(frame));
}

void ShardLinks::OnFrame(Link& link, const Frame& frame) {
  const wire::Message& m = *frame.message();
  link.last_heard_ms = SteadyMs();
  uint64_t id = RequestIdOf(m);
  if (const wire::Heartbeat* hb = m.body_as_Heartbeat(); hb && id == 0) {
    if (hb->workers_expected() > 0) {
      link.workers_joined = hb->workers_joined();
      link.workers_expected = hb->workers_expected();
    }
    return;
  }
  if (const wire::Stop* stop = m.body_as_Stop()) {
    const std::string reason =
        stop->reason() ? stop->reason()->str() : "stopped";
    RequestStop(reason);
    TETHER_LOG(kWarning) << link.Describe() << ": the run was stopped ("
                         << reason << ")";
    return;
  }
  ReplyHandler handler;
  {
    MutexLock lock(&link.mu);
    auto it = link.pending.find(id);
    if (it != link.pending.end()) {
      handler = std::move(it->second.handler);
      link.pending.erase(it);
    }
  }
  if (!handler) {
    if (const wire::Error* e = m.body_as_Error()) {
      TETHER_LOG(kWarning) << StatusFromError(*e, link.Describe()).message();
    } else {
      TETHER_LOG(kWarning) << link.Describe() << " sent an unexpected "
                           << wire::EnumNameBody(m.body_type());
    }
    return;
  }
  if (const wire::Error* e = m.body_as_Error()) {
    return handler(nullptr, StatusFromError(*e, link.Describe()));
  }
  handler(&m, Status::Ok());
}

void ShardLinks::OnClose(const std::shared_ptr<Link>& link, int generation,
                         const Status& why) {
  std::unordered_map<uint64_t, Link::Pending> pending;
  bool reconnect = false;
  {
    MutexLock lock(&link->mu);
    if (generation != link->generation) return;  // an older connection
    link->closed = true;
    pending.swap(link->pending);
    reconnect = !stopping_ && !options_.observer && welcomed_ &&
                options_.reconnect_timeout_ms > 0 && !link->gave_up &&
                !link->reconnecting;
    if (reconnect) link->reconnecting = true;
  }
  if (reconnect) {
    ++losses_;
    asio::post(link->strand, [this, link] { StartReconnect(link); });
  }
  Status error = Unavailable(link->Describe() + " closed the connection" +
                             (why.ok() ? "" : ": " + why.message()));
  if (reconnect) {
    TETHER_LOG(kWarning) << "lost " << link->Describe()
                         << (why.ok() ? "" : ": " + why.message())
                         << "; reconnecting";
  }
  for (auto& [id, p] : pending) p.handler(nullptr, error);
}

std::string ShardLinks::JoinWait(const Link& link) const {
  constexpr const char* kShards =
      "waiting for the shards to register (or to load the round the run "
      "resumes from)";
  if (options_.observer) return kShards;  // observers wait for no worker
  const int joined = link.workers_joined;
  const int expected = link.workers_expected;
  if (joined < 0 || expected <= 0) return "waiting for the workers to join";
  const std::string counted =
      " (" + std::to_string(joined) + "/" + std::to_string(expected) + ")";
  if (joined >= expected) {
    return "every worker has joined" + counted + "; " + kShards;
  }
  const int missing = expected - joined;
  return "waiting for " + std::to_string(missing) + " more worker" +
         (missing == 1 ? "" : "s") + " to join" + counted;
}

void ShardLinks::ArmTick(const std::shared_ptr<Link>& link) {
  if (stopping_) return;
  const int heartbeat_ms = heartbeat_ms_.load();
  link->tick_due_ms = SteadyMs() + heartbeat_ms;
  link->timer.expires_after(std::chrono::milliseconds(heartbeat_ms));
  link->timer.async_wait([this, link](const boost::system::error_code& ec) {
    if (!ec) Tick(link);
  });
}

void ShardLinks::Tick(const std::shared_ptr<Link>& link) {
  std::shared_ptr<Connection> conn;
  {
    MutexLock lock(&link->mu);
    if (stopping_ || link->closed) {
      link->ticking = false;  // a reconnection starts the loop again
      return;
    }
    if (link->greeted) conn = link->conn;
  }
  if (conn) {
    flatbuffers::FlatBufferBuilder fbb(64);
    conn->Send(FinishFrame(fbb, wire::CreateHeartbeat(fbb, 0, UnixMs())));
    // Heartbeats go both ways: a shard that answers nothing for the run's
    // worker timeout is given up on and dialled again (the network may
    // have been cut; a fresh connection does not wait out TCP's backoff).
    // A tick this late means this process did not run (SIGSTOP, a laptop
    // asleep) for longer than the timeout: the shards have evicted it and
    // its connections may be dead. Whatever the socket buffered meanwhile
    // is read on waking, so silence alone would not always tell.
    const int64_t now_ms = SteadyMs();
    const int64_t silent_ms = now_ms - link->last_heard_ms;
    const int64_t frozen_ms = now_ms - link->tick_due_ms;
    const int limit_ms = silence_ms_.load();
    if (welcomed_ && !options_.observer && limit_ms > 0) {
      std::string why;
      if (silent_ms > limit_ms) {
        why = "heard nothing from " + link->Describe() + " for " +
              std::to_string(silent_ms / 1000) +
              " s (the run's --worker-timeout-ms); dropping the connection "
              "to dial it again";
      } else if (frozen_ms > limit_ms) {
        why = "this process did not run for " +
              std::to_string(frozen_ms / 1000) +
              " s, past the run's --worker-timeout-ms; dropping the "
              "connection to " +
              link->Describe() + " to dial it again";
      }
      if (!why.empty()) {
        TETHER_LOG(kWarning) << why;
        conn->Close();
      }
    }
  }

  // Say what we wait for when a request takes long: the Welcome, which
  // shard 0 holds until every worker has joined; a pull held until the
  // slowest worker catches up; or a shard that stopped answering.
  size_t waiting = 0;
  int64_t oldest_ms = 0;
  bool joining = false;  // the Hello (request 0) awaits its Welcome
  const auto now = std::chrono::steady_clock::now();
  {
    MutexLock lock(&link->mu);
    joining = link->pending.contains(0);
    for (const auto& [id, p] : link->pending) {
      ++waiting;
      oldest_ms = std::max<int64_t>(
          oldest_ms,
          std::chrono::duration_cast<std::chrono::milliseconds>(now - p.sent)
              .count());
    }
  }
  const int64_t now_ms = SteadyMs();
  if (waiting > 0 && oldest_ms >= options_.slow_request_ms &&
      now_ms - link->last_warned_ms >= options_.slow_request_ms) {
    link->last_warned_ms = now_ms;
    const int64_t silent_ms = now_ms - link->last_heard_ms;
    if (silent_ms > 3 * heartbeat_ms_) {
      TETHER_LOG(kWarning) << "waiting " << oldest_ms / 1000 << " s for "
                           << link->Describe() << " to answer " << waiting
                           << " request(s); it has been silent for "
                           << silent_ms / 1000
                           << " s (down, or the network is cut?)";
    } else if (joining) {
      TETHER_LOG(kWarning) << JoinWait(*link) << "; " << oldest_ms / 1000
                           << " s so far (" << link->Describe()
                           << " starts the run once every worker and shard "
                              "is there)";
    } else {
      TETHER_LOG(kWarning) << "waiting " << oldest_ms / 1000 << " s for "
                           << link->Describe() << " to answer " << waiting
                           << " request(s); it is alive: a pull waits there "
                              "until the slowest worker is within the "
                              "staleness bound";
    }
  }
  ArmTick(link);
}

Status ShardLinks::AwaitShards(int timeout_ms) {
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool said = false;
  while (true) {
    std::string down;
    for (auto& link : links_) {
      MutexLock lock(&link->mu);
      if (link->gave_up) {
        return Unavailable(link->Describe() + " is gone: gave up reconnecting");
      }
      if (link->closed && !link->reconnecting) {
        return Unavailable(link->Describe() + " is lost (not reconnecting)");
      }
      // Reconnected once its handshake and definitions are done too.
      if (link->closed || link->reconnecting) down = link->Describe();
    }
    if (down.empty()) return Status::Ok();
    // A stopped run (SIGTERM, the dashboard) does not wait for a shard
    // that may never come back.
    if (stop_requested()) {
      return Status(Code::kCancelled,
                    stop_reason() + " (while waiting for " + down + ")");
    }
    if (std::chrono::steady_clock::now() >= end) {
      return Unavailable(down + " did not come back in " +
                         std::to_string(timeout_ms / 1000) + " s");
    }
    if (!said) {
      TETHER_LOG(kWarning) << "waiting for " << down << " to come back";
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace tether::client_internal
