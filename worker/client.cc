#include "worker/client.h"

#include <algorithm>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <thread>

#include "schema/auth.h"
#include "schema/connection.h"
#include "schema/frame.h"
#include "schema/log.h"
#include "schema/stats_frame.h"

namespace tether {
namespace {

// Called with the reply, or with a null message and the error.
using ReplyHandler =
    std::function<void(const wire::Message* reply, const Status& error)>;

// Completes one request that was cut into parts: `done` runs once, after
// the last part, with the first error any part reported.
class Fanout {
 public:
  Fanout(size_t parts, Client::Callback done)
      : remaining_(parts), done_(std::move(done)) {}

  void Finish(const Status& s) {
    std::unique_lock lock(mu_);
    if (!s.ok() && first_error_.ok()) first_error_ = s;
    if (--remaining_ > 0) return;
    Status result = first_error_;
    lock.unlock();
    done_(result);
  }

 private:
  std::mutex mu_;
  size_t remaining_;
  Status first_error_;
  Client::Callback done_;
};

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

Status Wait(const std::function<void(Client::Callback)>& start) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  start([promise](const Status& s) { promise->set_value(s); });
  return future.get();
}

struct WelcomeInfo {
  int rank = -1;
  int64_t clock = 0;
  int staleness = -1;
  uint64_t seed = 0;
  int num_shards = 0;
  int num_workers = 0;
  uint32_t block_size = 0;
  int heartbeat_ms = 0;
  int silence_ms = 0;         // the run's --worker-timeout-ms
  int64_t resume_round = -1;  // the round the run resumed from; -1 none
  std::vector<std::string> shard_addresses;
};

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

}  // namespace

struct Client::Impl {
  // One shard's connection and the requests waiting for its answers. Owned
  // by shared_ptr: the handlers of its own asynchronous operations (the
  // heartbeat loop, a handshake step, reconnection) hold it while pending,
  // those of its connection hold it weakly.
  struct Link {
    Link(asio::io_context& io, int id, std::string addr)
        : shard_id(id),
          address(std::move(addr)),
          strand(asio::make_strand(io)),
          timer(strand),
          backoff(strand),
          deadline(strand),
          resolver(strand) {}

    // Constant after construction.
    const int shard_id;
    const std::string address;
    // Heartbeats, handshake steps and reconnection run here, one at a
    // time; other threads enter only by posting to it.
    const asio::strand<asio::io_context::executor_type> strand;

    std::mutex mu;
    struct Pending {
      ReplyHandler handler;
      std::chrono::steady_clock::time_point sent;
    };
    std::shared_ptr<Connection> conn;               // guarded by mu
    std::unordered_map<uint64_t, Pending> pending;  // guarded by mu
    bool closed = false;                            // guarded by mu
    int generation = 0;         // guarded by mu; one per connection
    bool gave_up = false;       // guarded by mu: reconnecting failed for good
    bool reconnecting = false;  // guarded by mu: lost, being dialled again
    bool ticking = false;       // guarded by mu: the heartbeat loop runs
    bool greeted = false;       // guarded by mu: Hello sent on this conn

    // On the strand.
    asio::steady_timer timer;     // heartbeats and the slow-request watchdog
    asio::steady_timer backoff;   // the wait before the next dial
    asio::steady_timer deadline;  // of the handshake step in flight
    tcp::resolver resolver;
    std::optional<tcp::socket> dialing;  // a connect in flight
    uint64_t step = 0;  // the step in flight; a late answer to an older one
                        // (timed out, superseded) is dropped
    int64_t last_warned_ms = 0;
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

  struct TensorMeta {
    uint32_t id = 0;
    uint64_t size = 0;  // dense: floats; sparse: row width
    bool sparse = false;
    // As defined, to define it again on a shard that was restarted.
    std::vector<uint64_t> shape;
    uint32_t dim = 0;
    Init init;
  };
  using Defined = std::vector<std::pair<std::string, TensorMeta>>;
  using WelcomeHandler = std::function<void(Result<WelcomeInfo>)>;
  template <typename T>
  using Parser =
      std::function<Result<T>(const wire::Message* reply, const Status& error)>;

  explicit Impl(ClientOptions o)
      : options(std::move(o)), work(asio::make_work_guard(io)) {
    heartbeat_ms = options.heartbeat_ms;
  }

  ~Impl() {
    // Every step of a link's asynchronous work checks `stopping` first, so
    // once Shut has run on its strand nothing new starts there; the I/O
    // threads then run what is left and return.
    stopping = true;
    for (auto& link : links) {
      asio::post(link->strand, [link] { Shut(*link); });
    }
    work.reset();
    for (std::thread& t : threads) t.join();
  }

  // Connects to `address` (blocking: Connect() runs on the caller's thread)
  // and adds the link.
  Result<std::shared_ptr<Link>> Open(int shard_id, const std::string& address);
  // Starts reading `conn` as the link's connection (a new generation).
  void Attach(const std::shared_ptr<Link>& link,
              std::shared_ptr<Connection> conn);
  // Says Hello (answering the shard's Challenge when keyed) and calls
  // `done` on the link's strand with the Welcome, or kTimeout once it has
  // waited timeout_ms for it. Call on the link's strand.
  void Greet(const std::shared_ptr<Link>& link, int rank, int timeout_ms,
             WelcomeHandler done);
  void SendHello(const std::shared_ptr<Link>& link, OutFrame hello,
                 int timeout_ms, WelcomeHandler done);
  // Greet, blocking: for Connect().
  Result<WelcomeInfo> Handshake(const std::shared_ptr<Link>& link, int rank,
                                int timeout_ms);
  // Sends request `id` and calls `done` once, on the link's strand, with
  // what `parse` makes of the answer, or with `timeout` after timeout_ms.
  // Call on the link's strand; one at a time per link.
  template <typename T>
  void Ask(const std::shared_ptr<Link>& link, uint64_t id, OutFrame frame,
           int timeout_ms, Parser<T> parse, Status timeout,
           std::function<void(Result<T>)> done);
  // Defines `defined[next...]` again on a restarted shard, one after the
  // other, then calls `done` on the link's strand.
  void Redefine(const std::shared_ptr<Link>& link,
                std::shared_ptr<const Defined> defined, size_t next,
                std::function<void(const Status&)> done);

