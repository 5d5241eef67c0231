// A tether-server process: one shard, its I/O threads, its listener and, on
// shard 0, the coordinator.
//
// Start() binds the listen address first (so a port in use fails at once),
// then on shards > 0 registers with the coordinator to learn the run
// settings, then accepts. Run() serves until Stop(), SIGINT or SIGTERM.
// Stop() is thread-safe; the rest are for the owning thread.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "schema/auth.h"
#include "schema/connection.h"
#include "server/checkpoint.h"
#include "server/checkpointer.h"
#include "server/coordinator.h"
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
  void Run();
  void Stop();

 private:
  Status Bind();
  Status RegisterWithCoordinator();
  // Opens the data dir, loads the round to resume, starts the writer.
  Status SetUpCheckpoints();
  Status OpenStore();  // creates --data-dir as needed
  Result<int64_t> PickResumeRound();
  void OnRoundWritten(int64_t round, const Result<uint64_t>& written,
                      double seconds);
  void RecordRound(int64_t round, uint64_t bytes);  // shard 0
  void PruneRounds(int64_t newest_complete);
  Status StartDashboard();  // shard 0, unless --http off
  void SendStats();         // shards > 0: figures to the coordinator
  void CheckSilence();      // evicts silent workers, every timeout / 4
  void DoAccept();
  void OnAccept(const boost::system::error_code& ec, tcp::socket socket);

  const ServerOptions options_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  std::vector<std::thread> threads_;
  std::string address_;
  std::shared_ptr<const AuthKey> auth_key_;  // null without --auth-key-file
  ConnectionOptions connection_options_;     // the coordinator link
  ConnectionOptions session_options_;        // accepted: with the timeouts

  std::unique_ptr<CheckpointStore> store_;  // with --data-dir
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<Coordinator> coordinator_;         // shard 0 only
  std::shared_ptr<Connection> coordinator_link_;     // shards > 0
  std::unique_ptr<Dashboard> dashboard_;             // shard 0 with --http
  std::unique_ptr<asio::steady_timer> stats_timer_;  // shards > 0
  std::unique_ptr<asio::steady_timer> eviction_timer_;

  std::mutex sessions_mu_;
  std::vector<std::weak_ptr<Session>> sessions_;  // guarded by sessions_mu_
  std::atomic<bool> stopping_{false};
  // Last, so it stops (finishing a write) before what it reports to.
  std::unique_ptr<Checkpointer> checkpointer_;
};

}  // namespace tether
