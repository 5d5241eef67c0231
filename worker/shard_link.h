// Internal to the client library (not installed with the SDK; never include
// it from worker/client.h): the client's connections to the shards.
//
// ShardLinks owns the client's I/O threads and one link per shard: its
// connection, the requests waiting for that shard's answers, the heartbeat
// loop (which also logs requests that wait long and drops a shard that has
// gone silent), the handshake (Hello, the Challenge when keyed, Welcome) and,
// for workers, reconnection: after a link is lost, a state machine on the
// link's strand waits (0.1 s doubling to 5 s), dials, says Hello with this
// worker's clock and defines every tensor again, until that succeeds or
// reconnect_timeout_ms has passed; requests to that shard fail fast
// meanwhile.
//
// Thread-safe once Connect() is done: Send, NextId, AwaitShards and the
// accessors may be called from any thread, callbacks included. Join and
// Welcomed are for Connect() only, on its thread.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "schema/auth.h"
#include "schema/connection.h"
#include "schema/frame.h"
#include "schema/io_pool.h"
#include "schema/mutex.h"
#include "schema/status.h"
#include "worker/client.h"

namespace tether::client_internal {

// Called with the reply, or with a null message and the error.
using ReplyHandler =
    std::function<void(const wire::Message* reply, const Status& error)>;

// What a shard's Welcome says.
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
  bool record = false;        // the run records its order (--record)
  std::vector<std::string> shard_addresses;
};

// A tensor or table as this client defined it.
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

// Request `request`: define dense tensor `name` of `shape` or, if
// `sparse`, table `name` of rows of `dim` floats.
OutFrame DefineFrame(uint64_t request, const std::string& name, bool sparse,
                     const std::vector<uint64_t>& shape, uint32_t dim,
                     Init init);

class ShardLinks {
 public:
  // Every tensor and table the client has defined so far, in any order:
  // what a restarted shard is given again. Called on a link's strand.
  using Definitions = std::function<Defined()>;

  // Starts options.io_threads I/O threads. `options` and `clock` (the
  // worker's clock, said in every Hello and raised to a rejoined shard's)
  // are the client's and must outlive this; `auth_key` is null when the
  // shards have no key, `tls` (a client context) when they speak plain TCP.
  ShardLinks(const ClientOptions& options,
             std::shared_ptr<const AuthKey> auth_key,
             std::shared_ptr<asio::ssl::context> tls,
             std::atomic<int64_t>& clock, Definitions definitions);
  // Closes every connection (requests still pending fail with
  // kUnavailable) and joins the I/O threads: once it returns, no callback
  // runs any more.
  ~ShardLinks();
  ShardLinks(const ShardLinks&) = delete;
  ShardLinks& operator=(const ShardLinks&) = delete;

  // Connects to shard `shard_id` (0, 1, ... in this order) at `address`,
  // retrying refused connects for connect_timeout_ms, says Hello as `rank`
  // (-1: the coordinator picks) and waits up to `timeout_ms` for the
  // Welcome. kUnavailable names the address that could not be reached,
  // kTimeout the Welcome that did not come; an Error from the shard comes
  // back with its message. Blocking; Connect() only.
  Result<WelcomeInfo> Join(int shard_id, const std::string& address, int rank,
                           int timeout_ms);
  // Connect() is done, as worker `rank` (-1: observer): heartbeats go every
  // `heartbeat_ms` (0: keep options.heartbeat_ms), a shard silent for
  // `silence_ms` is dropped and, for workers, lost links are dialled again.
  void Welcomed(int rank, int heartbeat_ms, int silence_ms);

  // The I/O threads, for a blocking call to run while it spins
  // (Completion::Wait).
  IoPool& io_pool() { return io_pool_; }

  // Links, one per shard, by shard id.
  int size() const { return static_cast<int>(links_.size()); }
  // A fresh request id (never 0, the Hello's).
  uint64_t NextId() { return next_id_++; }
  // Sends request `id` to shard `shard`; `handler` runs once, on an I/O
  // thread, with its answer (an Error frame as its Status), or with
  // kUnavailable: at once while the link is down or reconnecting, later if
  // its connection closes first.
  void Send(int shard, uint64_t id, OutFrame frame, ReplyHandler handler);

  // Client::AwaitShards: Ok once every lost shard is reconnected -- dialled,
  // greeted and its tensors defined again --; kUnavailable naming the shard
  // once one is given up, not being reconnected, or `timeout_ms` passes.
  Status AwaitShards(int timeout_ms);
  // How many times a shard connection was lost so far.
  uint64_t losses() const { return losses_.load(); }
  // Shard 0 said the run was stopped, or RequestStop was called; the
  // reason is empty until then.
  bool stop_requested() const { return stop_requested_.load(); }
  // Any thread: training should end after its current step, for `reason`
  // (the first one given stands).
  void RequestStop(const std::string& reason);
  std::string stop_reason() const;

 private:
  // One shard's connection, the requests waiting for its answers, and the
  // state of its heartbeat loop and reconnection (shard_link.cc).
  struct Link;
  using WelcomeHandler = std::function<void(Result<WelcomeInfo>)>;
  template <typename T>
  using Parser =
      std::function<Result<T>(const wire::Message* reply, const Status& error)>;

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

  // The reconnection state machine (workers), on the link's strand.
  void StartReconnect(const std::shared_ptr<Link>& link);
  void AwaitBackoff(const std::shared_ptr<Link>& link);
  void Dial(const std::shared_ptr<Link>& link);
  void OnResolved(const std::shared_ptr<Link>& link, const HostPort& hp,
                  const boost::system::error_code& ec,
                  const tcp::resolver::results_type& endpoints);
  void OnDialed(const std::shared_ptr<Link>& link, const HostPort& hp,
                const boost::system::error_code& ec);
  // A dialled connection, its TLS handshake done when the run has TLS.
  void OnConnected(const std::shared_ptr<Link>& link, Stream stream);
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

  // Constant after construction.
  const ClientOptions& options_;
  const std::shared_ptr<const AuthKey> auth_key_;  // null: no authentication
  const std::shared_ptr<asio::ssl::context> tls_;  // null: plain TCP
  std::atomic<int64_t>& clock_;                    // the client's
  const Definitions definitions_;

  // Each link's connection runs on one of the pool's contexts (a thread of
  // its own per shard, up to options.io_threads). Assisted: a blocking
  // call runs them while it spins, and handlers may run on its thread.
  IoPool io_pool_;
  std::vector<std::shared_ptr<Link>> links_;  // fixed once Connect() returns
  std::atomic<uint64_t> next_id_{1};
  // Set by Welcomed(), read on the links' strands.
  std::atomic<int> rank_{-1};
  std::atomic<int> silence_ms_{0};
  std::atomic<int> heartbeat_ms_{0};
  std::atomic<bool> welcomed_{false};  // Connect() has finished
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> losses_{0};  // shard connections lost
  std::atomic<bool> stop_requested_{false};
  mutable Mutex stop_mu_;
  std::string stop_reason_ TETHER_GUARDED_BY(stop_mu_);
};

}  // namespace tether::client_internal
