// A shard > 0's link to the coordinator (shard 0): registering (Hello, the
// key's challenge when the run has one, Welcome with the run settings), the
// coordinator's orders while registered, and, when the link is lost,
// registering again until shard 0 is back -- as the shard that kept
// serving the run, so that a restarted shard 0 takes the run back instead
// of loading a round here (Coordinator::RegisterShard).
//
// While the coordinator is away the shard keeps serving pulls and pushes;
// it says once that it waits, and once that it is back.
//
// Thread-safe. Orders and refusals are handed to the callbacks on the
// link's I/O thread.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "schema/auth.h"
#include "schema/connection.h"
#include "schema/mutex.h"
#include "schema/tls.h"
#include "server/run_settings.h"

namespace tether {

class CoordinatorLink {
 public:
  struct Options {
    std::string coordinator;  // HOST:PORT (--coordinator)
    int shard_id = 1;
    std::string address;   // where workers reach this shard
    std::string command;   // this shard's command line, for the dashboard
    std::string manifest;  // its part of the run manifest (ShardManifest)
    int connect_timeout_ms = 10000;
    ConnectionOptions connection;
    std::shared_ptr<const AuthKey> auth_key;  // null: the run has none
    TlsOptions tls;
  };
  struct Callbacks {
    // A message from the coordinator after its Welcome (LoadRound,
    // TakeRound, RoundComplete, Error, ...).
    std::function<void(const wire::Message&)> on_order;
    // Registering again was refused for good (another run, a wrong key):
    // the shard cannot serve on.
    std::function<void(const Status&)> on_refused;
  };

  CoordinatorLink(boost::asio::io_context& io, Options options,
                  Callbacks callbacks);
  // Close()s and joins the thread registering again.
  ~CoordinatorLink();
  CoordinatorLink(const CoordinatorLink&) = delete;
  CoordinatorLink& operator=(const CoordinatorLink&) = delete;

  // Registers for the first time, waiting up to --connect-timeout-ms for
  // the coordinator: the run's settings, or why not (kUnavailable or
  // kTimeout when unreached; the coordinator's Error, e.g. an id out of
  // range). Call once, before anything else.
  Result<RunSettings> Register();

  // Sends to the coordinator; dropped while the link is lost.
  void Send(OutFrame frame);
  // The link is down and being registered again.
  bool lost() const { return lost_; }
  // Closes the link for good (the shard stops): no more registering.
  void Close();

 private:
  // Dials, says Hello (serving `serving_run_id` when it is not empty) and
  // waits for the Welcome, each for up to `timeout_ms`; the new connection
  // is the link from then on.
  Result<RunSettings> Connect(const std::string& serving_run_id,
                              int timeout_ms);
  // The current connection closed, after its Welcome.
  void OnLost(const Connection* conn);
  // The thread registering again, with backoff, until it is back, refused
  // or closed.
  void Rejoin();

  boost::asio::io_context& io_;
  const Options options_;
  const Callbacks callbacks_;
  const std::string peer_;  // "coordinator HOST:PORT"

  Mutex mu_;
  std::shared_ptr<Connection> conn_ TETHER_GUARDED_BY(mu_);
  std::string run_id_ TETHER_GUARDED_BY(mu_);  // from the first Welcome
  std::thread rejoin_ TETHER_GUARDED_BY(mu_);
  bool rejoining_ TETHER_GUARDED_BY(mu_) = false;
  std::atomic<bool> lost_{false};
  std::atomic<bool> closed_{false};
};

}  // namespace tether