  // Workers: after a link is lost, a state machine on its strand waits
  // (0.1 s doubling to 5 s), dials, says Hello with this worker's clock and
  // defines every tensor again, until that succeeds or reconnect_timeout_ms
  // has passed; requests fail fast meanwhile.
  void StartReconnect(const std::shared_ptr<Link>& link);
  void AwaitBackoff(const std::shared_ptr<Link>& link);
  void Dial(const std::shared_ptr<Link>& link);
  void OnResolved(const std::shared_ptr<Link>& link, const HostPort& hp,
                  const boost::system::error_code& ec,
                  const tcp::resolver::results_type& endpoints);
  void OnDialed(const std::shared_ptr<Link>& link, const HostPort& hp,
                const boost::system::error_code& ec);
  void OnRejoined(const std::shared_ptr<Link>& link, Result<WelcomeInfo> w);
  void OnRedefined(const std::shared_ptr<Link>& link, const Status& s);
  // The attempt failed: closes what it opened and waits for the next.
  void RetryLater(const std::shared_ptr<Link>& link, const Status& why);
  // The client is closing: cancels the link's timers and dialling and
  // closes its connection. On the link's strand.
  static void Shut(Link& link);

  // Queues request `id`; `handler` runs with its answer, or at once with
  // kUnavailable while the link is down. Only the handshake's own requests
  // (`rejoining`) go out while a reconnection is still under way, so that
  // no request reaches a restarted shard before its tensors are defined.
  void Send(Link& link, uint64_t id, OutFrame frame, ReplyHandler handler,
            bool rejoining = false);
  void OnFrame(Link& link, const Frame& frame);
  void OnClose(const std::shared_ptr<Link>& link, int generation,
               const Status& why);
  // What a Hello still waiting for its Welcome waits for, from the shard's
  // latest heartbeat: "waiting for 1 more worker to join (1/2)".
  std::string JoinWait(const Link& link) const;
  // Sends a heartbeat every heartbeat_ms and logs requests that wait long.
  // On the link's strand.
  void ArmTick(const std::shared_ptr<Link>& link);
  void Tick(const std::shared_ptr<Link>& link);
  Result<TensorMeta> Lookup(const std::string& name, bool sparse);
  void Define(const std::string& name, bool sparse,
              const std::vector<uint64_t>& shape, uint32_t dim, Init init,
              Callback done);
  uint64_t NextId() { return next_id++; }

  const ClientOptions options;
  std::shared_ptr<const AuthKey> auth_key;  // null: no authentication
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<Link>> links;  // fixed once Connect() returns
  std::atomic<uint64_t> next_id{1};
  WelcomeInfo welcome;
  std::atomic<int64_t> clock{0};
  std::atomic<int64_t> read_clock{0};
  std::atomic<int> heartbeat_ms{0};
  std::atomic<bool> stopping{false};
  std::atomic<bool> welcomed{false};  // Connect() has finished
  std::atomic<uint64_t> losses{0};    // shard connections lost
  std::atomic<bool> stop_requested{false};
  mutable std::mutex stop_mu;
  std::string stop_reason;  // guarded by stop_mu

