// A tether-server process: one shard, its I/O threads, its listener and, on
// shard 0, the coordinator.
//
// Start() binds the listen address first (so a port in use fails at once),
// then on shards > 0 registers with the coordinator to learn the run
// settings, then accepts. Run() serves until Stop(), SIGINT or SIGTERM.
// Stop() is thread-safe; the rest are for the owning thread.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <memory>
#include <string>
#include <vector>

#include "schema/auth.h"
#include "schema/connection.h"
#include "schema/io_pool.h"
#include "schema/mutex.h"
#include "server/checkpoint.h"
#include "server/checkpointer.h"
#include "server/coordinator.h"
#include "server/coordinator_link.h"
#include "server/dashboard.h"
#include "server/options.h"
#include "server/session.h"
#include "server/shard.h"

namespace tether {

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();

  // kUnavailable naming the address when the port cannot be bound or the
  // coordinator cannot be reached; kProtocol when the coordinator refuses.
  Status Start();

  // HOST:PORT workers dial, with the real port when --listen used port 0.
  const std::string& address() const { return address_; }

  // Blocks until the server stops; returns after every thread has joined.
  // OK after Stop(), SIGINT or SIGTERM; the reason when the server stopped
  // itself because the run cannot go on (it could not resume, or a shard
  // > 0 was refused by its coordinator).
  Status Run();
  void Stop();

 private:
  Status Bind();
  Status RegisterWithCoordinator();
  // Opens the data dir, loads the round to resume, starts the writer.
  Status SetUpCheckpoints();
  // Opens the recording (--record) and starts the replay (--replay), from
  // the round the shard loaded when it resumed.
  Status SetUpRecording();
  // Shard 0: keeps the run manifest in DATA_DIR/manifest.json and on the
  // dashboard (with every process's command) as processes join
  // (server/manifest.h).
  void PublishManifest();
  // Opens --data-dir once; kCreate makes a store in a missing or empty
  // directory. Starts the checkpoint writer.
  Status OpenStore(CheckpointStore::OpenMode mode);
  // Shard 0: the complete round --resume names that shard 0 can load (with
  // latest, the newest such), read and checked; sets settings->run_id and
  // resume_round from its record and fills `complete` with the complete
  // rounds up to it, and `data_progress` with the round's record of where
  // each epoch's data stood (empty in rounds written before it was kept).
  Result<ShardSnapshot> PickResumeRound(RunSettings* settings,
                                        std::vector<int64_t>* complete,
                                        std::string* data_progress);
  // Shard 0: the complete rounds recorded in --data-dir; when it holds no
  // store there and --reshard-from is given, those recorded in the first of
  // those dirs that holds some (shard 0's of the old run).
  Result<std::vector<RoundRecord>> ResumableRounds();
  // Reads `round` from --data-dir and checks that it is this shard's slice
  // of the run `run` describes (IdentityMismatch). When the round was
  // written by another number of shards than run.num_shards (its record's
  // `written_by`, else this shard's own slice's count; 0: unknown), or
  // this shard holds none of it: this shard's part of it, merged from every
  // --reshard-from dir (server/round_merge.h; its settings keep the
  // writers' shard count), and *resharded set. kInvalidArgument naming
  // --reshard-from when that is needed and not given.
  Result<ShardSnapshot> ReadRound(int64_t round, const RunSettings& run,
                                  int written_by = 0,
                                  bool* resharded = nullptr);
  // What the log says of a round ReadRound read: resharded, or
  // --reshard-from ignored since the counts agree; "" otherwise.
  std::string ReshardNote(const ShardSnapshot& snapshot, const RunSettings& run,
                          bool resharded) const;
  // ReadRound, then loads it into the shard.
  Status LoadRound(int64_t round);
  void StartCheckpointer();  // once the store and the shard are there
  // Rounds this shard can load (read and checked), ascending.
  std::vector<int64_t> IntactRounds();
  // Shards > 0: loads `round` and tells the coordinator how it went.
  Status LoadAndReport(int64_t round);
  // Shards > 0: what the coordinator says once registered.
  void OnCoordinatorOrder(const wire::Message& m);
  // Stops the server; Run() returns `why`.
  void Fail(const Status& why);
  void OnRoundWritten(int64_t round, const Result<uint64_t>& written,
                      double seconds);
  void RecordRound(int64_t round, uint64_t bytes);  // shard 0
  void PruneRounds(int64_t newest_complete);
  Status StartDashboard();  // shard 0, unless --http off
  void SendStats();         // shards > 0: figures to the coordinator
  void CheckSilence();      // evicts silent workers, every timeout / 4
  // Closes the acceptor, timers, dashboard and sessions, on the I/O
  // threads; idempotent.
  void CloseAll();
  // Start() is done: a Stop() that came meanwhile closes everything now.
  void MarkStarted();
  void DoAccept();
  void OnAccept(const boost::system::error_code& ec, tcp::socket socket);
  // A connection accepted (its TLS handshake done, with TLS): a session,
  // or refused when --max-connections are open.
  void Admit(Stream stream);
  // --health: a port answering /healthz and /readyz.
  Status StartHealth();
  // Whether this shard serves the run, for /readyz.
  Status Readiness() const;

  const ServerOptions options_;
  // The Server owns the contexts its handlers run on, and ~Server joins the
  // threads running them before any member goes: a handler holding `this`
  // never outlives the Server (unrun handlers are destroyed, not run).
  // Accepted connections spread over the pool's contexts; the rest runs on
  // its main one, io_.
  IoPool io_pool_;
  asio::io_context& io_;
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  std::string address_;
  std::string listening_;  // where it is bound: --listen, its port picked
  std::shared_ptr<const AuthKey> auth_key_;  // null without --auth-key-file
  ConnectionOptions connection_options_;     // the coordinator link
  ConnectionOptions session_options_;        // accepted: with the timeouts

  std::unique_ptr<CheckpointStore> store_;  // with --data-dir
  // With --record (run-wide): this shard's recording; outlives shard_.
  std::unique_ptr<Recorder> recorder_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<Coordinator> coordinator_;           // shard 0 only
  std::unique_ptr<CoordinatorLink> coordinator_link_;  // shards > 0
  std::shared_ptr<Dashboard> dashboard_;               // shard 0 with --http
  std::unique_ptr<HttpServer> health_;                 // with --health
  // The TLS context connections are accepted with, made by Start(); null
  // without --tls-cert.
  std::shared_ptr<asio::ssl::context> tls_server_;
  std::unique_ptr<asio::steady_timer> stats_timer_;  // shards > 0
  std::unique_ptr<asio::steady_timer> eviction_timer_;

  Mutex sessions_mu_;
  std::vector<std::weak_ptr<Session>> sessions_ TETHER_GUARDED_BY(sessions_mu_);
  std::atomic<bool> stopping_{false};
  // Start() has set up everything CloseAll() touches (or failed).
  std::atomic<bool> started_{false};
  // What Run() returns.
  Status failure_ TETHER_GUARDED_BY(sessions_mu_);
  // OpenStore and StartCheckpointer run on the main thread in Start() and
  // on an I/O thread when the coordinator orders a round loaded, which may
  // come before Start() is done: they take turns.
  Mutex setup_mu_;
  // Last, so it stops (finishing a write) before what it reports to.
  std::unique_ptr<Checkpointer> checkpointer_;
};

}  // namespace tether
