// The live dashboard on shard 0: the page (web/, embedded at build time),
// JSON under /api/, /metrics, and a WebSocket (/ws) with a snapshot on
// connect and an update every interval. web/API.md documents what each
// path answers.
//
// Every interval it takes shard 0's figures, lets the Monitor derive the
// workers' states and history, and publishes the update. Other shards'
// figures reach it through OnShardStats, checkpoint reports through the
// Monitor. Thread-safe.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <optional>
#include <string>

#include "server/coordinator.h"
#include "server/http.h"
#include "server/monitor.h"
#include "server/shard.h"

namespace tether {

class Dashboard : public std::enable_shared_from_this<Dashboard> {
 public:
  // `shard` and `coordinator` (shard 0's) must outlive the dashboard. Its
  // timer and HTTP handlers hold it by weak pointer: one that runs after
  // the last owner let go does nothing.
  static std::shared_ptr<Dashboard> Create(boost::asio::io_context& io,
                                           DashboardOptions options,
                                           Shard* shard,
                                           Coordinator* coordinator);
  ~Dashboard();

  // Binds --http and starts the updates; kUnavailable naming the address.
  // kInvalidArgument when that address is not a loopback one and there is
  // neither --http-token-file nor --insecure.
  Status Start();
  // "http://HOST:PORT/", or "https://HOST:PORT/" with TLS
  std::string url() const;
  Monitor& monitor() { return monitor_; }
  void Stop();

  // The answer to one plain HTTP request (public for tests).
  HttpResponse Handle(const HttpRequest& request);

 private:
  Dashboard(boost::asio::io_context& io, DashboardOptions options, Shard* shard,
            Coordinator* coordinator);
  void ScheduleTick();
  void Tick();
  HttpResponse CheckpointNow();
  HttpResponse StopRun();
  // Why a POST is refused (foreign origin, no or wrong token), if it is;
  // each refusal is logged with the client's address.
  std::optional<HttpResponse> Refuse(const HttpRequest& request);
  // Logs what serving a non-loopback address exposes.
  void LogExposure() const;

  const DashboardOptions options_;
  Shard* const shard_;
  Coordinator* const coordinator_;
  Monitor monitor_;
  std::string token_;                 // for POST endpoints; empty: they are off
  std::unique_ptr<HttpServer> http_;  // made by Create
  boost::asio::steady_timer timer_;
  std::atomic<bool> stopped_{false};
};

}  // namespace tether