  std::mutex tensors_mu;
  std::unordered_map<std::string, TensorMeta> tensors;  // guarded
};

namespace {

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

Result<std::shared_ptr<Client::Impl::Link>> Client::Impl::Open(
    int shard_id, const std::string& address) {
  auto hp = ParseHostPort(address, "shard " + std::to_string(shard_id));
  if (!hp.ok()) return hp.status();
  std::string what =
      shard_id == 0 ? "the coordinator" : "shard " + std::to_string(shard_id);
  auto socket = ConnectWithRetry(io, *hp, what, options.connect_timeout_ms);
  if (!socket.ok()) return socket.status();
  auto link = std::make_shared<Link>(io, shard_id, address);
  ConnectionOptions co;
  co.max_frame_bytes = options.max_frame_bytes;
  links.push_back(link);
  Attach(link, std::make_shared<Connection>(std::move(*socket), co));
  return link;
}

void Client::Impl::Attach(const std::shared_ptr<Link>& link,
                          std::shared_ptr<Connection> conn) {
  int generation;
  {
    std::lock_guard lock(link->mu);
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
void Client::Impl::Ask(const std::shared_ptr<Link>& link, uint64_t id,
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
  if (stopping) {
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

void Client::Impl::Greet(const std::shared_ptr<Link>& link, int rank,
                         int timeout_ms, WelcomeHandler done) {
  HelloFields fields;
  fields.role = options.observer ? wire::Role::Observer : wire::Role::Worker;
  fields.rank = rank;
  fields.staleness = options.staleness;
  fields.name = options.name;
  // Only the coordinator lists the run's processes.
  if (link->shard_id == 0) fields.command = options.command;
  // A worker coming back after a lost connection says its clock, so the
  // shard does not hold it (and everyone) back at an older one.
  fields.clock = welcomed ? clock.load() : -1;
  auto auth = std::make_shared<PeerAuth>(auth_key);
  OutFrame hello = auth->First(std::move(fields));
  if (!auth_key) return SendHello(link, std::move(hello), timeout_ms, done);
  // The shard challenges at once (before the coordinator waits for the
  // others to join), so this waits no longer than a connect.
  const std::string peer = link->Describe();
  const int wait_ms = std::max(options.connect_timeout_ms, 1000);
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

void Client::Impl::SendHello(const std::shared_ptr<Link>& link, OutFrame hello,
                             int timeout_ms, WelcomeHandler done) {
  const std::string peer = link->Describe();
  const std::string why = link->shard_id == 0 && !options.observer
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
    std::lock_guard lock(link->mu);
    link->greeted = true;    // heartbeats may follow the Hello now
    if (heartbeat_ms > 0) {  // observers too: idle connections are closed
      start_ticking = !link->ticking;
      link->ticking = true;
    }
  }
  // Heartbeats start once the Hello is on its way, so a worker waiting for
  // the others to join is not taken for a silent one. (A loop that stopped
  // with a lost connection is not running: one timer, one loop.)
  if (start_ticking) ArmTick(link);
}

Result<WelcomeInfo> Client::Impl::Handshake(const std::shared_ptr<Link>& link,
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

void Client::Impl::Redefine(const std::shared_ptr<Link>& link,
                            std::shared_ptr<const Defined> defined, size_t next,
                            std::function<void(const Status&)> done) {
  if (next == defined->size()) return done(Status::Ok());
  const auto& [name, meta] = (*defined)[next];
  const uint64_t request = NextId();
  Ask<uint32_t>(
      link, request,
      DefineFrame(request, name, meta.sparse, meta.shape, meta.dim, meta.init),
      options.connect_timeout_ms,
      [id = meta.id, name](const wire::Message* m,
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

void Client::Impl::StartReconnect(const std::shared_ptr<Link>& link) {
  if (stopping) return;
  link->lost_at = std::chrono::steady_clock::now();
  link->attempt = 0;
  link->delay_ms = 100;
  AwaitBackoff(link);
}

void Client::Impl::AwaitBackoff(const std::shared_ptr<Link>& link) {
  link->backoff.expires_after(std::chrono::milliseconds(link->delay_ms));
  link->backoff.async_wait([this, link](const boost::system::error_code& ec) {
    if (!ec) Dial(link);
  });
}

void Client::Impl::Dial(const std::shared_ptr<Link>& link) {
  if (stopping) return;
  ++link->attempt;
  link->waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - link->lost_at)
                        .count();
  if (link->waited_ms > options.reconnect_timeout_ms) {
    TETHER_LOG(kError) << "gave up on " << link->Describe() << " after "
                       << link->waited_ms / 1000 << " s and "
                       << link->attempt - 1
                       << " attempts (reconnect_timeout_ms)";
    std::lock_guard lock(link->mu);
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

void Client::Impl::OnResolved(const std::shared_ptr<Link>& link,
                              const HostPort& hp,
                              const boost::system::error_code& ec,
                              const tcp::resolver::results_type& endpoints) {
  if (stopping) return;
  if (ec) return RetryLater(link, DialError(link->Describe(), hp, ec));
  link->dialing.emplace(io);
  asio::async_connect(
      *link->dialing, endpoints,
      asio::bind_executor(
          link->strand,
          [this, link, hp](const boost::system::error_code& ec,
                           const tcp::endpoint&) { OnDialed(link, hp, ec); }));
}

void Client::Impl::OnDialed(const std::shared_ptr<Link>& link,
                            const HostPort& hp,
                            const boost::system::error_code& ec) {
  if (stopping) return;  // Shut closes the socket
  tcp::socket socket = std::move(*link->dialing);
  link->dialing.reset();
  if (ec) return RetryLater(link, DialError(link->Describe(), hp, ec));
  ConnectionOptions co;
  co.max_frame_bytes = options.max_frame_bytes;
  Attach(link, std::make_shared<Connection>(std::move(socket), co));
  Greet(
      link, welcome.rank, options.connect_timeout_ms,
      [this, link](Result<WelcomeInfo> w) { OnRejoined(link, std::move(w)); });
}

void Client::Impl::OnRejoined(const std::shared_ptr<Link>& link,
                              Result<WelcomeInfo> w) {
  if (stopping) return;
  if (!w.ok()) return RetryLater(link, w.status());
  int64_t mine = clock.load();
  while (w->clock > mine && !clock.compare_exchange_weak(mine, w->clock)) {
  }
  auto defined = std::make_shared<Defined>();
  {
    std::lock_guard lock(tensors_mu);
    defined->assign(tensors.begin(), tensors.end());
  }
  // In the order they were first defined, so a shard that starts empty
  // hands out the same ids.
  std::sort(defined->begin(), defined->end(), [](const auto& a, const auto& b) {
    return a.second.id < b.second.id;
  });
  Redefine(link, std::move(defined), 0,
           [this, link](const Status& s) { OnRedefined(link, s); });
}

void Client::Impl::OnRedefined(const std::shared_ptr<Link>& link,
                               const Status& s) {
  if (stopping) return;
  if (!s.ok()) return RetryLater(link, s);
  bool lost_again = false;
  {
    std::lock_guard lock(link->mu);
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

void Client::Impl::RetryLater(const std::shared_ptr<Link>& link,
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
    std::lock_guard lock(link->mu);
    conn = link->conn;
    link->closed = true;
  }
  if (conn) conn->Close();
  link->delay_ms = std::min(link->delay_ms * 2, 5000);
  AwaitBackoff(link);
}

void Client::Impl::Shut(Link& link) {
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
    std::lock_guard lock(link.mu);
    conn = link.conn;
  }
  if (conn) conn->Close();
}

void Client::Impl::Send(Link& link, uint64_t id, OutFrame frame,
                        ReplyHandler handler, bool rejoining) {
  std::shared_ptr<Connection> conn;
  bool reconnecting = false;
  {
    std::lock_guard lock(link.mu);
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

void Client::Impl::OnFrame(Link& link, const Frame& frame) {
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
    {
      std::lock_guard lock(stop_mu);
      stop_reason = stop->reason() ? stop->reason()->str() : "stopped";
    }
    stop_requested = true;
    TETHER_LOG(kWarning) << link.Describe() << ": the run was stopped ("
                         << stop_reason << ")";
    return;
  }
  ReplyHandler handler;
  {
    std::lock_guard lock(link.mu);
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

void Client::Impl::OnClose(const std::shared_ptr<Link>& link, int generation,
                           const Status& why) {
  std::unordered_map<uint64_t, Link::Pending> pending;
  bool reconnect = false;
  {
    std::lock_guard lock(link->mu);
    if (generation != link->generation) return;  // an older connection
    link->closed = true;
    pending.swap(link->pending);
    reconnect = !stopping && !options.observer && welcomed &&
                options.reconnect_timeout_ms > 0 && !link->gave_up &&
                !link->reconnecting;
    if (reconnect) link->reconnecting = true;
  }
  if (reconnect) {
    ++losses;
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

std::string Client::Impl::JoinWait(const Link& link) const {
  constexpr const char* kShards =
      "waiting for the shards to register (or to load the round the run "
      "resumes from)";
  if (options.observer) return kShards;  // observers wait for no worker
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

void Client::Impl::ArmTick(const std::shared_ptr<Link>& link) {
  if (stopping) return;
  link->timer.expires_after(std::chrono::milliseconds(heartbeat_ms.load()));
  link->timer.async_wait([this, link](const boost::system::error_code& ec) {
    if (!ec) Tick(link);
  });
}

void Client::Impl::Tick(const std::shared_ptr<Link>& link) {
  std::shared_ptr<Connection> conn;
  {
    std::lock_guard lock(link->mu);
    if (stopping || link->closed) {
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
    const int64_t silent_ms = SteadyMs() - link->last_heard_ms;
    const int limit_ms = welcome.silence_ms;
    if (welcomed && !options.observer && limit_ms > 0 && silent_ms > limit_ms) {
      TETHER_LOG(kWarning) << "heard nothing from " << link->Describe()
                           << " for " << silent_ms / 1000
                           << " s (the run's --worker-timeout-ms); dropping "
                              "the connection to dial it again";
      conn->Close();
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
    std::lock_guard lock(link->mu);
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
  if (waiting > 0 && oldest_ms >= options.slow_request_ms &&
      now_ms - link->last_warned_ms >= options.slow_request_ms) {
    link->last_warned_ms = now_ms;
    const int64_t silent_ms = now_ms - link->last_heard_ms;
    if (silent_ms > 3 * heartbeat_ms) {
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

Result<Client::Impl::TensorMeta> Client::Impl::Lookup(const std::string& name,
                                                      bool sparse) {
  std::lock_guard lock(tensors_mu);
  auto it = tensors.find(name);
  if (it == tensors.end() || it->second.sparse != sparse) {
    return NotFound(std::string(sparse ? "table '" : "tensor '") + name +
                    "' is not defined by this client (call Define" +
                    (sparse ? "Table" : "Tensor") + " first)");
  }
  return it->second;
}

void Client::Impl::Define(const std::string& name, bool sparse,
                          const std::vector<uint64_t>& shape, uint32_t dim,
                          Init init, Callback done) {
  uint64_t size = 1;
  for (uint64_t d : shape) size *= d;
  auto id = std::make_shared<std::atomic<uint32_t>>(0);
  auto fanout = std::make_shared<Fanout>(
      links.size(), [this, name, sparse, size, dim, id, shape, init,
                     done = std::move(done)](const Status& s) {
        if (s.ok()) {
          std::lock_guard lock(tensors_mu);
          tensors[name] = {id->load(), sparse ? dim : size, sparse, shape, dim,
                           init};
        }
        done(s);
      });
  for (auto& link : links) {
    uint64_t request = NextId();
    OutFrame frame = DefineFrame(request, name, sparse, shape, dim, init);
    Send(*link, request, std::move(frame),
         [fanout, id](const wire::Message* m, const Status& error) {
           if (m == nullptr) return fanout->Finish(error);
           const wire::DefineAck* ack = m->body_as_DefineAck();
           if (ack == nullptr) {
             return fanout->Finish(ProtocolError(
                 "Define answered with " +
                 std::string(wire::EnumNameBody(m->body_type()))));
           }
           id->store(ack->id());
           fanout->Finish(Status::Ok());
         });
  }
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.coordinator.empty()) {
    return InvalidArgument("coordinator: no address given");
  }
  if (options.io_threads < 1) {
    return InvalidArgument("io_threads: must be at least 1");
  }
  if (options.chunk_bytes < 1024) {
    return InvalidArgument("chunk_bytes: must be at least 1024");
  }
  std::shared_ptr<const AuthKey> key;
  if (!options.auth_key_file.empty()) {
    auto loaded = AuthKey::Load(options.auth_key_file, "--auth-key-file");
    if (!loaded.ok()) return loaded.status();
    key = *loaded;
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  Impl& c = *impl;
  c.auth_key = std::move(key);
  for (int i = 0; i < c.options.io_threads; ++i) {
    c.threads.emplace_back([&c] { c.io.run(); });
  }
  auto coordinator = c.Open(0, c.options.coordinator);
  if (!coordinator.ok()) return coordinator.status();
  auto welcome =
      c.Handshake(*coordinator, c.options.observer ? -1 : c.options.rank,
                  c.options.join_timeout_ms);
  if (!welcome.ok()) return welcome.status();
  c.welcome = *welcome;
  if (static_cast<int>(c.welcome.shard_addresses.size()) !=
      c.welcome.num_shards) {
    return ProtocolError("the coordinator's Welcome lists " +
                         std::to_string(c.welcome.shard_addresses.size()) +
                         " shards, expected " +
                         std::to_string(c.welcome.num_shards));
  }
  for (int i = 1; i < c.welcome.num_shards; ++i) {
    auto link = c.Open(i, c.welcome.shard_addresses[i]);
    if (!link.ok()) return link.status();
    auto w = c.Handshake(*link, c.welcome.rank, c.options.connect_timeout_ms);
    if (!w.ok()) return w.status();
    c.welcome.clock = std::max(c.welcome.clock, w->clock);
  }
  c.clock = c.welcome.clock;
  c.read_clock = c.welcome.clock;
  if (c.welcome.heartbeat_ms > 0) c.heartbeat_ms = c.welcome.heartbeat_ms;
  c.welcomed = true;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

int Client::rank() const { return impl_->welcome.rank; }
int Client::staleness() const { return impl_->welcome.staleness; }
int Client::num_shards() const { return impl_->welcome.num_shards; }
int Client::num_workers() const { return impl_->welcome.num_workers; }
uint64_t Client::seed() const { return impl_->welcome.seed; }
uint32_t Client::block_size() const { return impl_->welcome.block_size; }
int64_t Client::clock() const { return impl_->clock; }
int64_t Client::resume_round() const { return impl_->welcome.resume_round; }

void Client::DefineTensorAsync(const std::string& name,
                               const std::vector<uint64_t>& shape, Init init,
                               Callback done) {
  impl_->Define(name, false, shape, 0, init, std::move(done));
}

Status Client::DefineTensor(const std::string& name,
                            const std::vector<uint64_t>& shape, Init init) {
  return Wait([&](Callback cb) {
    DefineTensorAsync(name, shape, init, std::move(cb));
  });
}

void Client::DefineTableAsync(const std::string& name, uint32_t dim, Init init,
                              Callback done) {
  impl_->Define(name, true, {}, dim, init, std::move(done));
}

Status Client::DefineTable(const std::string& name, uint32_t dim, Init init) {
  return Wait(
      [&](Callback cb) { DefineTableAsync(name, dim, init, std::move(cb)); });
}

namespace {

// Dense blocks grouped per shard and cut into frames of at most
// `per_frame` blocks: the unit every dense request is sent in.
Result<std::vector<std::pair<int, std::vector<uint32_t>>>> CutBlocks(
    const Slicer& slicer, uint32_t tensor, uint64_t size, uint32_t block_size,
    int num_shards, size_t chunk_bytes) {
  uint64_t num_blocks = (size + block_size - 1) / block_size;
  std::vector<std::vector<uint32_t>> by_shard(num_shards);
  for (uint64_t b = 0; b < num_blocks; ++b) {
    int shard = slicer.dense(tensor, static_cast<uint32_t>(b), num_shards);
    if (shard < 0 || shard >= num_shards) {
      return InvalidArgument("slicer put block " + std::to_string(b) +
                             " on shard " + std::to_string(shard) +
                             ", outside 0.." + std::to_string(num_shards - 1));
    }
    by_shard[shard].push_back(static_cast<uint32_t>(b));
  }
  size_t per_frame =
      std::max<size_t>(1, chunk_bytes / (size_t{block_size} * sizeof(float)));
  std::vector<std::pair<int, std::vector<uint32_t>>> parts;
  for (int s = 0; s < num_shards; ++s) {
    for (size_t i = 0; i < by_shard[s].size(); i += per_frame) {
      size_t end = std::min(by_shard[s].size(), i + per_frame);
      parts.emplace_back(s, std::vector<uint32_t>(by_shard[s].begin() + i,
                                                  by_shard[s].begin() + end));
    }
  }
  return parts;
}

// Sparse keys grouped per shard (with their positions in the request) and
// cut into frames of at most `per_frame` keys.
struct KeyPart {
  int shard = 0;
  std::vector<uint64_t> keys;
  std::vector<size_t> positions;
};

Result<std::vector<KeyPart>> CutKeys(const Slicer& slicer, uint32_t table,
                                     std::span<const uint64_t> keys,
                                     uint32_t dim, int num_shards,
                                     size_t chunk_bytes) {
  std::vector<KeyPart> by_shard(num_shards);
  for (size_t i = 0; i < keys.size(); ++i) {
    int shard = slicer.sparse(table, keys[i], num_shards);
    if (shard < 0 || shard >= num_shards) {
      return InvalidArgument("slicer put key " + std::to_string(keys[i]) +
                             " on shard " + std::to_string(shard));
    }
    by_shard[shard].shard = shard;
    by_shard[shard].keys.push_back(keys[i]);
    by_shard[shard].positions.push_back(i);
  }
  size_t per_frame =
      std::max<size_t>(1, chunk_bytes / (size_t{dim} * sizeof(float) + 8));
  std::vector<KeyPart> parts;
  for (KeyPart& whole : by_shard) {
    for (size_t i = 0; i < whole.keys.size(); i += per_frame) {
      size_t end = std::min(whole.keys.size(), i + per_frame);
      KeyPart part;
      part.shard = whole.shard;
      part.keys.assign(whole.keys.begin() + i, whole.keys.begin() + end);
      part.positions.assign(whole.positions.begin() + i,
                            whole.positions.begin() + end);
      parts.push_back(std::move(part));
    }
  }
  return parts;
}

}  // namespace

void Client::PullAsync(const std::string& name, std::span<float> out,
                       Callback done) {
  Impl& c = *impl_;
  auto meta = c.Lookup(name, false);
  if (!meta.ok()) return done(meta.status());
  if (out.size() != meta->size) {
    return done(InvalidArgument(
        "pull of '" + name + "': buffer holds " + std::to_string(out.size()) +
        " floats, the tensor " + std::to_string(meta->size)));
  }
  const uint32_t bs = c.welcome.block_size;
  auto parts = CutBlocks(c.options.slicer, meta->id, meta->size, bs,
                         c.welcome.num_shards, c.options.chunk_bytes);
  if (!parts.ok()) return done(parts.status());
  c.read_clock = c.clock.load();
  auto fanout = std::make_shared<Fanout>(parts->size(), std::move(done));
  const uint64_t size = meta->size;
  for (auto& [shard, blocks] : *parts) {
    uint64_t request = c.NextId();
    flatbuffers::FlatBufferBuilder fbb(64 + blocks.size() * 4);
    auto blocks_offset = fbb.CreateVector(blocks);
    OutFrame frame = FinishFrame(
        fbb, wire::CreatePull(fbb, request, meta->id, blocks_offset));
    c.Send(*c.links[shard], request, std::move(frame),
           [fanout, out, bs, size](const wire::Message* m, const Status& e) {
             if (m == nullptr) return fanout->Finish(e);
             const wire::PullReply* reply = m->body_as_PullReply();
             if (reply == nullptr || reply->blocks() == nullptr) {
               return fanout->Finish(
                   ProtocolError("pull answered without blocks"));
             }
             for (const wire::Block* block : *reply->blocks()) {
               uint64_t first = uint64_t{block->index()} * bs;
               uint64_t n = block->values() ? block->values()->size() : 0;
               if (first >= size || n != std::min<uint64_t>(bs, size - first)) {
                 return fanout->Finish(ProtocolError(
                     "pull reply block " + std::to_string(block->index()) +
                     " does not fit the tensor"));
               }
               std::memcpy(out.data() + first, block->values()->data(),
                           n * sizeof(float));
             }
             fanout->Finish(Status::Ok());
           });
  }
}

Status Client::Pull(const std::string& name, std::span<float> out) {
  return Wait([&](Callback cb) { PullAsync(name, out, std::move(cb)); });
}

Status Client::PullWhenReady(const std::string& name, std::span<float> out,
                             int timeout_ms) {
  const auto start = std::chrono::steady_clock::now();
  bool told = false;
  while (true) {
    Status s = Pull(name, out);
    if (s.code() != Code::kNotReady) return s;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();
    if (waited >= timeout_ms) return s;
    if (!told && waited >= 5000) {
      TETHER_LOG(kInfo) << "waiting for the initial values of '" << name
                        << "' from the worker that provides them: "
                        << s.message();
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void Client::PushAsync(const std::string& name, std::span<const float> grad,
                       Callback done) {
  PushDense(name, grad, /*provide=*/false, std::move(done));
}

void Client::ProvideTensorAsync(const std::string& name,
                                std::span<const float> values, Callback done) {
  PushDense(name, values, /*provide=*/true, std::move(done));
}

Status Client::ProvideTensor(const std::string& name,
                             std::span<const float> values) {
  return Wait(
      [&](Callback cb) { ProvideTensorAsync(name, values, std::move(cb)); });
}

void Client::PushDense(const std::string& name, std::span<const float> grad,
                       bool provide, Callback done) {
  Impl& c = *impl_;
  auto meta = c.Lookup(name, false);
  if (!meta.ok()) return done(meta.status());
  if (grad.size() != meta->size) {
    return done(InvalidArgument(
        std::string(provide ? "values provided for '" : "push to '") + name +
        "': " + (provide ? "they hold " : "gradient holds ") +
        std::to_string(grad.size()) + " floats, the tensor " +
        std::to_string(meta->size)));
  }
  const uint32_t bs = c.welcome.block_size;
  auto parts = CutBlocks(c.options.slicer, meta->id, meta->size, bs,
                         c.welcome.num_shards, c.options.chunk_bytes);
  if (!parts.ok()) return done(parts.status());
  int64_t read_clock = c.options.observer ? -1 : c.read_clock.load();
  auto fanout = std::make_shared<Fanout>(parts->size(), std::move(done));
  for (auto& [shard, blocks] : *parts) {
    uint64_t request = c.NextId();
    auto fbb = MakeBuilder(256 + blocks.size() * (bs * 4 + 32));
    // The gradient is sent from the caller's buffer, which stays valid
    // until `done` runs (after every part is acknowledged).
    FrameSplicer splicer(fbb);
    std::vector<flatbuffers::Offset<wire::Block>> out;
    out.reserve(blocks.size());
    for (uint32_t b : blocks) {
      uint64_t first = uint64_t{b} * bs;
      uint64_t n = std::min<uint64_t>(bs, meta->size - first);
      auto values = splicer.AddFloats(grad.subspan(first, n));
      out.push_back(wire::CreateBlock(fbb, b, values));
    }
    auto blocks_offset = fbb.CreateVector(out);
    wire::PushBuilder pb(fbb);
    pb.add_request_id(request);
    pb.add_tensor(meta->id);
    pb.add_read_clock(read_clock);
    pb.add_blocks(blocks_offset);
    pb.add_provide(provide);
    OutFrame frame = splicer.Finish(pb.Finish());
    c.Send(*c.links[shard], request, std::move(frame),
           [this, fanout](const wire::Message* m, const Status& e) {
             if (m == nullptr) return fanout->Finish(e);
             if (const wire::PushAck* ack = m->body_as_PushAck()) {
               int64_t s = ack->staleness();
               int64_t seen = max_push_staleness_.load();
               while (s > seen &&
                      !max_push_staleness_.compare_exchange_weak(seen, s)) {
               }
               return fanout->Finish(Status::Ok());
             }
             fanout->Finish(ProtocolError(
                 "push answered with " +
                 std::string(wire::EnumNameBody(m->body_type()))));
           });
  }
}

Status Client::Push(const std::string& name, std::span<const float> grad) {
  return Wait([&](Callback cb) { PushAsync(name, grad, std::move(cb)); });
}

void Client::PullRowsAsync(const std::string& table,
                           std::span<const uint64_t> keys, std::span<float> out,
                           Callback done) {
  Impl& c = *impl_;
  auto meta = c.Lookup(table, true);
  if (!meta.ok()) return done(meta.status());
  const uint64_t dim = meta->size;
  if (out.size() != keys.size() * dim) {
    return done(InvalidArgument("pull of rows of '" + table +
                                "': buffer holds " +
                                std::to_string(out.size()) + " floats, need " +
                                std::to_string(keys.size() * dim)));
  }
  if (keys.empty()) return done(Status::Ok());
  auto parts =
      CutKeys(c.options.slicer, meta->id, keys, static_cast<uint32_t>(dim),
              c.welcome.num_shards, c.options.chunk_bytes);
  if (!parts.ok()) return done(parts.status());
  c.read_clock = c.clock.load();
  auto fanout = std::make_shared<Fanout>(parts->size(), std::move(done));
  for (KeyPart& part : *parts) {
    uint64_t request = c.NextId();
    flatbuffers::FlatBufferBuilder fbb(64 + part.keys.size() * 8);
    auto keys_offset = fbb.CreateVector(part.keys);
    wire::PullBuilder pb(fbb);
    pb.add_request_id(request);
    pb.add_tensor(meta->id);
    pb.add_keys(keys_offset);
    pb.add_sparse(true);
    OutFrame frame = FinishFrame(fbb, pb.Finish());
    c.Send(*c.links[part.shard], request, std::move(frame),
           [fanout, out, dim, positions = std::move(part.positions)](
               const wire::Message* m, const Status& e) {
             if (m == nullptr) return fanout->Finish(e);
             const wire::PullReply* reply = m->body_as_PullReply();
             if (reply == nullptr || reply->rows() == nullptr ||
                 reply->rows()->size() != positions.size() * dim) {
               return fanout->Finish(
                   ProtocolError("row pull answered with the wrong rows"));
             }
             const float* rows = reply->rows()->data();
             for (size_t i = 0; i < positions.size(); ++i) {
               std::memcpy(out.data() + positions[i] * dim, rows + i * dim,
                           dim * sizeof(float));
             }
             fanout->Finish(Status::Ok());
           });
  }
}

Status Client::PullRows(const std::string& table,
                        std::span<const uint64_t> keys, std::span<float> out) {
  return Wait(
      [&](Callback cb) { PullRowsAsync(table, keys, out, std::move(cb)); });
}

void Client::PushRowsAsync(const std::string& table,
                           std::span<const uint64_t> keys,
                           std::span<const float> grads, Callback done) {
  PushSparse(table, keys, grads, /*provide=*/false, std::move(done));
}

void Client::ProvideRowsAsync(const std::string& table,
                              std::span<const uint64_t> keys,
                              std::span<const float> values, Callback done) {
  PushSparse(table, keys, values, /*provide=*/true, std::move(done));
}

Status Client::ProvideRows(const std::string& table,
                           std::span<const uint64_t> keys,
                           std::span<const float> values) {
  return Wait([&](Callback cb) {
    ProvideRowsAsync(table, keys, values, std::move(cb));
  });
}

void Client::PushSparse(const std::string& table,
                        std::span<const uint64_t> keys,
                        std::span<const float> grads, bool provide,
                        Callback done) {
  Impl& c = *impl_;
  auto meta = c.Lookup(table, true);
  if (!meta.ok()) return done(meta.status());
  const uint64_t dim = meta->size;
  if (grads.size() != keys.size() * dim) {
    return done(
        InvalidArgument("push of rows to '" + table + "': gradient holds " +
                        std::to_string(grads.size()) + " floats, need " +
                        std::to_string(keys.size() * dim)));
  }
  if (keys.empty()) return done(Status::Ok());
  auto parts =
      CutKeys(c.options.slicer, meta->id, keys, static_cast<uint32_t>(dim),
              c.welcome.num_shards, c.options.chunk_bytes);
  if (!parts.ok()) return done(parts.status());
  int64_t read_clock = c.options.observer ? -1 : c.read_clock.load();
  auto fanout = std::make_shared<Fanout>(parts->size(), std::move(done));
  for (KeyPart& part : *parts) {
    uint64_t request = c.NextId();
    size_t n = part.keys.size() * dim;
    auto fbb = MakeBuilder(256 + part.keys.size() * 8 + n * 4);
    auto keys_offset = fbb.CreateVector(part.keys);
    float* rows = nullptr;
    auto rows_offset = fbb.CreateUninitializedVector(n, &rows);
    for (size_t i = 0; i < part.positions.size(); ++i) {
      std::memcpy(rows + i * dim, grads.data() + part.positions[i] * dim,
                  dim * sizeof(float));
    }
    wire::PushBuilder pb(fbb);
    pb.add_request_id(request);
    pb.add_tensor(meta->id);
    pb.add_read_clock(read_clock);
    pb.add_keys(keys_offset);
    pb.add_rows(rows_offset);
    pb.add_sparse(true);
    pb.add_provide(provide);
    OutFrame frame = FinishFrame(fbb, pb.Finish());
    c.Send(*c.links[part.shard], request, std::move(frame),
           [fanout](const wire::Message* m, const Status& e) {
             if (m == nullptr) return fanout->Finish(e);
             fanout->Finish(m->body_as_PushAck() != nullptr
                                ? Status::Ok()
                                : ProtocolError("row push not acknowledged"));
           });
  }
}

Status Client::PushRows(const std::string& table,
                        std::span<const uint64_t> keys,
                        std::span<const float> grads) {
  return Wait(
      [&](Callback cb) { PushRowsAsync(table, keys, grads, std::move(cb)); });
}

void Client::ClockAsync(Callback done) {
  Impl& c = *impl_;
  if (c.options.observer) {
    return done(ProtocolError("observers have no clock"));
  }
  int64_t clock = ++c.clock;
  auto fanout = std::make_shared<Fanout>(c.links.size(), std::move(done));
  for (auto& link : c.links) {
    uint64_t request = c.NextId();
    flatbuffers::FlatBufferBuilder fbb(64);
    OutFrame frame = FinishFrame(fbb, wire::CreateClock(fbb, request, clock));
    c.Send(*link, request, std::move(frame),
           [fanout, &c](const wire::Message* m, const Status& e) {
             if (m == nullptr) return fanout->Finish(e);
             const wire::ClockAck* ack = m->body_as_ClockAck();
             if (ack == nullptr) {
               return fanout->Finish(ProtocolError("clock not acknowledged"));
             }
             // A shard that moved this worker ahead (it rejoined, or backup
             // workers closed its clock) says where it is now.
             int64_t mine = c.clock.load();
             while (ack->clock() > mine &&
                    !c.clock.compare_exchange_weak(mine, ack->clock())) {
             }
             fanout->Finish(Status::Ok());
           });
  }
}

Status Client::Clock() {
  return Wait([&](Callback cb) { ClockAsync(std::move(cb)); });
}

void Client::ReportAsync(const Progress& p, Callback done) {
  Impl& c = *impl_;
  if (c.options.observer) {
    return done(ProtocolError("observers do not report progress"));
  }
  uint64_t request = c.NextId();
  flatbuffers::FlatBufferBuilder fbb(256);
  auto device = fbb.CreateString(p.device);
  auto host = fbb.CreateString(p.host);
  wire::WorkerReportBuilder b(fbb);
  b.add_request_id(request);
  b.add_clock(c.clock);
  b.add_epoch(p.epoch);
  b.add_samples(p.samples);
  b.add_loss(p.loss);
  b.add_samples_per_s(p.samples_per_s);
  b.add_test_accuracy(p.test_accuracy);
  b.add_test_loss(p.test_loss);
  b.add_device(device);
  b.add_host(host);
  b.add_wait_fraction(p.wait_fraction);
  b.add_done(p.done);
  c.Send(*c.links[0], request, FinishFrame(fbb, b.Finish()),
         [done = std::move(done)](const wire::Message* m, const Status& e) {
           if (m == nullptr) return done(e);
           done(m->body_as_Ack() != nullptr
                    ? Status::Ok()
                    : ProtocolError("report not acknowledged"));
         });
}

Status Client::Report(const Progress& progress) {
  return Wait([&](Callback cb) { ReportAsync(progress, std::move(cb)); });
}

Result<int64_t> Client::CheckpointNow() {
  Impl& c = *impl_;
  auto round = std::make_shared<std::atomic<int64_t>>(-1);
  Status s = Wait([&](Callback cb) {
    uint64_t request = c.NextId();
    flatbuffers::FlatBufferBuilder fbb(64);
    c.Send(
        *c.links[0], request,
        FinishFrame(fbb, wire::CreateCheckpointNow(fbb, request)),
        [round, cb = std::move(cb)](const wire::Message* m, const Status& e) {
          if (m == nullptr) return cb(e);
          const wire::CheckpointStarted* started =
              m->body_as_CheckpointStarted();
          if (started == nullptr) {
            return cb(ProtocolError("checkpoint request not answered"));
          }
          round->store(started->round());
          cb(Status::Ok());
        });
  });
  if (!s.ok()) return s;
  return round->load();
}

uint64_t Client::shard_losses() const { return impl_->losses.load(); }

bool Client::stop_requested() const { return impl_->stop_requested.load(); }

std::string Client::stop_reason() const {
  std::lock_guard lock(impl_->stop_mu);
  return impl_->stop_reason;
}

Status Client::AwaitShards(int timeout_ms) {
  Impl& c = *impl_;
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool said = false;
  while (true) {
    std::string down;
    for (auto& link : c.links) {
      std::lock_guard lock(link->mu);
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

Result<Client::DataChunk> Client::NextChunk(uint64_t rows, uint32_t chunk_rows,
                                            int epochs) {
  Impl& c = *impl_;
  auto chunk = std::make_shared<DataChunk>();
  Status s = Wait([&](Callback cb) {
    uint64_t request = c.NextId();
    flatbuffers::FlatBufferBuilder fbb(64);
    c.Send(
        *c.links[0], request,
        FinishFrame(fbb, wire::CreateDataRequest(fbb, request, rows, chunk_rows,
                                                 epochs)),
        [chunk, cb = std::move(cb)](const wire::Message* m, const Status& e) {
          if (m == nullptr) return cb(e);
          const wire::DataChunk* d = m->body_as_DataChunk();
          if (d == nullptr) return cb(ProtocolError("no chunk in answer"));
          *chunk = {d->epoch(), d->index(), d->first(), d->count(),
                    d->finished()};
          cb(Status::Ok());
        });
  });
  if (!s.ok()) return s;
  return *chunk;
}

Result<std::vector<ShardStats>> Client::Stats() {
  Impl& c = *impl_;
  auto stats = std::make_shared<std::vector<ShardStats>>(c.links.size());
  Status s = Wait([&](Callback cb) {
    auto fanout = std::make_shared<Fanout>(c.links.size(), std::move(cb));
    for (size_t i = 0; i < c.links.size(); ++i) {
      uint64_t request = c.NextId();
      flatbuffers::FlatBufferBuilder fbb(64);
      OutFrame frame = FinishFrame(fbb, wire::CreateStatsRequest(fbb, request));
      c.Send(*c.links[i], request, std::move(frame),
             [fanout, stats, i](const wire::Message* m, const Status& e) {
               if (m == nullptr) return fanout->Finish(e);
               const wire::Stats* r = m->body_as_Stats();
               if (r == nullptr) {
                 return fanout->Finish(ProtocolError("stats not answered"));
               }
               (*stats)[i] = ReadStats(*r);
               fanout->Finish(Status::Ok());
             });
    }
  });
  if (!s.ok()) return s;
  return std::move(*stats);
}

}  // namespace tether
